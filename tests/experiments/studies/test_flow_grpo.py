"""The flow_grpo study's fair and hard designs (issue 56, goal 5): one converged SFT planner per seed, three arms
from it at equal updates, and the claims, seeds and margins declared before any run."""

import dataclasses

from absl import flags
import pytest

from experiments import cli
from experiments import flow_grpo as flow_runner
from experiments.methods import flow_grpo as flow_method
from experiments.reproduce import plan as plan_lib
from experiments.runner import config as config_lib
from experiments.studies import flow_grpo
from experiments.studies.spec import FLOW_GRPO
from grpo_jax import models

STUDY = flow_grpo.STUDY
# profile -> (its arms, their learning-rate grid, the planner's SFT steps, its SFT problems, the arms' steps, the task's
# operations and turns)
PROFILES = {
    "fair": (flow_grpo.FAIR_ARMS, flow_grpo.FAIR_LRS, flow_grpo.FAIR_SFT_STEPS, 2000, 60, (3, 5, 6)),
    "hard": (flow_grpo.HARD_ARMS, flow_grpo.HARD_LRS, flow_grpo.HARD_SFT_STEPS, 12000, 60, (5, 8, 9)),
}
profiles = pytest.mark.parametrize("profile", list(PROFILES))


def _flags(run: str, profile: str) -> dict:
  return STUDY.flags_for(STUDY.run(run), profile)


def _config(argv: list[str]):
  """The config `python -m experiments.flow_grpo <argv>` runs (its preset as the flags' defaults), checked by the
  method as it starts."""
  saved = {name: flags.FLAGS[name].default for name in flow_runner.DEFAULTS}
  flags.FLAGS.unparse_flags()
  try:
    for name, value in flow_runner.DEFAULTS.items():
      flags.FLAGS.set_default(name, value)
    flags.FLAGS([FLOW_GRPO, *argv])
    config = cli.config_from_flags(algo="flow_grpo")
  finally:
    flags.FLAGS.unparse_flags()
    for name, value in saved.items():
      flags.FLAGS.set_default(name, value)
  flow_method.FlowGRPO(config, models.tiny_config(), None, None, None)  # the method's own refusals
  return config


def _agent(config) -> dict:
  return {f.name: getattr(config.agent, f.name) for f in dataclasses.fields(config_lib.AgentConfig)
          if f.name != "planner_objective"}


def _jobs(tmp_path, profile: str):
  return plan_lib.plan(STUDY, profile, list(range(STUDY.designs[profile].seeds)), tmp_path)


def _argv(job, profile: str) -> list[str]:
  """A job's flags; a tuned run's chosen learning rate (not known before its grid runs) as the grid's first value."""
  return [a.replace("{tuned}", str(PROFILES[profile][1][0])) for a in job.argv[3:]]


@profiles
def test_every_arm_starts_from_the_seeds_one_sft_planner_and_differs_only_in_its_update(profile):
  arm_names, lrs = PROFILES[profile][:2]
  arms = {name: _flags(name, profile) for name in arm_names}
  assert {f["planner_objective"] for f in arms.values()} == set(config_lib.PLANNER_OBJECTIVES)
  assert {f["init_checkpoint"] for f in arms.values()} == {f"{{run:{profile}_planner}}/sft_policy"}
  rest = [{k: v for k, v in f.items() if k != "planner_objective"} for f in arms.values()]
  assert all(r == rest[0] for r in rest)
  tunes = {STUDY.run(name).tune for name in arm_names}  # each arm's lr chosen on validation, from one grid
  assert len(tunes) == 1 and next(iter(tunes)).values == lrs
  assert next(iter(tunes)).flag == "learning_rate" and rest[0]["num_validation"] > 0


