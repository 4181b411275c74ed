"""experiments.reproduce.plan: run directories hashed from runner, flags, changed defaults and needs; the
defaults snapshot; every registered study plans and its flags parse."""

import dataclasses
import json
import pathlib
import re
import subprocess
import sys

import pytest

from experiments import studies
from experiments.reproduce import plan as plan_lib
from experiments.runner import config as config_lib
from experiments.studies import spec
from tests import reproduce_fakes as fakes

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_plan_hashes_flags_and_dependencies(tmp_path):
  study = fakes.study()
  a = plan_lib.plan(study, "full", [0], tmp_path)
  b = plan_lib.plan(study, "full", [0], tmp_path)
  assert [j.directory for j in a] == [j.directory for j in b]
  changed = spec.Study("tiny", "x", (spec.Run("base", {"level": 0.5}, command=study.runs[0].command),) +
                       study.runs[1:], study.metrics)
  c = plan_lib.plan(changed, "full", [0], tmp_path)
  # base changed, and so did the runs that read it
  assert all(x.directory != y.directory for x, y in zip(a, c))
  assert f"--start_from={a[0].directory}" in a[1].argv
  with pytest.raises(plan_lib.StudyError, match="cycle"):
    plan_lib.plan(spec.Study("loop", "x", (spec.Run("a", {"x": "{run:b}"}), spec.Run("b", {"x": "{run:a}"})), ()),
                   "full", [0], tmp_path)
  with pytest.raises(plan_lib.StudyError, match="no profile"):
    plan_lib.plan(study, "medium", [0], tmp_path)
  with pytest.raises(plan_lib.StudyError, match="set by reproduce"):
    plan_lib.plan(spec.Study("s", "x", (spec.Run("a", {"seed": 3}),), ()), "full", [0], tmp_path)


def test_a_changed_runner_default_means_new_run_directories(tmp_path, monkeypatch):
  study = spec.Study("defaults", "x", (spec.Run("sft", {"steps": 0}), spec.Run("rl", {"init": "{run:sft}/p"}),
                                       spec.Run("flow", {}, module=spec.FLOW_GRPO)), ())
  before = plan_lib.plan(study, "full", [0], tmp_path)
  assert before[0].directory != before[2].directory  # another runner, other defaults
  real = config_lib.Config
  monkeypatch.setattr(config_lib, "Config", lambda: real().replace(sft_steps=123))
  after = plan_lib.plan(study, "full", [0], tmp_path)
  # the runs that read the changed default (directly, or through the run they start from) move; Flow-GRPO sets
  # its own sft_steps, so its run stays
  assert [x.directory != y.directory for x, y in zip(before, after)] == [True, True, False]
  # where the run settings are not results (the work dir, the compilation cache), nothing moves
  monkeypatch.setattr(config_lib, "Config", lambda: real().replace(compilation_cache_dir="/elsewhere", work_dir="w"))
  assert [j.directory for j in plan_lib.plan(study, "full", [0], tmp_path)] == [j.directory for j in before]


def test_a_new_flag_keeps_finished_runs_and_a_new_revision_moves_them(tmp_path, monkeypatch):
  """Only defaults that differ from the committed snapshot enter the hash: adding a flag (whose default keeps the
  old behaviour) leaves run directories in place; rewriting the snapshot (a numerics change) moves every run."""
  study = spec.Study("defaults", "x", (spec.Run("sft", {"steps": 0}), spec.Run("flow", {}, module=spec.FLOW_GRPO)),
                     ())
  snapshot = tmp_path / "runner_defaults.json"
  monkeypatch.setattr(plan_lib, "DEFAULTS_SNAPSHOT", snapshot)
  assert plan_lib.write_defaults_snapshot() == 1
  before = [j.directory for j in plan_lib.plan(study, "full", [0], tmp_path)]
  real = config_lib.Config

  class WithANewFlag:
    def flat(self):
      return {**real().flat(), "brand_new_flag": 7}

  monkeypatch.setattr(config_lib, "Config", WithANewFlag)
  assert [j.directory for j in plan_lib.plan(study, "full", [0], tmp_path)] == before
  monkeypatch.setattr(config_lib, "Config", real)
  assert plan_lib.write_defaults_snapshot() == 2
  after = [j.directory for j in plan_lib.plan(study, "full", [0], tmp_path)]
  assert all(a != b for a, b in zip(before, after))
  snapshot.write_text("{}")
  with pytest.raises(plan_lib.StudyError, match="not a defaults snapshot"):
    plan_lib.plan(study, "full", [0], tmp_path)


def test_the_committed_defaults_snapshot_is_a_snapshot():
  snapshot = plan_lib.read_defaults_snapshot()
  for module in (spec.GRPO_MATH, spec.FLOW_GRPO):
    missing = set(snapshot[module]) - set(plan_lib.runner_defaults(spec.Run("x", {}, module=module)))
    # a flag removed since the snapshot: its behaviour is now fixed in code, so the revision must move
    assert not missing, f"flags gone since the snapshot: {missing}; run --write_defaults_snapshot"


