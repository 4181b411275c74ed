"""DeepSeekMath Fig 6: iterative RL with a learned reward model against one round of the same length."""

import dataclasses

from experiments.studies import common
from experiments.studies.spec import TRAIN_REWARD_MODEL, Claim, Contrast, Design, Metric, Panel, Plot, Run, Study

RL_RUNS = ("grpo", "one_round", "iterative")
OLD = ("quick", "full")  # the profiles run and decided before issue 56's design

# THE FAIR PROFILE (issue 56, goal 4): Fig 6 with a reward model whose training moves its ranking, declared here
# before its runs. The reward model is the verifier's backbone with rank-8 LoRA adapters (`--rm_lora_rank`: the
# likelihood it ranks with trains, from exactly the verifier), trained on the seed's SFT samples. Every RL arm is
# GRPO+OS from the seed's SFT policy for I = 3 iterations of 40 steps of 32 prompts x 8 (120 steps), and at each
# iteration's end measures the reward model on 64 fresh held-out prompts x 8 of the current policy
# (`--rm_update_eval_prompts`): the 2x2 of reference reset (`--reset_reference`) x reward-model retraining
# (`--rm_update_steps` 0 or 100 on 128 fresh prompts x 8, adapters trained) has Algorithm 1 in one corner and one
# round (no reset, no retraining: the same policy trajectory as a plain run, measured) in the other. The control
# "more labels" is one round on a reward model trained up front on as many labelled samples as the iterative one
# has seen before its last iteration (1,000 + 2 x 128 prompts x 8, 600 + 2 x 100 steps), so an iterative gain is
# not just more labels.
FAIR_ITERATIONS, FAIR_STEPS_PER_ITERATION = 3, 40
FAIR_RM = {"policy": "{run:sft}/sft_policy", "rm_init": "{run:verifier}/sft_policy", "rm_kind": "orm_steps",
           "rm_score": "loglik", "rm_lora_rank": 8, "rm_loss": "pairwise", "rm_samples_per_prompt": 8,
           "rm_eval_prompts": 100, "rm_learning_rate": 3e-4, "tensorboard": False}
FAIR_RM_PROMPTS, FAIR_RM_STEPS = 1000, 600
FAIR_UPDATE = {"rm_update_prompts": 128, "rm_update_steps": 100, "rm_update_lora_rank": 8,
               "rm_update_learning_rate": 3e-4}
FAIR_RL = {"init_checkpoint": "{run:sft}/sft_policy", "reward": "orm", "reward_model": "{run:fair_rm}/reward_model",
           "iterations": FAIR_ITERATIONS,
           "steps_per_iteration": FAIR_STEPS_PER_ITERATION, "rm_update_eval_prompts": 64, "eval_every": 40,
           "save_every": 40, "tensorboard": False}
FAIR_RUNS = ("fair_one_round", "fair_reset", "fair_retrain", "fair_iterative", "fair_more_labels")


def _arms(profile: str, rm: dict, rm_label: str, rl: dict, update: dict, iterations: int) -> tuple[Run, ...]:
  """A profile's reward model ("<profile>_rm"), the control reward model with as many labels as the iterative one
  has before its last iteration ("<profile>_rm_more"), and the five RL arms from them: the 2x2 of reference reset x
  retraining ("<profile>_one_round", "_reset", "_retrain", "_iterative") and one round on the control
  ("_more_labels")."""
  arm = lambda name, label, **flags: Run(f"{profile}_{name}", {**rl, **flags}, label=label, only_in=(profile,))
  frozen = {"rm_update_steps": 0}
  return (
      Run(f"{profile}_rm", {**rm}, module=TRAIN_REWARD_MODEL, label=rm_label, only_in=(profile,)),
      Run(f"{profile}_rm_more", {**rm, "rm_prompts": rm["rm_prompts"] + (iterations - 1) * update["rm_update_prompts"],
                                 "rm_steps": rm["rm_steps"] + (iterations - 1) * update["rm_update_steps"]},
          module=TRAIN_REWARD_MODEL, label="reward model, as many labels as the iterative one", only_in=(profile,)),
      arm("one_round", "one round (no reset, no retraining)", reset_reference=False, **frozen),
      arm("reset", "reference reset only", reset_reference=True, **frozen),
      arm("retrain", "reward model retrained only", reset_reference=False, **update),
      arm("iterative", "iterative (Algorithm 1: reset and retraining)", reset_reference=True, **update),
      arm("more_labels", "one round, reward model with as many labels", reset_reference=False,
          reward_model=f"{{run:{profile}_rm_more}}/reward_model", **frozen),
  )


