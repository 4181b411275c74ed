"""experiments.reproduce: a study of two tiny runs end to end, skip on rerun, failures, mean ± s.e."""

import dataclasses
import json
import math
import pathlib
import re
import signal
import subprocess
import sys
import time

from absl import flags as absl_flags
import numpy as np
import pytest

from experiments import grpo_math
from experiments import reproduce
from experiments import studies
from experiments import cli
from experiments import sample_eval
from experiments.runner import config as config_lib
from experiments.runner import evaluation as runner_evaluation
from experiments.runner import task as task_lib
from experiments.studies import spec
from experiments.studies import verdicts
from grpo_jax import models
from tests.conftest import HANG_GUARD_S

ROOT = pathlib.Path(__file__).resolve().parent.parent

# A fake runner: writes a curve and a summary whose numbers depend on the seed and a --level flag, counts its
# invocations, and fails with a last log line when --fail is given.
FAKE_RUNNER = r"""
import json, pathlib, sys
args = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "1") for a in sys.argv[1:])
work = pathlib.Path(args["work_dir"]); work.mkdir(parents=True, exist_ok=True)
with open(work.parent / "invocations.txt", "a") as f:
    f.write(f"{args['seed']}\n")
if "fail" in args:
    print("progress 1/2\rstep 2: error: the loss is nan", file=sys.stderr); sys.exit(3)
seed, level = int(args["seed"]), float(args.get("level", 0))
start = 0.1 * seed
if "start_from" in args:
    start = json.loads((pathlib.Path(args["start_from"]) / "summary.json").read_text())["final_accuracy"]
with open(work / "metrics.jsonl", "w") as f:
    for step in (0, 5, 10):
        f.write(json.dumps({"step": step, "eval/accuracy": start + level * step}) + "\n")
    f.write(json.dumps({"step": 10, "eval/accuracy": start + level * 10 + 0.01}) + "\n")  # a resumed step again
summary = {"start_accuracy": start, "final_accuracy": start + level * 10 + 0.01, "num_eval_problems": 8,
           "maj@1": 0.1, "maj@2": 0.2}
if "num_validation" in args:  # a validation accuracy that peaks at --level=0.02
    summary["final_val_accuracy"] = 0.5 - abs(level - 0.02) * 10 + 0.001 * seed
(work / "summary.json").write_text(json.dumps(summary))
"""


def _study(fail: bool = False) -> spec.Study:
  fake = (sys.executable, "-c", FAKE_RUNNER)
  runs = (spec.Run("base", {"level": 0.01}, command=fake, label="base method"),
          spec.Run("better", {"level": 0.02, "start_from": "{run:base}", "fail": fail or None}, command=fake),
          spec.Run("after", {"level": 0.0, "start_from": "{run:better}"}, command=fake))
  metrics = (spec.Metric("accuracy", "eval/accuracy", source="curve"),
             spec.Metric("final", "final_accuracy"),
             spec.Metric("gain", "final_accuracy", minus="start_accuracy"),
             spec.Metric("maj@{k}", "maj@{k}", ks=(1, 2), runs=("base",)))
  plots = (spec.Plot("curve.png", (spec.Panel("accuracy"),)),
           spec.Plot("k.png", (spec.Panel("maj@{k}"),), x="k"),
           spec.Plot("bars.png", (spec.Panel(("final", "gain")),), x="run"))
  return spec.Study("tiny", "Two tiny runs", runs, metrics, plots,
                    profiles={"quick": {"experiments.grpo_math": {"shorter": True}}},
                    claims=(spec.Claim("better gains", "better", "gain"),))


def _cells(results):
  return {(c["run"], c["metric"], c["step"]): c for c in results["cells"]}


def test_mean_se_by_hand():
  mean, se = reproduce.mean_se([0.40, 0.46, 0.43])
  assert mean == pytest.approx(0.43)
  # deviations -0.03, 0.03, 0: sample variance 0.0018 / 2 = 0.0009; s.e. = sqrt(0.0009 / 3)
  assert se == pytest.approx(math.sqrt(0.0009 / 3))
  assert reproduce.mean_se([0.5]) == (0.5, None)
  with pytest.raises(ValueError):
    reproduce.mean_se([])


def test_aggregation_of_hand_made_summaries(tmp_path):
  study = spec.Study("hand", "Hand-made", (spec.Run("grpo"), spec.Run("rft", {"algo": "rft"})),
                     (spec.Metric("final", "final_accuracy"),
                      spec.Metric("gain", "final_accuracy", minus="start_accuracy"),
                      spec.Metric("acc", "eval/accuracy", source="curve", runs=("grpo",))))
  jobs = reproduce.plan(study, "full", [0, 1, 2, 3], tmp_path)
  finals = {"grpo": [0.40, 0.46, 0.43, None], "rft": [0.30, 0.34, 0.32, 0.36]}
  for job in jobs:
    final = finals[job.run.name][job.seed]
    if final is None:
      continue  # seed 3 of grpo did not finish: its cells have three seeds
    job.directory.mkdir(parents=True)
    job.summary.write_text(json.dumps({"final_accuracy": final, "start_accuracy": 0.30}))
    (job.directory / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"step": s, "eval/accuracy": v}) for s, v in
                  [(0, 0.30), (100, 0.1), (100, final - 0.05), (200, final)]) + "\n{\"step\": 2")
  cells = {(c["run"], c["metric"], c["step"]): c for c in reproduce.collect(study, jobs)}
  grpo = cells[("grpo", "final", None)]
  assert grpo["seeds"] == [0, 1, 2] and grpo["n"] == 3
  assert grpo["values"] == [0.40, 0.46, 0.43]
  assert grpo["mean"] == pytest.approx(0.43) and grpo["se"] == pytest.approx(math.sqrt(0.0009 / 3))
  rft = cells[("rft", "final", None)]
  assert rft["mean"] == pytest.approx(0.33)
  # (0.03^2 + 0.01^2 + 0.01^2 + 0.03^2) / 3 = 0.002 / 3; s.e. = sqrt(that / 4)
  assert rft["se"] == pytest.approx(math.sqrt(0.002 / 3 / 4))
  assert cells[("rft", "gain", None)]["values"] == pytest.approx([0.0, 0.04, 0.02, 0.06])
  # the curve: every logged step, the last record of a step that was logged twice (a resumed run)
  assert cells[("grpo", "acc", 100)]["values"] == pytest.approx([0.35, 0.41, 0.38])
  assert cells[("grpo", "acc", 0)]["se"] == pytest.approx(0.0)
  assert ("rft", "acc", 100) not in cells
  table = "\n".join(reproduce.tables(study, list(cells.values())))
  assert "| grpo | 43.0 ± 1.7 (3) |" in table


