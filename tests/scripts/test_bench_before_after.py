"""scripts/bench_before_after.py: its summary statistics, its argument checks and the log a failed run leaves (the
timed runs themselves are measured by hand: they take minutes)."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench_before_after.py"
_spec = importlib.util.spec_from_file_location("bench_before_after", _SCRIPT)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_mean_and_standard_error_hand_computed():
  # mean 0.5; sample variance ((0.1)^2 + 0 + (0.1)^2) / 2 = 0.01; s.e. sqrt(0.01 / 3) = 0.0577
  assert bench.mean_se([0.4, 0.5, 0.6]) == "0.500 ± 0.058"
  assert bench.mean_se([0.25]) == "0.250"


@pytest.mark.parametrize("args,message", [
    (["--pairs=0"], "--pairs must be >= 1, got 0"),
    (["--baseline=no-such-revision"], "'no-such-revision' names no commit"),
    (["--logs=" + str(_SCRIPT)], "--logs=" + str(_SCRIPT) + " is a file, not a directory"),
    (["--job=ci", "--cache=warm"], "--cache=warm applies to --job=default_run only"),
])
def test_bad_arguments_are_one_line(args, message):
  done = subprocess.run([sys.executable, str(_SCRIPT), *args], capture_output=True, text=True, timeout=600,
                        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
  assert done.returncode != 0 and message in done.stderr, done.stderr[-2000:]
  assert "Traceback" not in done.stderr


def test_which_revisions_have_a_compilation_cache(tmp_path):
  assert bench.has_compilation_cache(_SCRIPT.parents[1])  # this tree's runner has `--compilation_cache_dir`
  (tmp_path / "experiments").mkdir()
  (tmp_path / "experiments" / "cli.py").write_text('flags.DEFINE_string("work_dir", "runs", "...")\n')
  assert not bench.has_compilation_cache(tmp_path)  # as at f5a4965: every run compiles
  (tmp_path / "experiments" / "cli.py").write_text('flags.DEFINE_string("compilation_cache_dir", "", "...")\n')
  assert bench.has_compilation_cache(tmp_path)


def test_a_failed_runs_output_is_kept(tmp_path):
  # An unknown runner flag fails the default run at start-up: the job stops with the run's last stderr line, and
  # the log holds the run's whole output.
  log = tmp_path / "1_candidate.log"
  with pytest.raises(SystemExit, match="failed: FATAL Flags parsing error: Unknown command line flag 'no_such_flag'"):
    bench.run_default(_SCRIPT.parents[1], tmp_path, ["--no_such_flag"], log)
  assert "Unknown command line flag 'no_such_flag'" in log.read_text()


def test_a_later_steps_parts_average_the_steps_after_the_first(tmp_path):
  # Step 1 compiles (left out); steps 2 and 3 average to (1 + 3) / 2 sampling, (2 + 4) / 2 scoring, (5 + 7) / 2
  # update; evaluation records and a record without timings are not steps.
  lines = ['{"step": 0, "eval/accuracy": 0.5}',
           '{"step": 1, "train/time_sampling": 9, "train/time_scoring": 9, "train/time_update": 9}',
           '{"step": 2, "train/time_sampling": 1, "train/time_scoring": 2, "train/time_update": 5}',
           '{"step": 2, "data/rows": 4}',
           '{"step": 3, "train/time_sampling": 3, "train/time_scoring": 4, "train/time_update": 7}']
  (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  assert bench.later_step(tmp_path / "metrics.jsonl") == {"sampling": 2.0, "scoring": 3.0, "update": 6.0}
  assert bench.later_step(tmp_path / "missing.jsonl") == {}
  (tmp_path / "one.jsonl").write_text(lines[1] + "\n")
  assert bench.later_step(tmp_path / "one.jsonl") == {}


def test_the_work_dir_wins_over_a_flagfiles(tmp_path, monkeypatch):
  # A flagfile that sets --work_dir (experiments/configs/*.cfg do) must not move the run out of the job's scratch
  # directory: the job's own --work_dir comes after the runner's flags.
  seen = {}

  def fake_run(cmd, **kwargs):
    seen["cmd"] = cmd
    return subprocess.CompletedProcess(cmd, 1, "", "stopped here")

  monkeypatch.setattr(bench.subprocess, "run", fake_run)
  with pytest.raises(SystemExit, match="failed: stopped here"):
    bench.run_default(_SCRIPT.parents[1], tmp_path, ["--flagfile=experiments/configs/flow_grpo.cfg"], None)
  flags = [a for a in seen["cmd"] if a.startswith("--")]
  assert flags[0] == "--flagfile=experiments/configs/flow_grpo.cfg" and flags[1] == f"--work_dir={tmp_path / 'run'}"