def _contrasts(profile: str) -> tuple[tuple[str, str], ...]:
  return tuple((f"{profile}_{a}", f"{profile}_{b}") for a, b in (
      ("iterative", "one_round"), ("iterative", "more_labels"), ("iterative", "reset"), ("retrain", "one_round"),
      ("iterative", "retrain"), ("reset", "one_round")))


def _claims(profile: str, margin: float, auc_margin: float) -> tuple[Claim, ...]:
  """Fig 6's orderings, the two simple effects of retraining, staleness and catch-up, GRPO's gain; the reset's two
  simple effects reported."""
  it, one, reset, retrain, more = (f"{profile}_{a}" for a in ("iterative", "one_round", "reset", "retrain",
                                                                "more_labels"))
  return (Claim("Fig 6: iterative RL beats one round of the same length", f"{it} - {one}", "final", margin=margin),
          Claim("Fig 6: iterative RL beats one round whose reward model had as many labels", f"{it} - {more}",
                "final", margin=margin),
          Claim("retraining the reward model helps (reference reset in both)", f"{it} - {reset}", "final",
                margin=margin),
          Claim("retraining the reward model helps (no reference reset)", f"{retrain} - {one}", "final",
                margin=margin),
          Claim("the frozen reward model goes stale: its within-problem AUC on fresh samples falls over the run",
                one, "rm_staleness", "<", margin=auc_margin),
          Claim("a retraining round raises its within-problem AUC on fresh held-out samples", it, "rm_catch_up", ">",
                margin=auc_margin),
          Claim("GRPO on the learned reward model raises accuracy over its SFT start", one, "gain"),
          Claim("reference reset beside none (reward model retrained in both)", f"{it} - {retrain}", "final", ""),
          Claim("reference reset beside none (reward model frozen in both)", f"{reset} - {one}", "final", ""))


FAIR = _arms("fair", {**FAIR_RM, "rm_prompts": FAIR_RM_PROMPTS, "rm_steps": FAIR_RM_STEPS},
             "reward model (verifier + LoRA r = 8)", FAIR_RL, FAIR_UPDATE, FAIR_ITERATIONS)
FAIR_CONTRASTS = _contrasts("fair")
FAIR_MARGIN = common.ORDERING_MARGIN  # ±3 points of accuracy: no ordering larger than that either way
FAIR_AUC_MARGIN = 0.02  # two points of within-problem AUC
FAIR_DESIGN = Design(
    claims=_claims("fair", FAIR_MARGIN, FAIR_AUC_MARGIN),
    seeds=8,
    note=("Fig 6's ordering against one round and against one round with as many labels, the two simple effects "
          "of retraining in the 2x2, staleness and catch-up of the reward model, and GRPO's gain: seven claims, "
          "the orderings with a ±3-point margin and the AUC claims with ±0.02 (thirteen hypotheses: an ordering "
          "against zero and inside its margin), Holm at 0.05; the reset's two simple effects reported without a "
          "claim (the paper does not separate reset from retraining). No interaction claim: a contrast is one "
          "paired difference of two arms."))