def _recorded_figures(monkeypatch) -> dict:
  """Every figure `reproduce.draw` saves, by file name (its axes keep the drawn data after it is closed)."""
  from matplotlib import figure
  figures, real = {}, figure.Figure.savefig

  def savefig(self, path, *args, **kwargs):
    figures[pathlib.Path(path).name] = self
    return real(self, path, *args, **kwargs)

  monkeypatch.setattr(figure.Figure, "savefig", savefig)
  return figures


def test_study_end_to_end_skip_on_rerun_and_failures(tmp_path, monkeypatch):
  out, runs_dir = tmp_path / "out", tmp_path / "runs"
  lines = []
  figures = _recorded_figures(monkeypatch)
  results = reproduce.reproduce(_study(), profile="full", seeds=[0, 1], out_dir=out, runs_dir=runs_dir,
                                echo=lines.append)
  assert results["invocation"]["ran"] == 6 and not results["failures"]
  cells = _cells(results)
  assert cells[("base", "accuracy", 10)]["values"] == pytest.approx([0.11, 0.21])  # the step's last record
  assert cells[("base", "accuracy", 10)]["se"] == pytest.approx(0.05)
  # "better" starts where "base" ended, seed by seed; "after" where "better" ended
  assert cells[("better", "final", None)]["values"] == pytest.approx([0.32, 0.42])
  assert cells[("after", "gain", None)]["values"] == pytest.approx([0.01, 0.01])
  assert cells[("base", "maj@2", None)]["k"] == 2 and ("better", "maj@2", None) not in cells
  for name in ("results.json", "results.md", "curve.png", "k.png", "bars.png"):
    assert (out / name).is_file() and (out / name).stat().st_size > 0
  assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  # The plots draw the cells' means, in percent: each run's curve over steps 0, 5, 10, base's maj@k over k = 1, 2,
  # and bars of final then gain for base, better, after.
  pct = lambda key: 100 * cells[key]["mean"]  # noqa: E731
  curve = {line.get_label(): line for line in figures["curve.png"].axes[0].get_lines()}
  assert sorted(curve) == ["after (n=2)", "base method (n=2)", "better (n=2)"]
  for run, label in (("base", "base method"), ("better", "better"), ("after", "after")):
    np.testing.assert_allclose(curve[f"{label} (n=2)"].get_xdata(), [0, 5, 10])
    np.testing.assert_allclose(curve[f"{label} (n=2)"].get_ydata(), [pct((run, "accuracy", s)) for s in (0, 5, 10)])
  assert pct(("base", "accuracy", 10)) == pytest.approx(16.0)  # (0.11 + 0.21) / 2
  k_lines = figures["k.png"].axes[0].get_lines()
  assert len(k_lines) == 1 and list(k_lines[0].get_xdata()) == [1, 2]
  np.testing.assert_allclose(k_lines[0].get_ydata(), [pct(("base", "maj@1", None)), pct(("base", "maj@2", None))])
  heights = [bar.get_height() for bar in figures["bars.png"].axes[0].patches]
  runs = ("base", "better", "after")
  np.testing.assert_allclose(heights, [pct((r, m, None)) for m in ("final", "gain") for r in runs])
  on_disk = json.loads((out / "results.json").read_text())
  assert on_disk["cells"] == json.loads(json.dumps(results["cells"]))
  assert {"study", "run", "metric", "step", "seeds", "values", "mean", "se"} <= set(on_disk["cells"][0])
  text = (out / "results.md").read_text()
  assert "base method" in text and "![curve](curve.png)" in text and "| step 0 | step 5 | step 10 |" in text
  # better gains 0.21 on both seeds (from base's 0.11 and 0.21 to 0.32 and 0.42)
  assert ("| better gains | better, gain | 21.0 ± 0.0 (2) | **undecided** (every seed alike on 2 seeds: 3 or more "
          "decide; 2 s.e. interval [+21.0, +21.0]) |") in text
  assert (out / "runs" / "better" / "seed1" / "summary.json").is_file()

  # Rerun: every summary exists, nothing runs; a third seed runs only seed 2.
  invocations = lambda: sorted(p.read_text().split() for p in runs_dir.glob("*/invocations.txt"))
  before = invocations()
  results = reproduce.reproduce(_study(), profile="full", seeds=[0, 1], out_dir=out, runs_dir=runs_dir,
                                echo=lines.append)
  assert results["invocation"]["ran"] == 0 and results["invocation"]["cached"] == 6
  assert invocations() == before
  results = reproduce.reproduce(_study(), profile="full", seeds=[0, 1, 2], out_dir=out, runs_dir=runs_dir,
                                echo=lines.append)
  assert results["invocation"]["ran"] == 3 and _cells(results)[("base", "final", None)]["n"] == 3

  # Another profile adds flags, so other directories: nothing is reused by mistake.
  quick = reproduce.plan(_study(), "quick", [0], runs_dir)
  assert "--shorter" in quick[0].argv and quick[0].argv[-2:] == ["--seed=0", f"--work_dir={quick[0].directory}"]
  assert not any(j.summary.is_file() for j in quick)


def test_failed_run_is_reported_and_does_not_stop_the_others(tmp_path):
  lines = []
  results = reproduce.reproduce(_study(fail=True), profile="full", seeds=[0, 1], out_dir=tmp_path / "out",
                                runs_dir=tmp_path / "runs", parallel=2, echo=lines.append)
  failures = {(f["run"], f["seed"]): f for f in results["failures"]}
  assert set(failures) == {("better", 0), ("better", 1), ("after", 0), ("after", 1)}
  assert failures[("better", 0)]["status"] == "failed"
  assert failures[("better", 0)]["message"] == "exit 3: step 2: error: the loss is nan"
  assert failures[("after", 1)]["status"] == "blocked"
  assert _cells(results)[("base", "final", None)]["n"] == 2  # the independent run finished on both seeds
  assert "step 2: error: the loss is nan" in (tmp_path / "out" / "results.md").read_text()
  assert any("failed" in line and "the loss is nan" in line for line in lines)


