"""DeepSeekMath Fig 5 and Table 10: the methods of the unified paradigm from one SFT policy."""

import dataclasses

from experiments.studies import common
from experiments.studies.spec import GRPO_MATH, Claim, Contrast, Design, Metric, Panel, Plot, Run, Study, Tune

RL_RUNS = ("rft", "online_rft", "grpo", "grpo_ps", "grpo_ps_centered", "ppo", "dpo", "dpo_nll")
# The offline methods sample as many prompts as the online ones draw over the run (200 steps x 32), so RFT against
# Online RFT differs in whose samples they are, not in how many problems: at the default 2,048 the full RFT run
# cycled its ~3,000 distinct correct samples 17 times, and DPO its 928 pairs 28 times (seed 0: held-out accuracy
# 38.8% -> 24.6%). DPO also takes up to 4 (right, wrong) pairs per prompt: about 2-3 passes over its pairs.
OFFLINE_PROMPTS = 200 * 32
FIG5 = ("rft", "online_rft", "grpo", "grpo_ps")
OLD = ("quick", "full")  # the profiles run and decided before issue 56's designs

# THE FAIR PROFILE (issue 56): Fig 5 with equal comparisons, its statistics declared here before its runs.
# Every method starts from the seed's SFT policy, samples 32 prompts x 8 at T = 0.7 per step for 200 steps and trains
# the T = 0.7 likelihood (--likelihood_temperature, so the imitation methods train what GRPO trains); each method's
# learning rate is chosen from FAIR_LRS on a validation split of 500 training problems (--num_validation, the RL
# pool's tail, on seeds 0 and 1; the test set chooses nothing); Table 10's RFT (rft_table10: each step samples the
# frozen SFT policy, GC = 1 if correct, mean over all rows) is the RFT of the claims, the pooled RFT (deduplicated
# correct samples of 6,400 prompts) is reported beside it, and SFT continued on the RL pool's human solutions
# (256 a step) is the control for "more supervised data".
FAIR_LRS = (1e-4, 3e-4, 1e-3)
FAIR_TUNE = Tune(FAIR_LRS, flag="learning_rate", seeds=2)
FAIR_FLAGS = {"num_validation": 500, "likelihood_temperature": 0.7}
FAIR_RUNS = ("fair_sft", "fair_rft_pooled", "fair_rft", "fair_online_rft", "fair_grpo", "fair_grpo_ps")
FAIR_FIG5 = ("fair_rft", "fair_online_rft", "fair_grpo", "fair_grpo_ps")


def _fair(name: str, label: str, **flags) -> Run:
  return Run(name, {"init_checkpoint": "{run:sft}/sft_policy", **flags}, label=label, only_in=("fair",),
             tune=FAIR_TUNE)


FAIR = (
    _fair("fair_sft", "SFT continued (human solutions)", algo="sft"),
    _fair("fair_rft_pooled", "Pooled RFT (dedup, 6,400 prompts)", algo="rft", offline_prompts=OFFLINE_PROMPTS),
    _fair("fair_rft", "RFT (Table 10: frozen SFT samples each step)", algo="rft_table10"),
    _fair("fair_online_rft", "Online RFT", algo="online_rft"),
    _fair("fair_grpo", "GRPO+OS (rule reward)"),
    _fair("fair_grpo_ps", "GRPO+PS (exact step labels)", reward="exact_steps", supervision="process"),
)
FAIR_MARGIN = 0.03  # ±3 points: no ordering larger than that either way (the paper's Fig 5 gaps are a few points)


def _fig5_claims(profile: str) -> tuple[Claim, ...]:
  """Fig 5's four orderings among a profile's arms, each with the ±3-point margin, and GRPO+OS's gain."""
  grpo_ps, grpo, online_rft, rft = (f"{profile}_{a}" for a in ("grpo_ps", "grpo", "online_rft", "rft"))
  return (Claim("Fig 5: GRPO+PS > GRPO+OS", f"{grpo_ps} - {grpo}", "final", margin=FAIR_MARGIN),
          Claim("Fig 5: GRPO+OS > Online RFT", f"{grpo} - {online_rft}", "final", margin=FAIR_MARGIN),
          Claim("Fig 5: Online RFT > RFT (Table 10's)", f"{online_rft} - {rft}", "final", margin=FAIR_MARGIN),
          Claim("Fig 5: GRPO+OS > RFT (Table 10's)", f"{grpo} - {rft}", "final", margin=FAIR_MARGIN),
          Claim(f"GRPO+OS raises accuracy over its SFT start ({profile})", grpo, "gain"))


