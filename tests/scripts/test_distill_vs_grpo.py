"""scripts/distill_vs_grpo.py: the runs it plans (the two methods differ in the objective alone), its statistics,
its scheduling with fake runners, its refusals (the comparison itself takes tens of minutes and is run by hand;
docs/train.md gives its figures)."""

import argparse
import importlib.util
import json
import pathlib
import sys

import pytest

_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "distill_vs_grpo.py"
_spec = importlib.util.spec_from_file_location("distill_vs_grpo", _SCRIPT)
dvg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dvg)


def _plan(tmp_path, seeds=3, **students):
  args = argparse.Namespace(out_dir=str(tmp_path), seeds=seeds, num_test=500, teacher_hidden_size=256,
                            teacher_layers=4, teacher_sft_examples=18000, teacher_sft_steps=800, teacher_steps=20,
                            **{**dict(steps=40, batch_size=16, group_size=8, learning_rate=1e-4), **students})
  return {r.name: r for r in dvg.plan(args)}


def test_the_methods_differ_in_the_objective_alone(tmp_path):
  runs = _plan(tmp_path)
  assert list(runs)[:3] == ["teacher_sft", "teacher", "sft"]
  tag = "steps40-batch16-group8-lr0.0001"
  assert sorted(n for n in runs if "/" in n) == [f"{m}/{tag}/seed{s}" for m in ("distill", "grpo") for s in range(3)]
  sft_policy = str(tmp_path.resolve() / "sft" / "sft_policy")
  for s in range(3):
    grpo, distill = runs[f"grpo/{tag}/seed{s}"].flags, runs[f"distill/{tag}/seed{s}"].flags
    assert distill.pop("algo") == "distill" and grpo.pop("algo") == "grpo"
    assert distill.pop("teacher_checkpoint") == str(tmp_path.resolve() / "teacher" / "final_policy")
    assert distill == grpo  # the same start, seed, steps, prompts, samples and learning rate
    assert grpo["init_checkpoint"] == sft_policy and grpo["seed"] == s and grpo["steps"] == 40
    assert runs[f"distill/{tag}/seed{s}"].needs == ("sft", "teacher") and runs[f"grpo/{tag}/seed{s}"].needs == ("sft",)
  # the teacher: the wider model, SFT then GRPO from its own SFT policy, seed 0; the student's start: the defaults
  assert runs["teacher_sft"].flags["tiny_hidden_size"] == 256 and runs["teacher_sft"].flags["steps"] == 0
  assert runs["teacher"].flags["init_checkpoint"] == str(tmp_path.resolve() / "teacher_sft" / "sft_policy")
  assert runs["teacher"].flags["steps"] == 20 and runs["teacher"].needs == ("teacher_sft",)
  assert {k for k in runs["sft"].flags} == {"steps", "seed", "eval_every", "num_test", "tensorboard"}
  # another setting of the students shares the teacher and the start
  other = _plan(tmp_path, steps=100, batch_size=32, group_size=4, learning_rate=3e-4)
  assert all(other[n].flags == runs[n].flags for n in ("teacher_sft", "teacher", "sft"))
  assert other["grpo/steps100-batch32-group4-lr0.0003/seed0"].flags["learning_rate"] == 3e-4
  # every run comes after the runs it needs
  order = list(runs)
  assert all(order.index(n) < order.index(name) for name, r in runs.items() for n in r.needs)


def test_mean_standard_error_and_paired_difference_hand_computed():
  summary = lambda acc: {"final_accuracy": acc}  # noqa: E731
  summaries = {"teacher_sft": summary(0.9), "teacher": summary(0.92), "sft": summary(0.388),
               "grpo/x/seed0": summary(0.40), "grpo/x/seed1": summary(0.42), "grpo/x/seed2": summary(0.44),
               "distill/x/seed0": summary(0.50), "distill/x/seed1": summary(0.50),  # distill seed 2 missing
               "grpo/y/seed0": summary(0.1)}  # another setting's
  result = dvg.aggregate(summaries, seeds=3, tag="x")
  assert result["teacher"] == pytest.approx(92.0) and result["start"] == pytest.approx(38.8)
  # GRPO: 40, 42, 44 -> mean 42, s = 2, s.e. 2 / sqrt(3) = 1.1547
  mean, se = result["methods"]["grpo"]["mean_se"]
  assert mean == pytest.approx(42.0) and se == pytest.approx(1.1547, abs=1e-4)
  # paired on seeds 0 and 1 only: 10, 8 -> mean 9, s = sqrt(2), s.e. 1
  assert result["difference"]["per_seed"] == pytest.approx({0: 10.0, 1: 8.0})
  assert result["difference"]["mean_se"] == pytest.approx((9.0, 1.0))
  table = dvg.markdown(result, seeds=3)
  assert "| GRPO | 40.0 | 42.0 | 44.0 | 42.0 ± 1.2 |" in table
  assert "| distill − GRPO (paired) | 10.0 | 8.0 |  | 9.0 ± 1.0 |" in table
  one = dvg.markdown(dvg.aggregate(summaries, seeds=1, tag="x"), seeds=1)  # one seed: no standard error
  assert "| GRPO | 40.0 | 40.0 |" in one and "nan" not in one


