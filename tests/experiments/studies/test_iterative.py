"""The iterative study's fair design (issue 56, goal 4): its arms, the 2x2, the control with as many labels, and the
claims, seeds and margins declared before any run."""

from absl import flags

from experiments import cli
from experiments import train_reward_model
from experiments.reproduce import plan as plan_lib
from experiments.studies import iterative
from experiments.studies.spec import GRPO_MATH, TRAIN_REWARD_MODEL

STUDY = iterative.STUDY
DESIGN = STUDY.designs["fair"]


def _flags(run: str) -> dict:
  return STUDY.flags_for(STUDY.run(run), "fair")


def test_the_arms_cross_reference_reset_with_retraining_over_three_iterations_or_more():
  arms = {name: _flags(name) for name in iterative.FAIR_RUNS}
  cells = {(f["reset_reference"], f["rm_update_steps"] > 0): name for name, f in arms.items()
           if name != "fair_more_labels"}
  assert cells == {(False, False): "fair_one_round", (True, False): "fair_reset", (False, True): "fair_retrain",
                   (True, True): "fair_iterative"}
  steps = {f["iterations"] * f["steps_per_iteration"] for f in arms.values()}
  assert steps == {120} and all(f["iterations"] >= 3 for f in arms.values())  # the same policy steps in every arm
  for name, f in arms.items():
    assert f["rm_update_eval_prompts"] > 0  # staleness measured in every arm, retrained or not
    assert f["reward_model"] == ("{run:fair_rm_more}/reward_model" if name == "fair_more_labels"
                                 else "{run:fair_rm}/reward_model")
    if f["rm_update_steps"]:
      assert f["rm_update_lora_rank"] > 0  # retraining moves the adapters, so it can change the ranking
  assert _flags("fair_rm")["rm_lora_rank"] > 0 and _flags("fair_rm_more")["rm_lora_rank"] > 0


def test_the_control_reward_model_gets_as_many_labels_as_the_iterative_one_before_its_last_iteration():
  base, more, retrain = _flags("fair_rm"), _flags("fair_rm_more"), _flags("fair_iterative")
  rounds = retrain["iterations"] - 1  # the last round's retraining comes after the last policy step
  assert more["rm_prompts"] == base["rm_prompts"] + rounds * retrain["rm_update_prompts"]
  assert more["rm_steps"] == base["rm_steps"] + rounds * retrain["rm_update_steps"]
  assert {k: v for k, v in more.items() if k not in ("rm_prompts", "rm_steps")} == \
      {k: v for k, v in base.items() if k not in ("rm_prompts", "rm_steps")}


def test_the_design_declares_claims_seeds_and_margins():
  assert DESIGN.seeds >= 8 and DESIGN.alpha == 0.05
  claims = {c.run: c for c in DESIGN.claims if c.metric == "final"}
  for contrast in ("fair_iterative - fair_one_round", "fair_iterative - fair_more_labels",
                   "fair_iterative - fair_reset", "fair_retrain - fair_one_round"):
    assert claims[contrast].expect == ">" and claims[contrast].margin == 0.03
  for contrast in ("fair_iterative - fair_retrain", "fair_reset - fair_one_round"):
    assert claims[contrast].expect == ""  # reported, no ordering claimed
  contrasts = {c.run for c in STUDY.contrasts}
  assert set(claims) <= contrasts
  by_metric = {c.metric: c for c in DESIGN.claims}
  assert (by_metric["rm_staleness"].run, by_metric["rm_staleness"].expect) == ("fair_one_round", "<")
  assert (by_metric["rm_catch_up"].run, by_metric["rm_catch_up"].expect) == ("fair_iterative", ">")
  assert all(c.margin > 0 for c in DESIGN.claims if c.expect in (">", "<") and c.metric != "gain")
  assert STUDY.claims_in("fair") == DESIGN.claims and STUDY.claims_in("full") == STUDY.claims  # the old ones stay


