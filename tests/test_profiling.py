"""`--profile_steps`' window and the per-program summary of a `jax.profiler` trace, on hand-made traces.

A real run's trace is read in test_grpo_math's resume test (the resumed steps run under the profiler).
"""

import gzip
import importlib.util
import json
import pathlib

import pytest

from experiments.runner import config as config_lib
from experiments.runner import profiling

_SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "profile_summary.py"
_spec = importlib.util.spec_from_file_location("profile_summary", _SCRIPT)
profile_summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile_summary)


@pytest.mark.parametrize("spec,window", [("", None), ("5:8", (5, 8)), ("1:1", (1, 1)), (" 2 : 3 ", (2, 3))])
def test_profile_window(spec, window):
  assert config_lib.profile_window(spec) == window


@pytest.mark.parametrize("spec", ["5", "8:5", "0:2", "a:b", "2:3:4", "-1:2"])
def test_bad_profile_window_is_one_line(spec):
  with pytest.raises(ValueError, match=r"^--profile_steps must be FIRST:LAST with 1 <= FIRST <= LAST") as err:
    config_lib.profile_window(spec)
  assert "\n" not in str(err.value)


def _op(module, op, ts, dur, run=None):
  args = {"hlo_module": module, "hlo_op": op, **({"run_id": run} if run is not None else {})}
  return {"ph": "X", "name": op, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}


def _write(tmp_path, events):
  run = tmp_path / "plugins" / "profile" / "2026_11_26_00_00_00"
  run.mkdir(parents=True)
  (run / "host.trace.json.gz").write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
  return tmp_path


def test_summary_of_a_hand_made_trace(tmp_path):
  trace = _write(tmp_path, [
      {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
      "not an event",  # what a damaged or foreign trace may hold: skipped
      {"ph": "X", "name": "PjitFunction(step)", "ts": 0, "dur": 9000, "pid": 1, "tid": 1},  # no HLO args: not an op
      _op("jit_step", "fusion.1", 0, 4000, run="r1"),  # run r1: ops over 0 ... 7000 us
      _op("jit_step", "dot.2", 1000, 6000, run="r1"),
      _op("jit_step", "fusion.3", 20000, 3000, run="r2"),  # run r2: 3000 us
      _op("jit_add", "wrapped_add", 30000, 500),  # no run id
  ])
  step, add = profiling.summarize(trace)  # by total op time: 13 ms, then 0.5 ms
  assert (step.name, step.runs, step.span_ms, step.op_ms) == ("jit_step", 2, 5.0, 6.5)  # spans (7 + 3) / 2; 13 / 2
  assert [k for k, _ in step.kinds] == ["fusion", "dot"]
  assert [round(share, 4) for _, share in step.kinds] == [round(7 / 13, 4), round(6 / 13, 4)]
  assert (add.name, add.runs, add.span_ms, add.op_ms, add.kinds) == ("jit_add", 0, 0.0, 0.5, (("wrapped_add", 1.0),))
  table = profiling.format_table([step, add], steps=2).splitlines()
  assert table[2] == "| jit_step | 2 | 5.0 | 6.5 | 6.5 | fusion 54%, dot 46% |"
  assert table[3] == "| jit_add | 0 | 0.0 | 0.5 | 0.2 | wrapped_add 100% |"
  short = profiling.format_table([step, add], min_share=0.05)  # jit_add holds 0.5 of 13.5 ms: 3.7%
  assert "jit_add" not in short and short.endswith("1 more programs below 5% of the op time each: 0.5 ms of op "
                                                   "time in all")


def test_unreadable_traces_are_one_line(tmp_path):
  with pytest.raises(FileNotFoundError, match="no \\*.trace.json.gz"):
    profiling.summarize(tmp_path)
  bad = tmp_path / "x.trace.json.gz"
  bad.write_bytes(b"not gzip")
  with pytest.raises(ValueError, match="not a readable trace") as err:
    profiling.summarize(tmp_path)
  assert "\n" not in str(err.value)


def test_the_script_prints_the_table_or_one_line(tmp_path, monkeypatch, capsys):
  trace = _write(tmp_path, [_op("jit_step", "fusion.1", 0, 4000, run="r1")])
  monkeypatch.setattr("sys.argv", ["profile_summary", str(trace), "--steps=1"])
  profile_summary.main()
  assert "| jit_step | 1 | 4.0 | 4.0 | 4.0 | fusion 100% |" in capsys.readouterr().out
  monkeypatch.setattr("sys.argv", ["profile_summary", str(tmp_path / "missing")])
  with pytest.raises(SystemExit, match="^profile_summary: error: .*missing: no \\*.trace.json.gz"):
    profile_summary.main()


def test_the_tracer_covers_the_window_from_where_a_run_starts(tmp_path, monkeypatch):
  """Steps 3-5 traced from a run resumed at step 4: the trace runs from before step 4 to after step 5; a trace
  that cannot be summarised is reported in one line, and the run goes on."""
  calls, reports = [], []
  monkeypatch.setattr(profiling.jax.profiler, "start_trace", lambda d, **kw: calls.append(("start", d)))
  monkeypatch.setattr(profiling.jax.profiler, "stop_trace", lambda: calls.append(("stop",)))
  with profiling.StepTracer("3:5", tmp_path / "profile", reports.append) as tracer:
    for step in (4, 5, 6):
      tracer.before(step)
      assert tracer.active == (step in (4, 5))
      tracer.after(step)
  assert calls == [("start", str(tmp_path / "profile")), ("stop",)]
  assert reports == [f"profile of steps 4-5 in {tmp_path / 'profile'}; no summary: {tmp_path / 'profile'}: no "
                     f"*.trace.json.gz (a jax.profiler log directory holds one under plugins/profile/<run>/)"]
  with profiling.StepTracer("3:5", tmp_path / "other", reports.append) as tracer:
    tracer.before(3)  # a run that stops inside the window (--stop_after, an error): stopped on the way out
  assert calls[-2:] == [("start", str(tmp_path / "other")), ("stop",)] and len(reports) == 1
