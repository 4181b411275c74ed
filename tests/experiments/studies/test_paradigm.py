"""The paradigm study's designs (issue 56): the fair profile on the chain task and the paths profile, Fig 5 on the
paths task from one shared SFT start; their arms, claims, seeds and margins declared before any run."""

from absl import flags

from experiments import cli
from experiments.reproduce import plan as plan_lib
from experiments.studies import common
from experiments.studies import paradigm

STUDY = paradigm.STUDY
PATHS = STUDY.designs["paths"]


def _flags(run: str, profile: str) -> dict:
  return STUDY.flags_for(STUDY.run(run), profile)


def test_the_paths_arms_differ_only_in_their_method_and_share_one_start():
  arms = {name: _flags(name, "paths") for name in paradigm.PATHS_RUNS}
  method = ("algo", "reward", "supervision", "prm_max_steps")
  rest = [{k: v for k, v in f.items() if k not in method} for f in arms.values()]
  assert all(r == rest[0] for r in rest)  # the same task, start, steps, prompts, temperature and validation split
  assert rest[0]["init_checkpoint"] == "{run:paths_start}/sft_policy"
  assert {k: rest[0][k] for k in common.PATHS_TASK} == common.PATHS_TASK
  assert rest[0]["likelihood_temperature"] == 0.7 and rest[0]["num_validation"] > 0
  assert [arms[n].get("algo") for n in paradigm.PATHS_RUNS] == ["sft", "rft_table10", "online_rft", None, None]
  assert (arms["paths_grpo_ps"]["reward"], arms["paths_grpo_ps"]["supervision"]) == ("exact_steps", "process")
  assert arms["paths_grpo_ps"]["prm_max_steps"] > common.PATHS_TASK["paths_max_steps"]  # the answer segment too
  assert all(STUDY.run(n).tune == paradigm.PATHS_TUNE for n in paradigm.PATHS_RUNS)
  start = STUDY.run("paths_start")
  assert start.shared and _flags("paths_start", "paths")["sft_steps"] == common.PATHS_SFT_STEPS


def test_the_paths_design_claims_the_fair_orderings_on_the_paths_task():
  fair = STUDY.designs["fair"]
  assert PATHS.seeds >= 8 and PATHS.alpha == fair.alpha
  rename = lambda run: run.replace("fair_", "paths_")
  ordered = lambda design: [(c.run, c.metric, c.expect, c.margin) for c in design.claims if c.expect]
  assert ordered(PATHS) == [(rename(r), m, e, d) for r, m, e, d in ordered(fair)]
  contrasts = {c.run: c for c in STUDY.contrasts}
  metrics = {m.name: m for m in STUDY.metrics}
  for c in PATHS.claims:  # each claim is read off a cell the study makes
    runs = [contrasts[c.run].a, contrasts[c.run].b] if " - " in c.run else [c.run]
    assert set(runs) <= set(metrics[c.metric].runs) and set(runs) <= set(paradigm.PATHS_RUNS)
  assert STUDY.claims_in("paths") == PATHS.claims and STUDY.claims_in("full") == STUDY.claims


def test_the_paths_plan_runs_one_start_and_every_command_is_a_valid_config(tmp_path):
  jobs = plan_lib.plan(STUDY, "paths", list(range(PATHS.seeds)), tmp_path)
  starts = [j for j in jobs if j.run.name == "paths_start"]
  assert len(starts) == 1 and starts[0].seed == 0
  grid = {STUDY.run(a).tune.grid_name(a, v) for a in paradigm.PATHS_RUNS for v in paradigm.PATHS_LRS}
  assert {j.run.name for j in jobs} == {"paths_start", *paradigm.PATHS_RUNS, *grid}
  assert {j.seed for j in jobs} == set(range(8))
  for job in jobs:
    if job.run.name != "paths_start" and not job.alias:
      assert f"--init_checkpoint={starts[0].directory}/sft_policy" in job.argv
  for job in (j for j in jobs if j.seed == 0):
    flags.FLAGS.unparse_flags()
    try:
      flags.FLAGS([job.run.module, *[a.replace("{tuned}", "0.0001") for a in job.argv[3:]]])
      config = cli.config_from_flags()  # the runner's own checks: one line for any bad combination
      assert config.task.task == "synthetic_paths"
    finally:
      flags.FLAGS.unparse_flags()
