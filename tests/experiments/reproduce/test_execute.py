"""experiments.reproduce.execute: a failed run is reported and blocks only what needs it; SIGTERM stops the
runs in flight, which save."""

import json
import shutil
import pathlib
import signal
import subprocess
import sys
import time
import types

from experiments.reproduce import execute, pipeline
from tests import reproduce_fakes as fakes
from tests.conftest import HANG_GUARD_S

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_failed_run_is_reported_and_does_not_stop_the_others(tmp_path):
  lines = []
  results = pipeline.reproduce(fakes.study(fail=True), profile="full", seeds=[0, 1], out_dir=tmp_path / "out",
                                runs_dir=tmp_path / "runs", parallel=2, echo=lines.append)
  failures = {(f["run"], f["seed"]): f for f in results["failures"]}
  assert set(failures) == {("better", 0), ("better", 1), ("after", 0), ("after", 1)}
  assert failures[("better", 0)]["status"] == "failed"
  assert failures[("better", 0)]["message"] == "exit 3: step 2: error: the loss is nan"
  assert failures[("after", 1)]["status"] == "blocked"
  assert fakes.cells(results)[("base", "final", None)]["n"] == 2  # the independent run finished on both seeds
  assert "step 2: error: the loss is nan" in (tmp_path / "out" / "results.md").read_text()
  assert any("failed" in line and "the loss is nan" in line for line in lines)


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


def _job(tmp_path, module="experiments.grpo_math", command=None, argv=("python", "-m", "experiments.grpo_math")):
  from experiments.reproduce import plan as plan_lib  # pylint: disable=import-outside-toplevel
  from experiments.studies import spec  # pylint: disable=import-outside-toplevel
  run = spec.Run("arm", {}, module=module, command=command)
  return plan_lib.Job(run=run, seed=0, directory=tmp_path / "arm" / "seed0", argv=[*argv, "--work_dir=w"], needs=[])


def test_a_run_resumes_from_stage_1_or_2_checkpoints_and_saves_its_sft_steps(tmp_path):
  from experiments.reproduce import execute  # pylint: disable=import-outside-toplevel
  job = _job(tmp_path)
  base = ["python", "-m", "experiments.grpo_math", "--work_dir=w", "--sft_save_every=250"]
  assert execute._prepare(job) == base  # a fresh run: stage 1 checkpoints every 250 steps
  for kind in ("sft_checkpoints", "checkpoints"):  # a killed run left one: it resumes, the directory kept
    (job.directory / kind / "500").mkdir(parents=True)
    assert execute._prepare(job) == base + ["--resume"] and (job.directory / kind / "500").is_dir()
    shutil.rmtree(job.directory)
  (job.directory / "sft_checkpoints").mkdir(parents=True)  # empty: nothing to resume; a fresh directory
  assert execute._prepare(job) == base and not job.directory.exists()
  # A run that sets the flag itself keeps its value; a custom command and another runner get nothing added.
  own = _job(tmp_path, argv=("python", "-m", "experiments.grpo_math", "--sft_save_every=10"))
  assert execute._prepare(own).count("--sft_save_every=10") == 1 and "--sft_save_every=250" not in execute._prepare(own)
  assert execute._prepare(_job(tmp_path, command=["python", "x.py"], argv=("python", "x.py"))) == [
      "python", "x.py", "--work_dir=w"]
  rm = _job(tmp_path, module="experiments.train_reward_model", argv=("python", "-m", "experiments.train_reward_model"))
  assert execute._prepare(rm) == ["python", "-m", "experiments.train_reward_model", "--work_dir=w"]


def test_recorded_time_and_commit_read_the_run_record_then_the_summary(tmp_path):
  """A page's wall time and code version for a run it did not run now: the record's, else the summary's time;
  None where the files are missing, cut short or silent."""
  job = types.SimpleNamespace(record=tmp_path / "seed0.run.json", summary=tmp_path / "summary.json")
  assert execute.recorded_time(job) is None and execute.recorded_commit(job) is None
  job.summary.write_text(json.dumps({"wall_time_s": 12.5}))
  assert execute.recorded_time(job) == 12.5 and execute.recorded_commit(job) is None
  job.record.write_text(json.dumps({"wall_time_s": 30, "commit": "c" * 40}))
  assert execute.recorded_time(job) == 30.0 and execute.recorded_commit(job) == "c" * 40
  job.record.write_text('{"wall_time_s": 3')  # cut short: the summary's time, no commit
  assert execute.recorded_time(job) == 12.5 and execute.recorded_commit(job) is None
  job.record.write_text(json.dumps({"commit": ""}))
  assert execute.recorded_commit(job) is None