FAIR_DESIGN = Design(
    claims=(*_fig5_claims("fair"),
            Claim("RFT (Table 10's) beside SFT continued on human solutions", "fair_rft - fair_sft", "final", ""),
            Claim("Pooled RFT beside RFT (Table 10's)", "fair_rft_pooled - fair_rft", "final", ""),
            Claim("GRPO+OS beside SFT continued on human solutions", "fair_grpo - fair_sft", "final", "")),
    seeds=8,
    note=("Four orderings of Fig 5 with a ±3-point margin and GRPO's gain over its start: nine hypotheses (two per "
          "ordering: against zero and inside the margin), Holm at 0.05; three contrasts reported without a "
          "claim. Seeds 0 and 1 also choose each method's learning rate on the validation split."))
# THE PATHS PROFILE (issue 56, goals 2 and 3), declared here before its runs. The fair profile found Fig 5's
# orderings equal within ±3 points on the chain task, which has one solution path per problem (offline data cannot
# go stale) and 2-3 steps (step labels have little to say). On the paths task both mechanisms act
# (`scripts/paths_mechanisms.py`, docs/train.md "The paths task": after 20 GRPO steps the frozen SFT policy's
# correct samples have lost likelihood under the RL policy, and within wrong solutions most steps before the first
# wrong one are right), so this profile asks Fig 5's question there. Every seed starts from one SFT start (a shared
# run, `common.paths_start`); every method samples 16 prompts x 8 at T = 0.7 for 60 steps and trains the T = 0.7
# likelihood, at a learning rate chosen from PATHS_LRS on 200 held-out training problems (seeds 0-1). RFT is Table
# 10's (the frozen start's samples each step), SFT continued on the RL pool's human solutions is the control, and
# GRPO+PS reads the exact step labels of the paths task's states (8 steps and the answer: --prm_max_steps=9). The
# pooled RFT of the fair profile is left out (it was reported there, not claimed), to fit two sessions.
PATHS_LRS = (1e-4, 3e-4)
PATHS_TUNE = Tune(PATHS_LRS, flag="learning_rate", seeds=2)
PATHS_RL = {**common.PATHS_TASK, "init_checkpoint": "{run:paths_start}/sft_policy", "steps": 60, "batch_size": 16,
            "num_validation": 200, "likelihood_temperature": 0.7, "eval_every": 20, "save_every": 20,
            "tensorboard": False}
PATHS_RUNS = ("paths_sft", "paths_rft", "paths_online_rft", "paths_grpo", "paths_grpo_ps")


def _paths(name: str, label: str, **flags) -> Run:
  return Run(name, {**PATHS_RL, **flags}, label=label, only_in=("paths",), tune=PATHS_TUNE)


PATHS = (
    common.paths_start("paths_start", "paths"),
    _paths("paths_sft", "SFT continued (human solutions)", algo="sft"),
    _paths("paths_rft", "RFT (Table 10: frozen start's samples each step)", algo="rft_table10"),
    _paths("paths_online_rft", "Online RFT", algo="online_rft"),
    _paths("paths_grpo", "GRPO+OS (rule reward)"),
    _paths("paths_grpo_ps", "GRPO+PS (exact step labels)", reward="exact_steps", supervision="process",
           prm_max_steps=9),
)
PATHS_DESIGN = Design(
    claims=(*_fig5_claims("paths"),
            Claim("RFT (Table 10's) beside SFT continued on human solutions", "paths_rft - paths_sft", "final", ""),
            Claim("GRPO+OS beside SFT continued on human solutions", "paths_grpo - paths_sft", "final", "")),
    seeds=8,
    note=("The fair profile's four Fig 5 orderings with a ±3-point margin and GRPO's gain, on the paths task: nine "
          "hypotheses, Holm at 0.05; two contrasts reported without a claim. One SFT start for every seed: the "
          "verdicts hold for that start. Seeds 0 and 1 also choose each method's learning rate on the validation "
          "split."))
PATHS_NOTE = (
    "Fig 5 on the paths task (issue 56): one SFT start for every seed (18,000 solutions, 4,000 steps; a shared "
    "run), every method 60 steps of 16 prompts x 8 samples at T = 0.7, training the T = 0.7 likelihood, its "
    "learning rate chosen from 1e-4, 3e-4 on 200 held-out training problems (seeds 0-1); RFT is Table 10's, SFT "
    "continued on human solutions is reported beside it; GRPO+PS on the exact step labels. Time, from probes "
    "beside another study: the start 35-50 min once, a method's run about 5 min (3-5 s a step at 16 prompts x 8 "
    "and three evaluations of 500 problems): 50 runs, about 5 hours alone, about twice that beside another study.")