def test_registered_studies_are_well_formed(tmp_path):
  """Every study plans in every profile; its runs name real runners; plots name metrics it has."""
  assert {"paradigm", "majk_passk", "iterative", "variants", "flow_grpo", "headline"} <= set(studies.STUDIES)
  for study in studies.STUDIES.values():
    names = {n for m in study.metrics for n, *_ in m.expand()} | {m.name for m in study.metrics}
    for plot in study.plots:
      for panel in plot.panels:
        assert set(panel.metrics) <= names, (study.name, plot.file, panel.metrics)
    for profile in ["full", *study.profiles]:
      jobs = plan_lib.plan(study, profile, [0, 1], tmp_path)
      runs = study.runs_in(profile)  # and a tuned run's grid on its tuning seeds (here 0 and 1); a shared run once
      assert len(jobs) == sum(1 if r.shared else 2 for r in runs) + sum(
          len(r.tune.values) * r.tune.seeds for r in runs if r.tune)
      for job in jobs:
        assert (ROOT / (job.run.module.replace(".", "/") + ".py")).is_file(), job.run.module


def test_registered_study_flags_parse(tmp_path):
  """Each runner accepts every flag of every study and profile: absl parses them with the runners' validators
  in one child process (nothing runs), and no run passes a flag that only another runner defines."""
  commands = []
  for study in studies.STUDIES.values():
    for profile in ["full", *study.profiles]:
      commands += [[job.run.module] + [a.replace("{tuned}", "0.001") for a in job.argv[3:]]  # a tuned lr
                   for job in plan_lib.plan(study, profile, [0], tmp_path)]
  check = r"""
import json, sys
from absl import flags
runners = ["experiments.flow_grpo", "experiments.train_reward_model", "experiments.sample_eval"]
for name in runners:
    __import__(name)
own = {m: {f.name for f in flags.FLAGS.flags_by_module_dict().get(m, [])} for m in runners}
bad = []
for module, *args in json.loads(sys.stdin.read()):
    names = {a[2:].split("=", 1)[0] for a in args}
    foreign = {n for m, defined in own.items() if m != module for n in defined & names}
    if foreign:
        bad.append(f"{module}: flags of another runner: {sorted(foreign)}")
    flags.FLAGS.unparse_flags()
    try:
        flags.FLAGS([module] + args)
    except flags.Error as err:
        bad.append(f"{module} {' '.join(args)}: {err}")
print("\n".join(bad))
sys.exit(1 if bad else 0)
"""
  result = subprocess.run([sys.executable, "-c", check], input=json.dumps(commands), cwd=ROOT, capture_output=True,
                          text=True)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


def test_every_papers_study_states_its_claims():
  for name in ("paradigm", "majk_passk", "iterative", "flow_grpo"):
    study = plan_lib.load_study(name)
    assert any(c.expect for c in study.claims), name


def test_comments_name_only_what_exists():
  """REVIEW B3: a comment told the reader to bump DEFAULTS_REVISION, a name that never existed. Every CONSTANT_NAME
  a comment under experiments/ mentions is defined (or imported) somewhere in the code, or is an environment
  variable."""
  code = [*ROOT.glob("experiments/**/*.py"), *ROOT.glob("grpo_jax/**/*.py"), *ROOT.glob("scripts/*.py")]
  defined = set()
  for path in code:
    text = path.read_text()
    defined |= set(re.findall(r"^\s*([A-Z][A-Z0-9_]+)\s*[:=]", text, re.M))
    defined |= set(re.findall(r"import .*?\b([A-Z][A-Z0-9_]+)\b", text))
  unknown = set()
  for path in ROOT.glob("experiments/**/*.py"):
    for line in path.read_text().splitlines():
      if "#" in line:
        for name in re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b", line.split("#", 1)[1]):
          if name not in defined and not name.startswith(("WANDB_", "JAX_", "XLA_")):
            unknown.add(f"{path.relative_to(ROOT)}: {name}")
  assert not unknown


def test_a_shared_run_is_one_process_that_every_seed_reads(tmp_path):
  fake = fakes.study().runs[0].command
  runs = (spec.Run("start", {"level": 0.01}, command=fake, shared=True),
          spec.Run("rl", {"level": 0.02, "start_from": "{run:start}"}, command=fake))
  jobs = plan_lib.plan(spec.Study("s", "x", runs, ()), "full", [1, 2], tmp_path)
  # seed 0's start is planned although only seeds 1 and 2 were asked for; no start of their own
  assert sorted(j.key for j in jobs) == [("rl", 1), ("rl", 2), ("start", 0)]
  start = next(j for j in jobs if j.run.name == "start")
  assert start.directory.name == "seed0" and start.waits_for == []
  for job in (j for j in jobs if j.run.name == "rl"):
    assert f"--start_from={start.directory}" in job.argv and f"--seed={job.seed}" in job.argv
    assert job.waits_for == [("start", 0)]
  # sharing is part of what a run computes: not the per-seed run's directory
  per_seed = plan_lib.plan(spec.Study("s", "x", (dataclasses.replace(runs[0], shared=False), runs[1]), ()),
                           "full", [1], tmp_path)
  assert start.directory.parent != next(j for j in per_seed if j.run.name == "start").directory.parent
  with pytest.raises(plan_lib.StudyError, match="cannot read a seed's own runs"):
    plan_lib.plan(spec.Study("s", "x", (runs[1], dataclasses.replace(runs[0], flags={"x": "{run:rl}"})), ()),
                  "full", [0], tmp_path)
  with pytest.raises(plan_lib.StudyError, match="cannot read"):
    plan_lib.plan(spec.Study("s", "x", (dataclasses.replace(runs[0], flags={"out": "o{seed}"}),), ()), "full",
                  [0], tmp_path)
  with pytest.raises(ValueError, match="cannot be tuned"):
    spec.Run("start", {}, shared=True, tune=spec.Tune((1, 2)))