def test_plan_hashes_flags_and_dependencies(tmp_path):
  study = _study()
  a = reproduce.plan(study, "full", [0], tmp_path)
  b = reproduce.plan(study, "full", [0], tmp_path)
  assert [j.directory for j in a] == [j.directory for j in b]
  changed = spec.Study("tiny", "x", (spec.Run("base", {"level": 0.5}, command=study.runs[0].command),) +
                       study.runs[1:], study.metrics)
  c = reproduce.plan(changed, "full", [0], tmp_path)
  # base changed, and so did the runs that read it
  assert all(x.directory != y.directory for x, y in zip(a, c))
  assert f"--start_from={a[0].directory}" in a[1].argv
  with pytest.raises(reproduce.StudyError, match="cycle"):
    reproduce.plan(spec.Study("loop", "x", (spec.Run("a", {"x": "{run:b}"}), spec.Run("b", {"x": "{run:a}"})), ()),
                   "full", [0], tmp_path)
  with pytest.raises(reproduce.StudyError, match="no profile"):
    reproduce.plan(study, "medium", [0], tmp_path)
  with pytest.raises(reproduce.StudyError, match="set by reproduce"):
    reproduce.plan(spec.Study("s", "x", (spec.Run("a", {"seed": 3}),), ()), "full", [0], tmp_path)


def test_a_changed_runner_default_means_new_run_directories(tmp_path, monkeypatch):
  study = spec.Study("defaults", "x", (spec.Run("sft", {"steps": 0}), spec.Run("rl", {"init": "{run:sft}/p"}),
                                       spec.Run("flow", {}, module=spec.FLOW_GRPO)), ())
  before = reproduce.plan(study, "full", [0], tmp_path)
  assert before[0].directory != before[2].directory  # another runner, other defaults
  real = config_lib.Config
  monkeypatch.setattr(config_lib, "Config", lambda: real().replace(sft_steps=123))
  after = reproduce.plan(study, "full", [0], tmp_path)
  # the runs that read the changed default (directly, or through the run they start from) move; Flow-GRPO sets
  # its own sft_steps, so its run stays
  assert [x.directory != y.directory for x, y in zip(before, after)] == [True, True, False]
  # where the run settings are not results (the work dir, the compilation cache), nothing moves
  monkeypatch.setattr(config_lib, "Config", lambda: real().replace(compilation_cache_dir="/elsewhere", work_dir="w"))
  assert [j.directory for j in reproduce.plan(study, "full", [0], tmp_path)] == [j.directory for j in before]


def test_a_new_flag_keeps_finished_runs_and_a_new_revision_moves_them(tmp_path, monkeypatch):
  """Only defaults that differ from the committed snapshot enter the hash: adding a flag (whose default keeps the
  old behaviour) leaves run directories in place; rewriting the snapshot (a numerics change) moves every run."""
  study = spec.Study("defaults", "x", (spec.Run("sft", {"steps": 0}), spec.Run("flow", {}, module=spec.FLOW_GRPO)),
                     ())
  snapshot = tmp_path / "runner_defaults.json"
  monkeypatch.setattr(reproduce, "DEFAULTS_SNAPSHOT", snapshot)
  assert reproduce.write_defaults_snapshot() == 1
  before = [j.directory for j in reproduce.plan(study, "full", [0], tmp_path)]
  real = config_lib.Config

  class WithANewFlag:
    def flat(self):
      return {**real().flat(), "brand_new_flag": 7}

  monkeypatch.setattr(config_lib, "Config", WithANewFlag)
  assert [j.directory for j in reproduce.plan(study, "full", [0], tmp_path)] == before
  monkeypatch.setattr(config_lib, "Config", real)
  assert reproduce.write_defaults_snapshot() == 2
  after = [j.directory for j in reproduce.plan(study, "full", [0], tmp_path)]
  assert all(a != b for a, b in zip(before, after))
  snapshot.write_text("{}")
  with pytest.raises(reproduce.StudyError, match="not a defaults snapshot"):
    reproduce.plan(study, "full", [0], tmp_path)


def test_the_committed_defaults_snapshot_is_a_snapshot():
  snapshot = reproduce.read_defaults_snapshot()
  for module in (spec.GRPO_MATH, spec.FLOW_GRPO):
    missing = set(snapshot[module]) - set(reproduce.runner_defaults(spec.Run("x", {}, module=module)))
    # a flag removed since the snapshot: its behaviour is now fixed in code, so the revision must move
    assert not missing, f"flags gone since the snapshot: {missing}; run --write_defaults_snapshot"