@profiles
def test_the_arms_make_equal_updates_on_the_planners_harder_task(tmp_path, profile):
  arm_names, _, sft_steps, sft_examples, steps, shape = PROFILES[profile]
  jobs = [j for j in _jobs(tmp_path, profile) if j.seed == 2]  # past the tuning seeds: the arms' own commands
  planner = _config(_argv(next(j for j in jobs if j.run.name == f"{profile}_planner"), profile))
  arms = {j.run.name: _config(_argv(j, profile)) for j in jobs if j.run.name in arm_names}
  assert set(arms) == set(arm_names)
  updates = {}
  for name, config in arms.items():
    algo, rows = config.algorithm, config.rows_per_step
    updates[name] = config.optim.steps * algo.num_epochs * (rows // (algo.minibatch_size or rows))
    # the planner's task and agent (the arms hold 200 problems of the RL pool out for validation)
    assert dataclasses.replace(config.task, num_validation=0) == planner.task
    assert _agent(config) == _agent(planner)
    assert config.rollout.batch_size == arms[f"{profile}_flow"].rollout.batch_size  # the same queries a step
    assert config.model.init_checkpoint.endswith("/sft_policy") and not planner.model.init_checkpoint
  assert len(set(updates.values())) == 1 and updates[f"{profile}_flow"] == steps
  task = planner.task
  assert (task.synthetic_min_steps, task.synthetic_max_steps, planner.agent.max_turns) == shape
  assert task.sft_examples == sft_examples  # the arms' RL prompts exclude the planner's SFT problems
  assert planner.sft.sft_steps == sft_steps and planner.optim.steps == 0


@profiles
def test_the_design_declares_claims_seeds_and_margins(profile):
  design, (flow, trajectory, sft) = STUDY.designs[profile], PROFILES[profile][0]
  assert design.seeds >= 8 and design.alpha == 0.05
  claims = {(c.run, c.metric): c for c in design.claims}
  for contrast in (f"{flow} - {sft}", f"{flow} - {trajectory}"):
    assert (claims[contrast, "final"].expect, claims[contrast, "final"].margin) == (">", 0.03)
  assert claims[flow, "gain"].expect == ">"
  assert (claims[sft, "gain"].expect, claims[sft, "gain"].margin) == ("=", 0.03)  # converged start
  assert claims[f"{trajectory} - {sft}", "final"].expect == ""  # reported, no ordering claimed
  contrasts = {c.run: c for c in STUDY.contrasts}
  metrics = {m.name: m for m in STUDY.metrics}
  for c in design.claims:  # each claim is read off a cell the study makes: a contrast or a run the metric covers
    runs = [contrasts[c.run].a, contrasts[c.run].b] if " - " in c.run else [c.run]
    assert contrasts.get(c.run, c).metric == c.metric
    assert set(runs) <= set(metrics[c.metric].runs) and set(runs) <= set(PROFILES[profile][0])
  assert STUDY.claims_in(profile) == design.claims and STUDY.claims_in("full") == STUDY.claims  # the old ones stay


@profiles
def test_the_plan_runs_only_its_profiles_arms_on_eight_seeds(tmp_path, profile):
  arm_names, lrs = PROFILES[profile][:2]
  jobs = _jobs(tmp_path, profile)
  grid = {STUDY.run(a).tune.grid_name(a, v) for a in arm_names for v in lrs}
  assert {j.run.name for j in jobs} == {f"{profile}_planner", *arm_names, *grid}
  assert {j.seed for j in jobs} == set(range(8))
  assert not {"sft", "grpo", "flow"} & {r.name for r in STUDY.runs_in(profile)}
  assert {"sft", "grpo", "flow"} <= {r.name for r in STUDY.runs_in("full")}
  planners = {j.seed: j for j in jobs if j.run.name == f"{profile}_planner"}
  for job in (j for j in jobs if j.run.name in grid):  # the grid's runs: each value, each tuning seed
    assert job.seed < STUDY.run(job.run.name.split("@")[0]).tune.seeds
    config = _config(_argv(job, profile))
    assert config.model.init_checkpoint == f"{planners[job.seed].directory}/sft_policy"
    assert config.optim.learning_rate in lrs


def test_the_command_check_sets_the_objective_and_refuses_a_bad_arm():
  for objective in config_lib.PLANNER_OBJECTIVES:
    assert _config([f"--planner_objective={objective}"]).agent.planner_objective == objective
  with pytest.raises(config_lib.ConfigError, match="--planner_objective=sft updates once a step"):
    _config(["--planner_objective=sft", "--num_epochs=2"])
