"""What the studies share: the quick profile, the shared SFT policy and plain GRPO, the usual metrics.

A run with the same runner and flags is one directory for every study (reproduce hashes them), so the
SFT policy of a seed is trained once and plain GRPO from it runs once, whichever study asks first.
"""

from experiments.studies.spec import FLOW_GRPO, GRPO_MATH, SAMPLE_EVAL, TRAIN_REWARD_MODEL, Metric, Run

# The quick profile: every study, 3 seeds, in under an hour on a 2-core CPU (BENCHMARKS.md and the README give the
# measured time). Stage 2 is QUICK_RL: 40 steps of 16 prompts x 8 samples (the full runs: 200 x 32 x 8) at peak lr
# 1e-4, since at the default 3e-4 runs this short lost accuracy (seed 0, 200 problems: GRPO 43.0% -> 37.5%, Online
# RFT 43.0% -> 36.0%), where 1e-4 took GRPO to 48.5% in 60 steps. Held-out accuracy every 20 steps on 200 problems
# (full: 500 every 100); the SFT stage is the full one. QUICK_RL goes to the stage-2 runs only (`rl`), so the SFT
# run's flags, and its directory, do not depend on it. Flow-GRPO: its full SFT stage (300 steps of 64 teacher turns;
# batches of 32 left the planner at 8% on seed 0, and Flow-GRPO had nothing to learn from), then 10 steps of 8
# queries x 8 trajectories (full: 60 of 16 x 8).
QUICK_STEPS = 40
QUICK_RL = {"steps": QUICK_STEPS, "batch_size": 16, "learning_rate": 1e-4}
QUICK_EVAL = {"num_test": 200}
QUICK = {
    GRPO_MATH: {"eval_every": 20, "save_every": 20, "tensorboard": False, **QUICK_EVAL},
    SAMPLE_EVAL: dict(QUICK_EVAL),
    TRAIN_REWARD_MODEL: {"rm_eval_prompts": 100, "tensorboard": False},
    FLOW_GRPO: {"steps": 10, "batch_size": 8, "eval_every": 0, "save_every": 10, "tensorboard": False,
                **QUICK_EVAL},
}
QUICK_NOTE = ("RL runs 40 steps of 16 prompts x 8 samples at peak lr 1e-4 (the full profile and the README: 200 "
              "steps of 32 x 8 at 3e-4; at 3e-4 short runs lost accuracy in a probe), held-out greedy accuracy "
              "on 200 problems every 20 steps (full: 500 every 100), the full SFT stage; Flow-GRPO 10 steps of 8 "
              "queries x 8 trajectories after its full SFT (full: 60 steps of 16 x 8). Expect smaller gains than "
              "the README's.")


# The equivalence margin of the papers' orderings between two methods (Fig 5, Fig 6): an ordering whose 2-s.e.
# interval holds zero but lies inside ±3 points reads "equal" (no ordering larger than 3 points either way), the
# margin Fig 7's "Pass@64 stays flat" uses. Stated on 2026-11-26, before the full paradigm's seeds 3-4 and the
# iterative study's seeds 1-2 finished. The paper's own gaps are a few points (Fig 5, 1.3B: GRPO+PS > GRPO+OS >
# Online RFT > RFT), so "equal" says the ordering is too small to see at this scale, not that it is absent.
ORDERING_MARGIN = 0.03

# The paths task's flags (experiments/configs/synthetic_paths.cfg: several valid solution paths, 4-8 steps), with
# its SFT start's 18,000 solutions excluded from every run's RL and reward-model prompts; and that start: 4,000
# steps (63.5% held out on seed 0, docs/train.md "The paths task"), one for every seed (a shared run: 35-50 minutes
# on this machine, too much for one per seed).
PATHS_TASK = {"task": "synthetic_paths", "paths_min_steps": 4, "paths_max_steps": 8, "num_train": 20000,
              "max_prompt_len": 24, "max_new_tokens": 96, "sft_examples": 18000}
PATHS_SFT_STEPS = 4000


def paths_start(name: str, profile: str) -> Run:
  """The paths task's SFT start of a profile, shared by every seed."""
  return Run(name, {**PATHS_TASK, "sft_steps": PATHS_SFT_STEPS, "steps": 0, "eval_every": 0, "tensorboard": False},
             label=f"SFT start on the paths task ({PATHS_SFT_STEPS} steps on 18,000 solutions; one for every seed)",
             only_in=(profile,), shared=True)


def rl(name: str, label: str, quick: dict | None = None, **flags) -> Run:
  """A stage-2 run of grpo_math from the seed's shared SFT policy; `quick`: its own quick-profile flags (over
  QUICK_RL)."""
  quick = {**{k: v for k, v in QUICK_RL.items() if k not in flags}, **(quick or {})}
  return Run(name, {"init_checkpoint": "{run:sft}/sft_policy", **flags}, label=label, profiles={"quick": quick})


# The stage-1 SFT policy of a seed (the default SFT: 600 steps on 2,000 worked solutions), and its accuracy.
SFT = Run("sft", {"steps": 0, "eval_every": 0}, label="SFT (stage 1)")
# GRPO+OS with the rule reward (the default stage 2) from the shared SFT policy.
GRPO = rl("grpo", "GRPO")

ACCURACY = Metric("accuracy", "eval/accuracy", source="curve", label="held-out greedy accuracy")
CHANGE = Metric("change", "eval/accuracy", source="curve", since_start=True,
                label="held-out accuracy change since the start (points)")
START = Metric("start", "start_accuracy", label="start (SFT)")
FINAL = Metric("final", "final_accuracy", label="after RL")
GAIN = Metric("gain", "final_accuracy", minus="start_accuracy", label="gain (points)")