def test_json_spec_from_the_command_line(tmp_path):
  """`--study=file.json`: the same study as data, through the CLI; --dry_run runs nothing."""
  study = {"name": "tiny_json", "title": "From JSON",
           "runs": [{"name": "only", "flags": {"level": 0.03}, "command": [sys.executable, "-c", FAKE_RUNNER]}],
           "metrics": [{"name": "final", "key": "final_accuracy"}],
           "plots": [{"file": "bars.png", "x": "run", "panels": [{"metric": ["final"]}]}]}
  path = tmp_path / "study.json"
  path.write_text(json.dumps(study))
  base = [sys.executable, "-m", "experiments.reproduce", f"--study={path}", "--seeds=2", "--profile=full",
          f"--out_dir={tmp_path / 'out'}", f"--runs_dir={tmp_path / 'runs'}"]
  dry = subprocess.run(base + ["--dry_run"], cwd=ROOT, capture_output=True, text=True)
  assert dry.returncode == 0, dry.stderr
  assert "--level=0.03 --seed=1" in dry.stdout and not (tmp_path / "out").exists()
  done = subprocess.run(base, cwd=ROOT, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr
  results = json.loads((tmp_path / "out" / "results.json").read_text())
  assert results["cells"][0]["values"] == pytest.approx([0.31, 0.41]) and (tmp_path / "out" / "bars.png").is_file()


def test_registered_studies_are_well_formed(tmp_path):
  """Every study plans in every profile; its runs name real runners; plots name metrics it has."""
  assert {"paradigm", "majk_passk", "iterative", "variants", "flow_grpo", "headline"} <= set(studies.STUDIES)
  for study in studies.STUDIES.values():
    names = {n for m in study.metrics for n, *_ in m.expand()} | {m.name for m in study.metrics}
    for plot in study.plots:
      for panel in plot.panels:
        assert set(panel.metrics) <= names, (study.name, plot.file, panel.metrics)
    for profile in ["full", *study.profiles]:
      jobs = reproduce.plan(study, profile, [0, 1], tmp_path)
      runs = study.runs_in(profile)  # and a tuned run's grid on its tuning seeds (here 0 and 1)
      assert len(jobs) == 2 * len(runs) + sum(len(r.tune.values) * r.tune.seeds for r in runs if r.tune)
      for job in jobs:
        assert (ROOT / (job.run.module.replace(".", "/") + ".py")).is_file(), job.run.module


def test_registered_study_flags_parse(tmp_path):
  """Each runner accepts every flag of every study and profile: absl parses them with the runners' validators
  in one child process (nothing runs), and no run passes a flag that only another runner defines."""
  commands = []
  for study in studies.STUDIES.values():
    for profile in ["full", *study.profiles]:
      commands += [[job.run.module] + [a.replace("{tuned}", "0.001") for a in job.argv[3:]]  # a tuned lr
                   for job in reproduce.plan(study, profile, [0], tmp_path)]
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


def test_sample_eval_reports_every_power_of_two(tmp_path, monkeypatch):
  """studies.sample_eval: Maj@k and unbiased Pass@k for k = 1, 2, 4 from one set of 4 samples per problem
  (completions injected, so the numbers are worked out by hand, whatever the tiny model would say)."""
  ks_up_to = runner_evaluation.ks_up_to
  assert ks_up_to(64) == [1, 2, 4, 8, 16, 32, 64] and ks_up_to(6) == [1, 2, 4, 6]
  policy = models.build_default_checkpoint(tmp_path / "policy", seed=0, num_hidden_layers=1, hidden_size=32,
                                           intermediate_size=96)
  calls = []

  def fake_generate(params, config, tokenizer, prompts, key, *, greedy=False, num_samples=1, **kwargs):
    answers = [e.answer for e in task_examples]
    right, wrong = (lambda i: f"#### {answers[i]}"), (lambda i: f"#### {int(answers[i]) + 1}")
    calls.append((greedy, num_samples, len(prompts)))
    if greedy:  # problem 0 right, problem 1 wrong
      return [[right(0)], [wrong(1)]], np.array([6, 6])
    # problem 0: r r w r (maj right at every k); problem 1: w w w r (maj wrong at every k)
    return [[right(0), right(0), wrong(0), right(0)], [wrong(1), wrong(1), wrong(1), right(1)]], np.array([6] * 8)

  absl_flags.FLAGS.unparse_flags()
  absl_flags.FLAGS(["sample_eval", f"--init_checkpoint={policy}", f"--work_dir={tmp_path / 'out'}", "--num_test=2",
                    "--num_train=20", "--eval_samples=4", "--tensorboard=false"])
  cfg = cli.config_from_flags()
  task_examples = task_lib.Task(cfg.task, models.load_tokenizer(policy), sft_lineage=False, seed=cfg.run.seed).test
  monkeypatch.setattr(runner_evaluation.evaluation, "generate", fake_generate)
  try:
    summary = sample_eval.run(cli.config_from_flags())
  finally:
    absl_flags.FLAGS.unparse_flags()
  assert calls == [(True, 1, 2), (False, 4, 2)]
  assert summary["ks"] == [1, 2, 4] and summary["accuracy"] == 0.5
  # pass@k = 1 - C(n-c, k) / C(n, k) per problem, n = 4, c = 3 and 1
  assert summary["pass@1"] == pytest.approx((3 / 4 + 1 / 4) / 2)
  assert summary["pass@2"] == pytest.approx((1.0 + (1 - 3 / 6)) / 2)
  assert summary["pass@4"] == pytest.approx(1.0)
  assert [summary[f"maj@{k}"] for k in (1, 2, 4)] == [0.5, 0.5, 0.5]
  assert json.loads((tmp_path / "out" / "summary.json").read_text())["pass@2"] == pytest.approx(0.75)


def test_contrasts_and_changes_are_paired_by_seed(tmp_path):
  """A contrast is a − b seed by seed on the seeds both have; since_start subtracts each seed's first step."""
  study = spec.Study("pairs", "Paired", (spec.Run("a", {"x": 1}), spec.Run("b", {"x": 2})),
                     (spec.Metric("final", "final_accuracy"),
                      spec.Metric("change", "eval/accuracy", source="curve", since_start=True)),
                     contrasts=(spec.Contrast("a", "b", "final"),))
  jobs = reproduce.plan(study, "full", [0, 1, 2], tmp_path)
  finals = {"a": [0.50, 0.80, 0.61], "b": [0.40, 0.75, None]}  # b's seed 2 is missing
  for job in jobs:
    final = finals[job.run.name][job.seed]
    if final is None:
      continue
    job.directory.mkdir(parents=True)
    job.summary.write_text(json.dumps({"final_accuracy": final}))
    (job.directory / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "eval/accuracy": final - 0.1}) + "\n" + json.dumps({"step": 5, "eval/accuracy": final}))
  cells = {(c["run"], c["metric"], c["step"]): c for c in reproduce.collect(study, jobs)}
  diff = cells[("a - b", "final", None)]
  assert diff["seeds"] == [0, 1] and diff["values"] == pytest.approx([0.10, 0.05]) and diff["contrast"]
  assert diff["mean"] == pytest.approx(0.075) and diff["se"] == pytest.approx(0.025)
  assert cells[("a", "change", 5)]["values"] == pytest.approx([0.1, 0.1, 0.1])
  assert cells[("a", "change", 0)]["values"] == [0.0, 0.0, 0.0]
  assert "| a - b | final | end | 7.5 ± 2.5 (2) |" in "\n".join(reproduce.tables(study, list(cells.values())))