# THE PATHS PROFILE (issue 56, goal 4, second design), declared here before its runs. Profile fair's reward model
# hardly moved on the default task: its first training took the held-out within-problem AUC from 0.936 to 0.939,
# since the verifier's likelihood already ranked the policy's samples, and one solution path per problem left the
# samples little to disagree on. The paths task (docs/train.md, "The paths task") has many valid paths per problem,
# and there a probe on the policy's own samples (`runs/probes/paths_rm_r8`; the 18,000 x 8,000-step SFT policy of
# docs/train.md at 68.5%, its own backbone as the reward model's, rank-8 adapters, the likelihood term, the
# within-problem pairwise loss at lr 3e-4, 1,000 prompts x 8 samples, `nice -n 19` beside another study) moved the
# held-out within-problem AUC from 0.747 to 0.827, 0.851 and 0.853 at steps 100, 200 and 600 (0.927 on its training
# samples). So here the reward model's training moves its ranking on the samples the policy writes.
#
# The SFT start costs about 35-50 minutes on this machine (18,000 solutions, 4,000 steps: 63.5% held out on seed 0,
# docs/train.md), too much for one per seed beside the arms, so it is a shared run: one SFT policy, seed 0's, that
# every seed starts from (`spec.Run.shared`). The seeds vary the reward model's samples and training, the RL
# sampling and the evaluation keys; the verdicts hold for that one start. Every seed's reward model is that
# policy's backbone with rank-8 LoRA adapters (no separate verifier: the probe's), trained on 1,000 prompts x 8 of
# its samples for 300 steps. The RL arms are profile fair's 2x2 and its control with as many labels, each GRPO+OS
# from the start for I = 3 iterations of 20 steps of 16 prompts x 8 (60 steps), retraining on 128 fresh prompts x 8
# for 100 steps a round; the reward model measured on 64 fresh held-out prompts x 8 at each iteration's end.
PATHS_TASK = common.PATHS_TASK
PATHS_ITERATIONS, PATHS_STEPS_PER_ITERATION = 3, 20
PATHS_RM = {**PATHS_TASK, "policy": "{run:paths_sft}/sft_policy", "rm_kind": "orm", "rm_score": "loglik",
            "rm_lora_rank": 8, "rm_loss": "pairwise", "rm_samples_per_prompt": 8, "rm_eval_prompts": 100,
            "rm_learning_rate": 3e-4, "rm_prompts": 1000, "rm_steps": 300, "tensorboard": False}
PATHS_UPDATE = FAIR_UPDATE  # 128 fresh prompts x 8, 100 steps of the rank-8 adapters at 3e-4 a round
PATHS_RL = {**PATHS_TASK, "init_checkpoint": "{run:paths_sft}/sft_policy", "reward": "orm",
            "reward_model": "{run:paths_rm}/reward_model", "iterations": PATHS_ITERATIONS,
            "steps_per_iteration": PATHS_STEPS_PER_ITERATION, "batch_size": 16, "rm_update_eval_prompts": 64,
            "eval_every": PATHS_STEPS_PER_ITERATION, "save_every": PATHS_STEPS_PER_ITERATION, "tensorboard": False}
PATHS = (
    common.paths_start("paths_sft", "paths"),
    *_arms("paths", PATHS_RM, "reward model (the policy's backbone + LoRA r = 8)", PATHS_RL, PATHS_UPDATE,
           PATHS_ITERATIONS),
)
RM_RUNS = ("rm", "fair_rm", "fair_rm_more", "paths_rm", "paths_rm_more")
PATHS_RUNS = tuple(f"paths_{a}" for a in ("one_round", "reset", "retrain", "iterative", "more_labels"))
ITERATED = FAIR_RUNS + PATHS_RUNS  # the arms that measure their reward model at each iteration's end
PATHS_DESIGN = Design(
    claims=_claims("paths", FAIR_MARGIN, FAIR_AUC_MARGIN),
    seeds=8,
    note=("Profile fair's claims, margins and rule on the paths task with a reward model that its training moves "
          "there (thirteen hypotheses, Holm at 0.05; the reset's two simple effects reported). One SFT start "
          "for every seed: the verdicts hold for that start."))
PATHS_NOTE = (
    "Fig 6 on the paths task (issue 56, second design): one SFT start for every seed (18,000 solutions, 4,000 "
    "steps; a shared run), each seed's reward model its backbone with rank-8 LoRA adapters trained on 1,000 prompts "
    "x 8 samples for 300 steps (a probe: held-out within-problem AUC 0.747 before, 0.851 after 200 steps); every "
    "arm 3 iterations of 20 GRPO steps of 16 prompts x 8 (60 steps), the reward model measured on 64 fresh "
    "held-out prompts x 8 at each iteration's end; retraining: 128 fresh prompts x 8 and 100 steps of the adapters "
    "a round; reference reset x retraining as a 2x2, and one round on a reward model with as many labels (1,256 "
    "prompts x 8, 500 steps). Time, from probes beside another study: the SFT start about 35-50 min once, a reward "
    "model 5-7 min, an arm 5-7 min (about 5 s a step of 32 prompts x 8 under that load): about 45 min a seed, "
    "6-6.5 hours in all.")