_FAKE = """import json, pathlib, sys
work, config, fail = pathlib.Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3] == "1"
work.mkdir(parents=True, exist_ok=True)
if fail:
  sys.exit(1)
(work / "summary.json").write_text(json.dumps({"final_accuracy": 0.5, "config": config}))
"""


def _fake_runner(monkeypatch, fail=()):
  """Each run becomes a process that writes a summary.json with its flags as config and final accuracy 0.5 (the
  runs named in `fail` exit 1 instead)."""

  def argv(run, out_dir):
    config = json.dumps({k: str(v) for k, v in run.flags.items()})
    return [sys.executable, "-c", _FAKE, str(out_dir.resolve() / run.name), config, "1" if run.name in fail else "0"]

  monkeypatch.setattr(dvg, "argv", argv)
  monkeypatch.setattr(dvg.time, "sleep", lambda s: None)


_TAG = "steps40-batch16-group8-lr0.0001"


def test_a_failed_teacher_blocks_the_distillation_runs_only(tmp_path, monkeypatch):
  _fake_runner(monkeypatch, fail=("teacher",))
  assert dvg.main([f"--out_dir={tmp_path}", "--seeds=2", "--parallel=2"]) == 1
  results = tmp_path / f"results-{_TAG}.json"
  status = json.loads(results.read_text())["status"]
  assert status == {"teacher_sft": "done", "teacher": "failed", "sft": "done", f"grpo/{_TAG}/seed0": "done",
                    f"grpo/{_TAG}/seed1": "done", f"distill/{_TAG}/seed0": "blocked",
                    f"distill/{_TAG}/seed1": "blocked"}
  # the same command again: the finished runs are kept, the failed one runs again (and now succeeds)
  _fake_runner(monkeypatch)
  assert dvg.main([f"--out_dir={tmp_path}", "--seeds=2"]) == 0
  status = json.loads(results.read_text())["status"]
  assert [n for n, s in status.items() if s == "cached"] == ["teacher_sft", "sft", f"grpo/{_TAG}/seed0",
                                                             f"grpo/{_TAG}/seed1"]
  assert "| distill − GRPO (paired) | 0.0 | 0.0 | 0.0 ± 0.0 |" in (tmp_path / f"results-{_TAG}.md").read_text()
  # another setting reuses the teacher and the start, and runs its own students
  assert dvg.main([f"--out_dir={tmp_path}", "--seeds=1", "--steps=60"]) == 0
  status = json.loads((tmp_path / "results-steps60-batch16-group8-lr0.0001.json").read_text())["status"]
  assert status == {"teacher_sft": "cached", "teacher": "cached", "sft": "cached",
                    "grpo/steps60-batch16-group8-lr0.0001/seed0": "done",
                    "distill/steps60-batch16-group8-lr0.0001/seed0": "done"}


def test_a_run_made_with_other_flags_is_refused(tmp_path, monkeypatch, capsys):
  _fake_runner(monkeypatch)
  assert dvg.main([f"--out_dir={tmp_path}", "--seeds=1"]) == 0
  assert dvg.main([f"--out_dir={tmp_path}", "--seeds=1", "--teacher_steps=30"]) == 2
  err = capsys.readouterr().err.strip()
  assert "\n" not in err and "teacher/summary.json: made with other flags (--steps=20 not 30)" in err


@pytest.mark.parametrize("flag", ["--seeds=0", "--steps=0", "--parallel=0", "--teacher_steps=0"])
def test_bad_arguments_are_one_line(tmp_path, capsys, flag):
  assert dvg.main([f"--out_dir={tmp_path}", flag]) == 2
  err = capsys.readouterr().err.strip()
  assert err == f"{flag}: must be at least 1" and not any(tmp_path.iterdir())


def test_a_stop_stops_the_runs_in_flight(tmp_path, monkeypatch):
  # SIGTERM exits through SystemExit, Ctrl-C through KeyboardInterrupt: either way the runs in flight get SIGTERM
  # (the runner saves its step) and are waited for, none left running
  started = []
  popen = dvg.subprocess.Popen

  def record(*args, **kwargs):
    started.append(popen(*args, **kwargs))
    return started[-1]

  monkeypatch.setattr(dvg, "argv", lambda run, out_dir: [sys.executable, "-c", "import time; time.sleep(60)"])
  monkeypatch.setattr(dvg.subprocess, "Popen", record)

  def stop(seconds):
    raise KeyboardInterrupt

  monkeypatch.setattr(dvg.time, "sleep", stop)
  with pytest.raises(KeyboardInterrupt):
    dvg.main([f"--out_dir={tmp_path}", "--seeds=1", "--parallel=2"])
  assert len(started) == 2 and all(p.returncode == -15 for p in started)  # teacher_sft and sft, terminated