def test_claims_are_decided_from_their_cells(tmp_path):
  """a - b = 10, 5 and 9 points over 3 seeds, +8.0 ± 1.5: 5.2 s.e. above zero (a claimed rise: reproduced; a
  claimed non-change: contradicted); a's change at its last step is +10 ± 0 (every seed alike); a claim on a run
  nobody ran: not run."""
  claims = (spec.Claim("a beats b", "a - b", "final"), spec.Claim("a equals b", "a - b", "final", "="),
            spec.Claim("a rises", "a", "change"), spec.Claim("b falls", "b", "change", "<"))
  study = spec.Study("pairs", "Paired", (spec.Run("a", {"x": 1}), spec.Run("b", {"x": 2})),
                     (spec.Metric("final", "final_accuracy"),
                      spec.Metric("change", "eval/accuracy", source="curve", since_start=True)),
                     contrasts=(spec.Contrast("a", "b", "final"),), claims=claims)
  jobs = reproduce.plan(study, "full", [0, 1, 2], tmp_path)
  for job in jobs:
    if job.run.name == "a":
      final = [0.50, 0.80, 0.61][job.seed]
      job.directory.mkdir(parents=True)
      job.summary.write_text(json.dumps({"final_accuracy": final}))
      (job.directory / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/accuracy": final - 0.1}) + "\n"
                                                   + json.dumps({"step": 5, "eval/accuracy": final}))
  for job in jobs:  # b: finals only
    if job.run.name == "b":
      job.directory.mkdir(parents=True)
      job.summary.write_text(json.dumps({"final_accuracy": [0.40, 0.75, 0.52][job.seed]}))
  out = reproduce.decide_claims(study, reproduce.collect(study, jobs))
  assert [(v["verdict"], v.get("cell")) for v in out] == [
      ("reproduced", "8.0 ± 1.5 (3)"), ("contradicted", "8.0 ± 1.5 (3)"), ("reproduced", "10.0 ± 0.0 (3)"),
      ("not run", None)]
  assert out[0]["detail"] == "5.2 s.e.; 2 s.e. interval [+4.9, +11.1]" and out[2]["step"] == 5
  with pytest.raises(ValueError, match="claim 'x'"):
    spec.Study("s", "x", (spec.Run("a", {}),), (spec.Metric("final", "final_accuracy"),),
               claims=(spec.Claim("x", "a - b", "final"),))


def test_every_papers_study_states_its_claims():
  for name in ("paradigm", "majk_passk", "iterative", "flow_grpo"):
    study = reproduce.load_study(name)
    assert any(c.expect for c in study.claims), name


def test_claims_table_reads_quick_and_full_pages(tmp_path):
  """The README's table: each claim against the committed quick page and, where it exists, the full one (its
  verdict decided again from the cells); a study without pages reads "not yet"."""
  quick = json.loads((reproduce.PAGES / "paradigm" / "results.json").read_text())
  (tmp_path / "paradigm" / "full").mkdir(parents=True)
  (tmp_path / "paradigm" / "results.json").write_text(json.dumps(quick))
  full = [dict(c) for c in quick["cells"] if c["run"] == "grpo - rft" and c["metric"] == "final"]
  full[0].update(n=5, seeds=[0, 1, 2, 3, 4], values=[0.01, 0.03, 0.02, 0.04, 0.05], mean=0.03, se=0.007)
  (tmp_path / "paradigm" / "full" / "results.json").write_text(json.dumps({"cells": full}))
  q = {c["run"]: c for c in quick["cells"] if c["metric"] == "final" and c["step"] is None}
  rows = {line.split(" | ")[0][2:]: line for line in reproduce.claims_table(tmp_path).split("\n\n")[0].splitlines()[2:]}
  m, s = 100 * q["grpo - rft"]["mean"], 100 * q["grpo - rft"]["se"]
  assert rows["Fig 5: GRPO+OS > RFT"] == (f"| Fig 5: GRPO+OS > RFT | {m:.1f} ± {s:.1f} (3 seeds): **contradicted** | "
                                         "3.0 ± 0.7 (5 seeds): **reproduced** | full: 4.3 s.e. |")
  assert "** | not yet | quick: " in rows["Fig 5: GRPO+PS > GRPO+OS"]  # no full cell: the quick one speaks
  flat = "Fig 7: Pass@64 stays flat (within ±3 points)"
  assert rows[flat] == f"| {flat} | not yet | not yet | - |"
  # a no-change claim with a margin: +1.1 ± 0.1 is 19 s.e. from zero but inside ±3 points; on 2 seeds, no verdict
  (tmp_path / "majk_passk" / "full").mkdir(parents=True)
  page = lambda values: {"cells": [  # noqa: E731
      {"run": "after - before", "metric": "pass@64", "step": None, "percent": True, "n": len(values),
       "seeds": list(range(len(values))), "values": values, "mean": sum(values) / len(values),
       "se": reproduce.mean_se(values)[1]}]}
  (tmp_path / "majk_passk" / "full" / "results.json").write_text(json.dumps(page([0.010, 0.012, 0.011])))
  rows = {line.split(" | ")[0][2:]: line for line in reproduce.claims_table(tmp_path).split("\n\n")[0].splitlines()[2:]}
  assert rows[flat] == (f"| {flat} | not yet | 1.1 ± 0.1 (3 seeds): **consistent** | full: [+1.0, +1.2] at 2 s.e., "
                        "inside ±3.0 |")
  (tmp_path / "majk_passk" / "full" / "results.json").write_text(json.dumps(page([0.010, 0.012])))
  rows = {line.split(" | ")[0][2:]: line for line in reproduce.claims_table(tmp_path).split("\n\n")[0].splitlines()[2:]}
  assert rows[flat] == (f"| {flat} | not yet | 1.1 ± 0.1 (2 seeds): **undecided** | full: 2 seeds, too few to decide "
                        "(11.0 s.e.; [+0.9, +1.3] at 2 s.e.) |")