PROMPTS = Metric("prompts", "train/prompts_per_step", source="curve", reduce="mean", percent=False,
                 label="prompts per step", runs=FAIR_RUNS + PATHS_RUNS)
POSITIVE = Metric("positive", "train/positive_rows", source="curve", reduce="mean", percent=False,
                  label="rows with a positive coefficient per step", runs=FAIR_RUNS + PATHS_RUNS)
VALIDATION = Metric("validation", "final_val_accuracy", label="validation accuracy (held-out training problems)",
                    runs=FAIR_RUNS + PATHS_RUNS)

STUDY = Study(
    name="paradigm",
    title="DeepSeekMath Fig 5 / Table 10: the paradigm's methods from one SFT policy",
    description=(
        "Every method starts from the same stage-1 SFT policy of its seed (`--init_checkpoint`) with the same "
        "samples per step. GRPO+OS: the rule (correctness) reward; GRPO+PS: process supervision on the synthetic "
        "task's exact step labels (a perfect PRM); Online RFT; RFT (correct offline samples of the SFT policy); "
        "PPO with a critic (B·G prompts, G = 1); DPO on (right, wrong) pairs of SFT samples at lr 2e-5 (at the "
        "shared lr it over-fits its pairs, see the README), and the same DPO plus the chosen output's "
        "length-normalised NLL (α = 1, Iterative RPO, arXiv 2404.19733: a diagnostic of likelihood displacement). "
        "GRPO+PS is also run with its token advantages centred per group (`--process_center_tokens`: a diagnostic "
        "of the suffix sums' negative drift). RFT and DPO sample their offline data once from the SFT "
        "policy on 6,400 prompts, as many as the online methods draw in the full run (the quick profile: 512 and "
        "2,048). The paper (Fig 5, 1.3B model) reports "
        "GRPO+PS > GRPO+OS > Online RFT > RFT."),
    runs=(
        dataclasses.replace(common.SFT, only_in=OLD + ("fair",)),
        *(dataclasses.replace(r, only_in=OLD) for r in (
            common.rl("rft", "RFT", algo="rft", offline_prompts=OFFLINE_PROMPTS, quick={"offline_prompts": 512}),
            common.rl("online_rft", "Online RFT", algo="online_rft"),
            dataclasses.replace(common.GRPO, label="GRPO+OS (rule reward)"),
            common.rl("grpo_ps", "GRPO+PS (exact step labels)", reward="exact_steps", supervision="process"),
            # A diagnostic, not in the papers: the suffix sums of §4.1.3 do not average zero over tokens (after a
            # first wrong step every later one is wrong, so most tokens get a negative advantage); centring them per
            # group (`--process_center_tokens`) removes that drift and keeps the expected gradient.
            common.rl("grpo_ps_centered", "GRPO+PS, token advantages centred", reward="exact_steps",
                      supervision="process", process_center_tokens=True),
            common.rl("ppo", "PPO (critic, G = 1)", algo="ppo", batch_size=256, group_size=1,
                      quick={"batch_size": 8 * common.QUICK_RL["batch_size"]}),
            common.rl("dpo", "DPO (lr 2e-5)", algo="dpo", learning_rate=2e-5, offline_prompts=OFFLINE_PROMPTS,
                      dpo_pairs_per_prompt=4, quick={"offline_prompts": 2048, "dpo_pairs_per_prompt": 1}),
            # A diagnostic, not in the papers: does DPO lose accuracy through likelihood displacement? Iterative
            # RPO's NLL term on the chosen output (arXiv 2404.19733, α = 1) holds log π(o⁺) up.
            common.rl("dpo_nll", "DPO + NLL (α = 1)", algo="dpo", learning_rate=2e-5,
                      offline_prompts=OFFLINE_PROMPTS, dpo_pairs_per_prompt=4, dpo_nll_coef=1.0,
                      quick={"offline_prompts": 2048, "dpo_pairs_per_prompt": 1}),
        )),
        *FAIR,
        *PATHS,
    ),
    metrics=(
        dataclasses.replace(common.ACCURACY, runs=RL_RUNS + FAIR_RUNS + PATHS_RUNS),
        dataclasses.replace(common.CHANGE, runs=RL_RUNS + FAIR_RUNS + PATHS_RUNS),
        *(dataclasses.replace(m, runs=RL_RUNS + FAIR_RUNS + PATHS_RUNS)
          for m in (common.START, common.FINAL, common.GAIN)),
        Metric("paths_start", "final_accuracy", runs=("paths_start",),
               label="the shared SFT start's held-out accuracy"),
        VALIDATION, PROMPTS, POSITIVE,
    ),
    plots=(
        Plot("fig5.png", (Panel("accuracy", FIG5, title="held-out greedy accuracy"),
                          Panel("change", FIG5, title="change since the SFT start, paired by seed",
                                ylabel="points")),
             title="DeepSeekMath Fig 5: RFT, Online RFT, GRPO+OS, GRPO+PS from one SFT policy", xlabel="RL step"),
        Plot("table10.png", (Panel("change", RL_RUNS, title="change since the SFT start, paired by seed",
                                   ylabel="points"),),
             title="Table 10's methods, PPO and DPO included", xlabel="RL step"),
        Plot("gain.png", (Panel("gain", RL_RUNS, title="gain over the SFT policy", ylabel="points"),), x="run",
             title="Held-out accuracy gain of each method over its SFT start"),
        Plot("fig5_fair.png", (Panel("accuracy", FAIR_RUNS, title="held-out greedy accuracy"),
                               Panel("change", FAIR_RUNS, title="change since the SFT start, paired by seed",
                                     ylabel="points")),
             title="Fig 5, equal comparisons (profile fair): each method at its validation-chosen lr",
             xlabel="RL step"),
        Plot("fig5_paths.png", (Panel("accuracy", PATHS_RUNS, title="held-out greedy accuracy"),
                                Panel("change", PATHS_RUNS, title="change since the SFT start, paired by seed",
                                      ylabel="points")),
             title="Fig 5 on the paths task (profile paths): each method at its validation-chosen lr",
             xlabel="RL step"),
    ),
    contrasts=(Contrast("grpo_ps", "grpo", "final"), Contrast("grpo", "online_rft", "final"),
               Contrast("online_rft", "rft", "final"), Contrast("grpo", "rft", "final"),
               Contrast("ppo", "grpo", "final"), Contrast("dpo", "grpo", "final"),
               Contrast("dpo_nll", "dpo", "final"), Contrast("grpo_ps_centered", "grpo_ps", "final"),
               *(Contrast(*c.run.split(" - "), c.metric) for c in FAIR_DESIGN.claims + PATHS_DESIGN.claims
                 if " - " in c.run)),
    claims=(Claim("Fig 5: GRPO+PS > GRPO+OS", "grpo_ps - grpo", "final", margin=common.ORDERING_MARGIN),
            Claim("Fig 5: GRPO+OS > Online RFT", "grpo - online_rft", "final", margin=common.ORDERING_MARGIN),
            Claim("Fig 5: Online RFT > RFT", "online_rft - rft", "final", margin=common.ORDERING_MARGIN),
            Claim("Fig 5: GRPO+OS > RFT", "grpo - rft", "final", margin=common.ORDERING_MARGIN),
            Claim("GRPO+OS raises accuracy over its SFT start", "grpo", "gain"),
            Claim("Table 10: PPO beside GRPO+OS (no ordering claimed)", "ppo - grpo", "final", ""),
            Claim("Table 10: DPO beside GRPO+OS (no ordering claimed)", "dpo - grpo", "final", ""),
            Claim("DPO + NLL beside DPO (Iterative RPO's fix; not in DeepSeekMath)", "dpo_nll - dpo", "final", ""),
            Claim("GRPO+PS with centred token advantages beside GRPO+PS (not in DeepSeekMath)",
                  "grpo_ps_centered - grpo_ps", "final", "")),
    profiles={"quick": common.QUICK, "fair": {GRPO_MATH: FAIR_FLAGS}, "paths": {}},
    designs={"fair": FAIR_DESIGN, "paths": PATHS_DESIGN},
    notes={"paths": PATHS_NOTE,
           "fair": ("Fig 5 with equal comparisons (issue 56): every method 200 steps of 32 prompts x 8 samples at "
                    "T = 0.7 from the seed's SFT policy, training the T = 0.7 likelihood; its learning rate chosen "
                    "from 1e-4, 3e-4, 1e-3 on 500 held-out training problems (seeds 0-1); RFT is Table 10's, the "
                    "pooled RFT and SFT continued on human solutions are reported beside it."),
           "quick": common.QUICK_NOTE + " RFT samples 512 offline prompts x 8 (full: 2,048 x 8); PPO B·G prompts "
                                        "x 1 sample per step (full: 256 x 1)."},
)