def test_the_fair_plan_runs_only_its_arms_and_every_command_is_a_valid_config(tmp_path):
  jobs = plan_lib.plan(STUDY, "fair", list(range(DESIGN.seeds)), tmp_path)
  names = {job.run.name for job in jobs}
  assert names == {"sft", "verifier", "fair_rm", "fair_rm_more", *iterative.FAIR_RUNS}
  assert {job.seed for job in jobs} == set(range(8))
  assert not {"rm", "one_round", "iterative", "grpo"} & {r.name for r in STUDY.runs_in("fair")}
  assert {"rm", "one_round", "iterative", "grpo"} <= {r.name for r in STUDY.runs_in("full")}
  for job in (j for j in jobs if j.seed == 0):
    flags.FLAGS.unparse_flags()
    try:
      flags.FLAGS([job.run.module, *job.argv[3:]])
      if job.run.module == GRPO_MATH:
        config = cli.config_from_flags()  # the runner's own checks: one line for any bad combination
        if job.run.name in iterative.FAIR_RUNS:
          assert config.optim.steps == 120 and config.reward_model.iterations == 3
      else:
        assert job.run.module == TRAIN_REWARD_MODEL
        _, rmc = train_reward_model.config_from_flags()
        assert rmc.rm_lora_rank == 8 and not rmc.rm_freeze_backbone
    finally:
      flags.FLAGS.unparse_flags()


def test_the_paths_profile_is_the_fair_design_on_the_paths_task_from_one_shared_start(tmp_path):
  """Profile paths: the fair profile's arms, claims and margins (the names prefixed), on the paths task, every seed
  from one SFT start (a shared run), the reward model the start's own backbone with adapters."""
  paths = STUDY.designs["paths"]
  assert paths.seeds >= 8 and paths.alpha == DESIGN.alpha
  rename = lambda run: run.replace("fair_", "paths_")
  assert [(c.text, c.run, c.metric, c.expect, c.margin) for c in paths.claims] == [
      (c.text, rename(c.run), c.metric, c.expect, c.margin) for c in DESIGN.claims]
  contrasts = {c.run for c in STUDY.contrasts}
  assert {c.run for c in paths.claims if " - " in c.run} <= contrasts
  flags_of = lambda run: STUDY.flags_for(STUDY.run(run), "paths")
  arms = {name: flags_of(name) for name in iterative.PATHS_RUNS}
  cells = {(f["reset_reference"], f["rm_update_steps"] > 0): name for name, f in arms.items()
           if name != "paths_more_labels"}
  assert cells == {(False, False): "paths_one_round", (True, False): "paths_reset", (False, True): "paths_retrain",
                   (True, True): "paths_iterative"}
  assert {f["iterations"] for f in arms.values()} == {3}
  assert {f["iterations"] * f["steps_per_iteration"] for f in arms.values()} == {60}
  for f in (*arms.values(), flags_of("paths_rm"), flags_of("paths_sft")):
    assert f["task"] == "synthetic_paths" and f["sft_examples"] == 18000  # RL and RM prompts exclude the SFT ones
  rm, more, retrain = flags_of("paths_rm"), flags_of("paths_rm_more"), arms["paths_iterative"]
  assert rm["rm_lora_rank"] > 0 and "rm_init" not in rm  # the start's own backbone, with adapters
  assert more["rm_prompts"] == rm["rm_prompts"] + 2 * retrain["rm_update_prompts"]
  assert more["rm_steps"] == rm["rm_steps"] + 2 * retrain["rm_update_steps"]

  jobs = plan_lib.plan(STUDY, "paths", list(range(paths.seeds)), tmp_path)
  starts = [j for j in jobs if j.run.name == "paths_sft"]
  assert len(starts) == 1 and starts[0].seed == 0  # one SFT process for the 8 seeds
  assert {j.seed for j in jobs} == set(range(8))
  for job in (j for j in jobs if j.seed == 5):
    if job.run.name in ("paths_rm", "paths_rm_more") or job.run.name in iterative.PATHS_RUNS:
      assert any(a.startswith(f"--{k}={starts[0].directory}/sft_policy") for a in job.argv
                 for k in ("policy", "init_checkpoint"))
  for job in (j for j in jobs if j.seed == 0):  # the runners' own checks of every command
    flags.FLAGS.unparse_flags()
    try:
      flags.FLAGS([job.run.module, *job.argv[3:]])
      if job.run.module == GRPO_MATH:
        config = cli.config_from_flags()
        assert config.task.task == "synthetic_paths"
      else:
        assert train_reward_model.config_from_flags()[1].rm_lora_rank == 8
    finally:
      flags.FLAGS.unparse_flags()