def test_redecide_rewrites_only_the_verdicts(tmp_path):
  """`--redecide`: a page whose stored verdict is stale gets today's, in results.json and in its Verdicts section;
  the rest of results.md stays as it ran; a page from before verdicts gets the section before its first table."""
  src = reproduce.PAGES / "paradigm" / "full"
  (tmp_path / "paradigm" / "full").mkdir(parents=True)
  page = json.loads((src / "results.json").read_text())
  today = reproduce.decide_claims(reproduce.load_study("paradigm"), page["cells"])
  stale = json.loads(json.dumps(today, default=str))
  stale[0].update(verdict="reproduced", detail="a stale verdict")
  md = (src / "results.md").read_text().replace(f"**{today[0]['verdict']}** ({today[0]['detail']})",
                                                "**reproduced** (a stale verdict)")
  assert "a stale verdict" in md
  (tmp_path / "paradigm" / "full" / "results.json").write_text(json.dumps({**page, "verdicts": stale}))
  (tmp_path / "paradigm" / "full" / "results.md").write_text(md)
  old_page = {k: v for k, v in page.items() if k != "verdicts"}  # the quick page's layout, before verdicts
  (tmp_path / "paradigm" / "results.json").write_text(json.dumps(old_page))
  (tmp_path / "paradigm" / "results.md").write_text("# t\n\nintro\n\n**held-out** by step\n\n| a |\n")
  assert reproduce.redecide_pages(tmp_path) == [tmp_path / "paradigm", tmp_path / "paradigm" / "full"]
  assert (tmp_path / "paradigm" / "full" / "results.md").read_text() == (src / "results.md").read_text()
  assert json.loads((tmp_path / "paradigm" / "full" / "results.json").read_text())["verdicts"] == json.loads(
      json.dumps(today, default=str))
  lines = (tmp_path / "paradigm" / "results.md").read_text().split("\n")
  assert lines[:5] == ["# t", "", "intro", "", "## Verdicts"] and lines[-4:] == ["**held-out** by step", "", "| a |", ""]
  assert len(lines) == 4 + 4 + 2 + len(today) + 1 + 4
  assert reproduce.redecide_pages(tmp_path) == []  # nothing stale now


def test_committed_pages_carry_todays_verdicts():
  """Each committed page's verdicts are its cells decided by today's claims and rules (`reproduce --redecide`)."""
  for name, study in studies.STUDIES.items():
    for page_dir in reproduce.page_dirs(reproduce.PAGES, name, study):
      if (page_dir / "results.json").is_file():
        page = json.loads((page_dir / "results.json").read_text())
        today = json.loads(json.dumps(reproduce.decide_claims(study, page["cells"], page.get("profile")),
                                      default=str))
        assert page.get("verdicts", []) == today, f"{page_dir}: stale verdicts; run `reproduce --redecide`"
        for v in today:
          assert f"| **{v['verdict']}** ({v['detail']}) |" in (page_dir / "results.md").read_text(), page_dir


SLEEPER = r"""
import pathlib, signal, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if "=" in a)
work = pathlib.Path(args["work_dir"]); work.mkdir(parents=True, exist_ok=True)
def saved(signum, frame):
    (work / "saved").write_text(signal.Signals(signum).name); sys.exit(128 + signum)
signal.signal(signal.SIGTERM, saved)
(work / "started").write_text("")
time.sleep(60)
"""


def test_sigterm_stops_reproduce_and_the_runs_in_flight_save(tmp_path):
  """SIGTERM to reproduce (a preempted machine; in the background, where SIGINT is ignored, the signal that
  reaches it): the run in flight gets SIGTERM and saves, reproduce waits for it, says so in one line and exits
  143; no later run starts."""
  study = {"name": "sleepy", "title": "Sleeps",
           "runs": [{"name": "nap", "flags": {}, "command": [sys.executable, "-c", SLEEPER]}],
           "metrics": [{"name": "final", "key": "final_accuracy"}]}
  path = tmp_path / "study.json"
  path.write_text(json.dumps(study))
  proc = subprocess.Popen([sys.executable, "-m", "experiments.reproduce", f"--study={path}", "--seeds=2",
                           "--profile=full", f"--out_dir={tmp_path / 'out'}", f"--runs_dir={tmp_path / 'runs'}"],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + HANG_GUARD_S
  while not list(tmp_path.glob("runs/*/seed0/started")) and time.time() < deadline:
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=HANG_GUARD_S)
  assert proc.returncode == 143, err
  assert err.strip().splitlines()[-1] == ("reproduce: stopped by SIGTERM; nap seed 0 saved where they were and "
                                          "continue when the same command runs again")
  assert [p.read_text() for p in tmp_path.glob("runs/*/seed0/saved")] == ["SIGTERM"]
  assert not list(tmp_path.glob("runs/*/seed1"))  # seed 1 never started


def _designed_study() -> spec.Study:
  """The fake runner's base and better under a design: better - base = level 0.02 vs 0.01 over 10 steps plus the
  start (better starts where base ended): +0.21 points on every seed."""
  study = _study()
  claims = (spec.Claim("better beats base", "better - base", "final", margin=0.03),
            spec.Claim("base rises", "base", "gain"))
  return spec.Study("tiny", "Two tiny runs", study.runs[:2], study.metrics, (), profiles=study.profiles,
                    contrasts=(spec.Contrast("better", "base", "final"),), claims=study.claims,
                    designs={"quick": spec.Design(claims, seeds=8, note="a test")})