STUDY = Study(
    name="iterative",
    title="DeepSeekMath Fig 6: iterative RL (reward model retrained, reference reset) vs one round",
    description=(
        "GRPO+OS with a learned outcome reward model (`orm_steps`: an ORM read at every step end and pooled by a "
        "noisy-AND, plus α times its backbone's log-likelihood of the completion (`--rm_score=loglik`, the backbone "
        "frozen, the head and α trained with the within-problem pairwise loss on outcome labels of SFT samples), "
        "advantages normalised by the group's std as in the paper (the score ranks but is not calibrated: its "
        "spread within a group is a few hundredths, so unnormalised advantages would be that small), from the "
        "seed's SFT "
        "policy: once for all steps, and iteratively (Algorithm 1, I = 2: after each half the reward model "
        "retrains on fresh samples of the current policy plus 10% replay, and the reference becomes the "
        "policy), the same total policy steps. The rule-reward GRPO of the same seed is drawn for comparison. "
        "The reward model starts from a stronger backbone, the verifier (the same tiny model SFT-trained on 18,000 "
        "solutions for 2,000 steps): started from the policy's own backbone it ranked a problem's samples at chance "
        "(docs/reward_models.md, 'Why the outcome reward model ranked within problems at chance'); with a head "
        "alone on the verifier it ranked at 0.70 ± 0.08 within problems, with the log-likelihood term at 0.75 or "
        "more (quick profile, 3 seeds; docs/reward_models.md). "
        "The paper: iterating helps, most in the first iteration."),
    runs=(
        dataclasses.replace(common.SFT, only_in=OLD + ("fair",)),
        Run("verifier", {"steps": 0, "eval_every": 0, "sft_examples": 18000, "sft_steps": 2000},
            label="verifier backbone (SFT 2,000 steps on 18,000)", only_in=OLD + ("fair",)),
        Run("rm", {"policy": "{run:sft}/sft_policy", "rm_init": "{run:verifier}/sft_policy", "rm_kind": "orm_steps",
                   "rm_score": "loglik", "rm_freeze_backbone": True, "rm_loss": "pairwise",
                   "rm_prompts": 8000, "rm_samples_per_prompt": 8, "rm_steps": 3000},
            module=TRAIN_REWARD_MODEL, label="reward model (orm_steps + α · log-likelihood)",
            profiles={"quick": {"rm_prompts": 1000, "rm_steps": 400}}, only_in=OLD),
        dataclasses.replace(common.GRPO, only_in=OLD),
        dataclasses.replace(common.rl("one_round", "GRPO+OS, learned ORM, one round", reward="orm",
                                      reward_model="{run:rm}/reward_model"), only_in=OLD),
        dataclasses.replace(common.rl("iterative", "GRPO+OS, learned ORM, iterative (I = 2)", reward="orm",
                                      reward_model="{run:rm}/reward_model", iterations=2,
                                      steps_per_iteration=100,
                                      quick={"steps_per_iteration": common.QUICK_STEPS // 2, "rm_update_prompts": 128,
                                             "rm_update_steps": 50}), only_in=OLD),
        *FAIR,
        *PATHS,
    ),
    metrics=(
        Metric("accuracy", "eval/accuracy", source="curve", runs=RL_RUNS + FAIR_RUNS + PATHS_RUNS,
               label="held-out greedy accuracy"),
        dataclasses.replace(common.CHANGE, runs=RL_RUNS + FAIR_RUNS + PATHS_RUNS),
        Metric("iteration_accuracy", "iteration/accuracy", source="curve", runs=("iterative",),
               label="held-out accuracy at each iteration's end"),
        *(dataclasses.replace(m, runs=RL_RUNS + FAIR_RUNS + PATHS_RUNS)
          for m in (common.START, common.FINAL, common.GAIN)),
        Metric("rm_auc", "after/outcome/auc", runs=RM_RUNS, percent=False, label="reward model AUC"),
        Metric("rm_group_auc", "after/outcome/group_auc", runs=RM_RUNS, percent=False,
               label="reward model AUC within problems"),
        Metric("rm_group_auc_before", "before/outcome/group_auc", runs=RM_RUNS[1:], percent=False,
               label="the same before its training (the backbone's likelihood)"),
        Metric("rm_train_group_auc", "train/outcome/group_auc", runs=RM_RUNS, percent=False,
               label="the same on its training samples"),
        Metric("paths_start", "final_accuracy", runs=("paths_sft",), label="the shared SFT start's held-out accuracy"),
        # The fair and paths profiles' reward model on fresh held-out samples of the current policy at each
        # iteration's end.
        Metric("rm_fresh_before", "rm/held_out_before_outcome/group_auc", source="curve", runs=ITERATED,
               percent=False, label="reward model AUC within problems on fresh samples, before the round"),
        Metric("rm_fresh_after", "rm/held_out_after_outcome/group_auc", source="curve", runs=ITERATED,
               percent=False, label="the same after the round"),
        Metric("rm_staleness", "rm/held_out_before_outcome/group_auc", source="curve", since_start=True,
               runs=ITERATED, percent=False, label="its change since the first iteration's end"),
        Metric("rm_catch_up", "rm/held_out_after_outcome/group_auc", minus="rm/held_out_before_outcome/group_auc",
               source="curve", reduce="mean",
               runs=("fair_retrain", "fair_iterative", "paths_retrain", "paths_iterative"), percent=False,
               label="after minus before a retraining round, mean over rounds"),
    ),
    plots=(
        Plot("fig6.png", (Panel("accuracy", ("one_round", "iterative", "grpo"),
                                title="learned ORM: one round vs iterative; rule reward"),
                          Panel("change", ("one_round", "iterative", "grpo"),
                                title="change since the SFT start, paired by seed", ylabel="points")),
             title="DeepSeekMath Fig 6: iterative RL against one round of the same length", xlabel="RL step"),
        Plot("fig6_fair.png", (Panel("change", FAIR_RUNS, title="change since the SFT start, paired by seed",
                                     ylabel="points"),
                               Panel("rm_fresh_before", FAIR_RUNS,
                                     title="reward model on fresh samples of the current policy, before each round")),
             title="Fig 6, reset x retraining (profile fair): a reward model whose training moves its ranking",
             xlabel="RL step"),
        Plot("fig6_paths.png", (Panel("change", PATHS_RUNS, title="change since the SFT start, paired by seed",
                                      ylabel="points"),
                                Panel("rm_fresh_before", PATHS_RUNS,
                                      title="reward model on fresh samples of the current policy, before each round")),
             title="Fig 6, reset x retraining on the paths task (profile paths)", xlabel="RL step"),
    ),
    contrasts=(Contrast("iterative", "one_round", "final"), Contrast("one_round", "grpo", "final"),
               *(Contrast(a, b, "final") for a, b in FAIR_CONTRASTS + _contrasts("paths"))),
    claims=(Claim("Fig 6: iterative RL beats one round of the same length", "iterative - one_round", "final",
                  margin=common.ORDERING_MARGIN),
            Claim("GRPO on the learned ORM raises accuracy over its SFT start", "one_round", "gain"),
            Claim("the learned ORM beside the rule reward (no ordering claimed)", "one_round - grpo", "final", "")),
    profiles={"quick": common.QUICK, "fair": {}, "paths": {}},
    designs={"fair": FAIR_DESIGN, "paths": PATHS_DESIGN},
    notes={"paths": PATHS_NOTE,
           "fair": ("Fig 6 with a reward model whose training moves its ranking (issue 56): the verifier's backbone "
                    "with rank-8 LoRA adapters, trained on 1,000 SFT prompts x 8 for 600 steps; every arm 3 "
                    "iterations of 40 GRPO steps of 32 prompts x 8 (120 steps; the full profile: 200) with the reward "
                    "model measured on 64 fresh held-out prompts x 8 at each iteration's end; retraining: 128 fresh "
                    "prompts x 8 and 100 steps of the adapters a round; reference reset x retraining as a 2x2, and "
                    "one round on a reward model with as many labels (1,256 prompts x 8, 800 steps)."),
           "quick": common.QUICK_NOTE + " The reward model trains its head and α (the backbone frozen) on 1,000 "
                                        "prompts x 8 SFT samples for 400 steps from the verifier's backbone (full: "
                                        "8,000 x 8, 3,000 steps); each "
                                        "iteration retrains it on 128 prompts x 8 for 50 steps (full: 256 x 8, "
                                        "100 steps)."},
)