def test_a_design_runs_from_one_commit_and_is_decided_by_its_rule(tmp_path, monkeypatch):
  out, runs_dir = tmp_path / "out", tmp_path / "runs"
  study = _designed_study()
  lines = []
  results = reproduce.reproduce(study, profile="quick", seeds=list(range(6)), out_dir=out, runs_dir=runs_dir,
                                echo=lines.append, commit="a" * 40)
  # 6 of the 8 declared seeds: no verdict yet, on any claim
  assert [v["verdict"] for v in results["verdicts"]] == ["pending", "pending"]
  assert results["rule"] == "t-holm" and results["commit"] == "a" * 40
  assert results["design"]["seeds"] == 8 and results["design"]["claims"][0]["margin"] == 0.03
  records = [json.loads(p.read_text()) for p in runs_dir.glob("*/seed0.run.json")]
  assert len(records) == 2 and {r["commit"] for r in records} == {"a" * 40}
  # the commit is in the runs' hash: the full profile's runs (no design) are other directories
  assert {j.directory for j in reproduce.plan(study, "quick", [0], runs_dir, "a" * 40)}.isdisjoint(
      {j.directory for j in reproduce.plan(study, "quick", [0], runs_dir)})
  # 10 seeds: the verdicts read seeds 0-7 only (better - base = +0.21 and base gains +0.11 on every seed)
  results = reproduce.reproduce(study, profile="quick", seeds=list(range(10)), out_dir=out, runs_dir=runs_dir,
                                echo=lines.append, commit="a" * 40)
  v = {x["claim"]: x for x in results["verdicts"]}
  assert v["better beats base"]["n"] == 8 and v["better beats base"]["verdict"] == "reproduced"
  assert v["base rises"]["verdict"] == "reproduced"
  text = (out / "results.md").read_text()
  assert "## Design" in text and "Every run on this page comes from commit `aaaaaaaaaaaa`" in text
  assert "| better beats base | better - base, final | above zero | ±3.0 points |" in text
  assert "decided by the design's rule: Student-t p-values" in text

  # a run that reports another commit (its code changed under it): the table is refused, in one line
  job = next(j for j in reproduce.plan(study, "quick", [3], runs_dir, "a" * 40) if j.run.name == "better")
  summary = json.loads(job.summary.read_text())
  job.summary.write_text(json.dumps({**summary, "code_version": "a" * 40 + "-dirty"}))
  with pytest.raises(reproduce.StudyError, match=r"from one commit, aaaaaaaaaaaa, and these are not from it: "
                                                 r"aaaaaaaaaaaa-dirty: 1 run \(better seed 3\)"):
    reproduce.reproduce(study, profile="quick", seeds=list(range(8)), out_dir=out, runs_dir=runs_dir,
                        echo=lines.append, commit="a" * 40, aggregate_only=True)

  # HEAD with uncommitted changes: a design does not start
  monkeypatch.setattr(reproduce, "head_commit", lambda root=None: "b" * 40 + "-dirty")
  with pytest.raises(reproduce.StudyError, match="changed since its last commit; commit, or run from a worktree "
                                                 "pinned to a commit"):
    reproduce.reproduce(study, profile="quick", seeds=[0], out_dir=out, runs_dir=runs_dir, echo=lines.append)


def test_declaration_names_the_commit_that_last_changed_the_spec():
  study = reproduce.load_study("paradigm")
  files = reproduce.spec_files(study)
  assert files == ["experiments/studies/paradigm.py", "experiments/studies/verdicts.py"]
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
  expected = subprocess.run(["git", "log", "-1", "--format=%H", head, "--", *files], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
  declared = reproduce.declaration(study, head)
  assert declared["commit"] == expected and len(expected) == 40 and declared["date"].startswith("20")


def test_a_tuned_flag_is_chosen_on_the_validation_split_of_the_tuning_seeds(tmp_path):
  """base's --level over the grid 0.01, 0.02, 0.03 on tuning seeds 0 and 1, each with --num_validation: the fake's
  validation accuracy peaks at 0.02 (0.4, 0.5, 0.4 plus 0.001 x seed), so 0.02 is base's level on seeds 2 and 3
  (which wait for the whole grid), and the grid's 0.02 runs are base's on seeds 0 and 1; better, which starts
  from base, runs from those."""
  fake = (sys.executable, "-c", FAKE_RUNNER)
  runs = (spec.Run("base", {"num_validation": 5}, command=fake, tune=spec.Tune((0.01, 0.02, 0.03), flag="level")),
          spec.Run("better", {"level": 0.02, "start_from": "{run:base}"}, command=fake))
  study = spec.Study("tuned", "A tuned run", runs, (spec.Metric("final", "final_accuracy"),),
                     contrasts=(spec.Contrast("better", "base", "final"),))
  out, runs_dir, lines = tmp_path / "out", tmp_path / "runs", []
  jobs = reproduce.plan(study, "full", [0, 1, 2, 3], runs_dir)
  assert sorted(j.run.name for j in jobs if j.grid) == sorted(["base@0.01", "base@0.02", "base@0.03"] * 2)
  main = {j.seed: j for j in jobs if j.run.name == "base"}
  assert main[0].alias and main[1].alias and not main[2].alias and "--level={tuned}" in main[2].argv
  assert sorted(main[3].after) == sorted((f"base@{v}", s) for v in ("0.01", "0.02", "0.03") for s in (0, 1))
  results = reproduce.reproduce(study, profile="full", seeds=[0, 1, 2, 3], out_dir=out, runs_dir=runs_dir,
                                echo=lines.append)
  assert results["invocation"]["ran"] == 6 + 2 + 4 and not results["failures"]  # grid, base 2-3, better 0-3
  t = results["tuning"]["base"]
  assert t["chosen"] == 0.02 and [g["n"] for g in t["grid"]] == [2, 2, 2]
  assert [g["mean"] for g in t["grid"]] == pytest.approx([0.4005, 0.5005, 0.4005])  # 50.05 prints as 50.0
  argv = json.loads(next(j for j in jobs if j.key == ("base", 3)).record.read_text())["argv"]
  assert "--level=0.02" in argv
  cells = _cells(results)
  # base at 0.02 on every seed: 0.1 x seed + 0.2 + 0.01; seeds 0, 1 from the grid's runs, 2, 3 from its own
  assert cells[("base", "final", None)]["values"] == pytest.approx([0.21, 0.31, 0.41, 0.51])
  assert cells[("better - base", "final", None)]["values"] == pytest.approx([0.21] * 4)
  grid_dir = next(j for j in jobs if j.key == ("base@0.02", 0)).directory
  for again in (False, True):  # as run, and aggregated again by a later invocation that runs nothing
    if again:
      (out / "runs" / "base" / "seed0").unlink()
      results = reproduce.reproduce(study, profile="full", seeds=[0, 1, 2, 3], out_dir=out, runs_dir=runs_dir,
                                    echo=lines.append, aggregate_only=True)
    assert (out / "runs" / "base" / "seed0").resolve() == grid_dir  # the tuning seed's run: the grid's at 0.02
    assert "--level=0.02" in results["runs"]["base"]["command_seed0"], results["runs"]["base"]["command_seed0"]
  text = (out / "results.md").read_text()
  assert "| base | --level | 0.01: 40.1 ± 0.1 (2); 0.02: 50.0 ± 0.1 (2); 0.03: 40.1 ± 0.1 (2) | **0.02** |" in text
  # no validation split: refused in one line
  bad = spec.Study("t", "t", (spec.Run("base", {}, command=fake, tune=spec.Tune((1, 2), flag="level")),),
                   (spec.Metric("final", "final_accuracy"),))
  bad = dataclasses.replace(bad, runs=(dataclasses.replace(bad.runs[0], command=()),))
  with pytest.raises(reproduce.StudyError, match="needs --num_validation"):
    reproduce.plan(bad, "full", [0], runs_dir)


def test_claims_table_reads_a_design_page(tmp_path):
  """The README's second table: the fair design's claims against a committed <study>/fair page, decided by the
  design's rule on its declared 8 seeds; a family with a claim short of its seeds is pending throughout."""
  design = reproduce.load_study("paradigm").designs["fair"]

  def cell(run, metric, values):
    mean, se = reproduce.mean_se(values)
    return {"run": run, "metric": metric, "step": None, "percent": True, "n": len(values),
            "seeds": list(range(len(values))), "values": values, "mean": mean, "se": se}

  big = [0.10, 0.12, 0.11, 0.13, 0.09, 0.10, 0.12, 0.11]  # +11.0 ± 0.5 points: far from zero
  flat = [0.001, -0.002, 0.0, 0.002, -0.001, 0.001, 0.0, -0.001]  # +0.0 ± 0.0: inside ±3 points
  cells = [cell(c.run, c.metric, flat if c.run == "fair_grpo_ps - fair_grpo" else big) for c in design.claims]
  (tmp_path / "paradigm" / "fair").mkdir(parents=True)
  (tmp_path / "paradigm" / "fair" / "results.json").write_text(json.dumps({"profile": "fair", "cells": cells}))
  table = reproduce.claims_table(tmp_path).split("\n\n")[1]
  rows = {line.split(" | ")[0][2:]: line for line in table.splitlines()[2:]}
  assert rows["Fig 5: GRPO+OS > Online RFT"].startswith(
      "| Fig 5: GRPO+OS > Online RFT | paradigm, fair | 11.0 ± 0.5 (8 seeds) | **reproduced**: [+9.9, +12.1] (95% t)")
  assert f"| **{verdicts.EQUAL}**: " in rows["Fig 5: GRPO+PS > GRPO+OS"]
  assert "| **reported**: no ordering claimed" in rows["Pooled RFT beside RFT (Table 10's)"]
  cells[1] = cell(cells[1]["run"], "final", big[:7])  # one claim at 7 of its 8 seeds
  (tmp_path / "paradigm" / "fair" / "results.json").write_text(json.dumps({"profile": "fair", "cells": cells}))
  table = reproduce.claims_table(tmp_path).split("\n\n")[1]
  words = [line.split("| **")[1].split("**")[0] for line in table.splitlines()[2:] if "| **" in line]
  assert words == ["pending"] * 5 + ["reported"] * 3


def test_a_page_cut_short_is_named_and_nothing_is_rewritten(tmp_path, monkeypatch, main_in_process):
  """Issue 55: `--redecide` and `--claims_table` over a results.json cut short ended in a JSONDecodeError traceback.
  Now one line names the page, and `--redecide` rewrites no page (the stale one beside it included)."""
  src = reproduce.PAGES / "paradigm" / "full"
  (tmp_path / "paradigm" / "full").mkdir(parents=True)
  page = json.loads((src / "results.json").read_text())
  stale = [dict(v, verdict="reproduced", detail="a stale verdict") for v in page["verdicts"]]
  (tmp_path / "paradigm" / "full" / "results.json").write_text(json.dumps({**page, "verdicts": stale}))
  (tmp_path / "paradigm" / "full" / "results.md").write_text((src / "results.md").read_text())
  cut = tmp_path / "paradigm" / "results.json"
  text = (reproduce.PAGES / "paradigm" / "results.json").read_text()
  for damaged, message in ((text[:len(text) // 2], "cannot read a study's results page"),
                           ("[1, 2]", "not a study's results page"),
                           ('{"runs": {}}', "not a study's results page (needs cells)")):
    cut.write_text(damaged)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(reproduce.StudyError, match=rf"^{re.escape(str(cut))}: {re.escape(message)}"):
      reproduce.redecide_pages(tmp_path)
    with pytest.raises(reproduce.StudyError, match=rf"^{re.escape(str(cut))}: "):
      reproduce.claims_table(tmp_path)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
  # the command line: one line, exit status 1
  redecide = reproduce.redecide_pages
  monkeypatch.setattr(reproduce, "redecide_pages", lambda: redecide(tmp_path))
  error = main_in_process(reproduce.main, ["reproduce", "--redecide"])
  assert error.startswith(f"reproduce: error: {cut}: ") and "\n" not in error, error


def test_a_runs_summary_cut_short_is_named(tmp_path):
  """A run's summary.json cut short: aggregation stops with one line naming it (was: the JSON error alone)."""
  study = spec.Study("hand", "Hand-made", (spec.Run("grpo"),), (spec.Metric("final", "final_accuracy"),))
  (job,) = reproduce.plan(study, "full", [0], tmp_path)
  job.directory.mkdir(parents=True)
  job.summary.write_text('{"final_accuracy": 0.4, "start_')
  with pytest.raises(reproduce.StudyError, match=rf"^{re.escape(str(job.summary))}: cannot read a run's summary"):
    reproduce.collect(study, [job])


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


def test_an_out_dir_it_cannot_write_is_one_line(tmp_path, main_in_process):
  """Issue 55's sweep: `--aggregate_only --out_dir=<a directory that cannot be made>` ended in a traceback."""
  blocked = tmp_path / "file"
  blocked.write_text("")  # a file where the directory's parent should be
  error = main_in_process(reproduce.main, ["reproduce", "--study=paradigm", "--aggregate_only",
                                           f"--runs_dir={tmp_path / 'runs'}", f"--out_dir={blocked / 'out'}"])
  assert error.startswith("reproduce: error: ") and str(blocked / "out") in error and "\n" not in error, error
