"""`--profile_steps`' window and the per-program summary of a `jax.profiler` trace: on hand-made traces, and on a
real GPU's (tests/data/h100_tiny_grpo_step.trace.json.gz: one GRPO step of a 2-layer bf16 model on an H100, jax
0.11.2, written by `scripts/gpu_check.py fixture`).

A real CPU run's trace is read in test_grpo_math's resume test (the resumed steps run under the profiler).
"""

import gzip
import importlib.util
import json
import pathlib

import pytest

from experiments.runner import config as config_lib
from experiments.runner import profiling

_SCRIPT = pathlib.Path(__file__).resolve().parents[3] / "scripts" / "profile_summary.py"
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


def _meta(kind, pid, name, tid=None):
  return {"ph": "M", "name": kind, "pid": pid, **({"tid": tid} if tid is not None else {}), "args": {"name": name}}


def _x(name, pid, tid, ts, dur, **args):
  return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_summary_of_a_synthetic_gpu_and_tpu_trace(tmp_path):
  """Synthetic, built to the structure xprof's derived timelines have (not what jax 0.11 writes on a GPU: see
  test_summary_of_a_real_gpu_trace): each device a process `/device:GPU:0` or `/device:TPU:0` whose derived lines are "XLA
  Modules" (one event per run of a program, named `module(program id)`) and "XLA Ops" (one event per op), a GPU's
  kernels also on its stream lines, with the module and op in their args; the host's launches name them too."""
  trace = _write(tmp_path, [
      _meta("process_name", 1, "/host:CPU"), _meta("thread_name", 1, "python3", tid=1),
      _meta("process_name", 2, "/device:GPU:0 (NVIDIA H100 80GB HBM3)"),
      _meta("thread_name", 2, "Stream #13(Compute)", tid=1), _meta("thread_name", 2, "XLA Modules", tid=2),
      _meta("thread_name", 2, "XLA Ops", tid=3), _meta("thread_name", 2, "Steps", tid=4),
      _meta("process_name", 3, "/device:TPU:0"), _meta("thread_name", 3, "XLA Modules", tid=1),
      _meta("thread_name", 3, "XLA Ops", tid=2),
      # GPU: jit_step twice (0-7000, 20000-23000 us), the sampler once (10000-15000 us).
      _x("jit_step(42)", 2, 2, 0, 7000, run_id=11), _x("jit_step(42)", 2, 2, 20000, 3000, run_id=12),
      _x("jit__sample_impl(7)", 2, 2, 10000, 5000, run_id=13),
      _x("gemm_fusion_dot.525", 2, 3, 100, 4000), _x("loop_add_fusion.3", 2, 3, 4200, 2000),
      _x("gemm_fusion_dot.525", 2, 3, 20100, 2500), _x("input_reduce_fusion.9", 2, 3, 10100, 4000),
      _x("1", 2, 4, 0, 23000),  # a step marker: not an op
      # The same kernels on the stream line (counted once, through the XLA Ops line), and the host's launches.
      _x("gemm_fusion_dot_525_kernel", 2, 1, 100, 4000, hlo_module="jit_step", hlo_op="gemm_fusion_dot.525"),
      _x("ThunkExecutor", 1, 1, 50, 30, hlo_module="jit_step", hlo_op="gemm_fusion_dot.525"),
      # A program the host ran: its thunks.
      _x("convert.1", 1, 1, 30000, 200, hlo_module="jit_convert", hlo_op="convert.1", run_id="r1"),
      # TPU: one run of jit_train_step, an op outside any run (not counted).
      _x("jit_train_step(3)", 3, 1, 0, 10000, run_id=5),
      _x("fusion.12", 3, 2, 0, 6000), _x("convolution.4", 3, 2, 6000, 3000), _x("fusion.13", 3, 2, 12000, 50),
  ])
  programs = {p.name: p for p in profiling.summarize(trace)}
  assert list(programs) == ["jit_train_step", "jit_step", "jit__sample_impl", "jit_convert"]  # 9, 8.5, 4, 0.2 ms
  step = programs["jit_step"]
  assert (step.runs, step.span_ms, step.op_ms) == (2, 5.0, 4.25)  # spans (7 + 3) / 2; ops (4 + 2 + 2.5) / 2
  assert [(k, round(v, 4)) for k, v in step.kinds] == [("gemm_fusion_dot", round(6.5 / 8.5, 4)),
                                                        ("loop_add_fusion", round(2 / 8.5, 4))]
  sample = programs["jit__sample_impl"]
  assert (sample.runs, sample.span_ms, sample.op_ms, sample.kinds) == (1, 5.0, 4.0, (("input_reduce_fusion", 1.0),))
  tpu = programs["jit_train_step"]
  assert (tpu.runs, tpu.span_ms, tpu.op_ms) == (1, 10.0, 9.0)
  assert [k for k, _ in tpu.kinds] == ["fusion", "convolution"]
  assert (programs["jit_convert"].runs, programs["jit_convert"].op_ms) == (1, 0.2)


_GPU_TRACE = pathlib.Path(__file__).resolve().parents[2] / "data" / "h100_tiny_grpo_step.trace.json.gz"


def test_summary_of_a_real_gpu_trace():
  """A GPU trace as jax writes it has no XLA Modules or XLA Ops line: only stream lines whose kernels' args name
  their module (also inside CUDA graphs, where the op is the command buffer), and the host's launches. Each
  program's op time is checked against the raw events, its runs against the host's launch events."""
  events = json.loads(gzip.decompress(_GPU_TRACE.read_bytes()))["traceEvents"]
  (gpu,) = [e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
            and e["args"]["name"] == "/device:GPU:0"]
  raw_us = {}
  for e in events:
    if e.get("ph") == "X" and e["pid"] == gpu and "hlo_module" in e.get("args", {}):
      raw_us[e["args"]["hlo_module"]] = raw_us.get(e["args"]["hlo_module"], 0.0) + e["dur"]
  launches = sum(e.get("ph") == "X" and e["name"] == "CommonPjRtLoadedExecutable::Execute (jit_broadcast_in_dim)"
                 for e in events)
  programs = profiling.summarize(_GPU_TRACE)
  assert [p.name for p in programs[:3]] == ["jit__sample_impl", "jit_step", "jit_chunked"]  # sample, update, score
  assert len(programs) == len(raw_us) == 27  # every module with a kernel, nothing from the host's lines
  for p in programs:
    assert p.op_ms * p.runs == pytest.approx(raw_us[p.name] / 1e3, rel=1e-9), p.name
  by_name = {p.name: p for p in programs}
  assert (by_name["jit_step"].runs, by_name["jit__sample_impl"].runs) == (1, 1)
  assert by_name["jit_broadcast_in_dim"].runs == launches == 21
  sample = by_name["jit__sample_impl"]
  assert sample.kinds[0][0] == "gemm_fusion_dot" and 0.25 < sample.kinds[0][1] < 0.4  # 32% of 0.68 ms
  assert 1.0 < sample.span_ms < 2.0 and sample.op_ms < sample.span_ms  # 8 decode steps: gaps between kernels
  table = profiling.format_table(programs, steps=1)
  assert table.splitlines()[2].startswith("| jit__sample_impl | 1 | 1.5 | 0.7 | 0.7 | gemm_fusion_dot 32%")


@pytest.mark.parametrize("kernel,kind", [
    ("gemm_fusion_dot_12", "gemm_fusion_dot"), ("input_reduce_fusion", "input_reduce_fusion"),
    ("loop_add_fusion.3", "loop_add_fusion"), ("nvjet_sm90_tst_128x160_64x5_1x2_h_bz_NNT", "cublas_nvjet_tst"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize256x128x32_warpgroupsize2x1x1_execute_segment_k_on_kernel__5x"
     "_cublas", "cublas_gemm_f32f32_tf32f32_f32"),
    ("MemcpyD2D", "MemcpyD2D")])
def test_gpu_kernel_kinds(kernel, kind):
  assert profiling._kernel_kind(kernel) == kind  # pylint: disable=protected-access


def test_gpu_kernels_from_the_stream_lines_without_an_ops_line(tmp_path):
  trace = _write(tmp_path, [
      _meta("process_name", 2, "/device:GPU:0"), _meta("thread_name", 2, "Stream #13(Compute)", tid=1),
      _meta("thread_name", 2, "Stream #14(MemcpyD2H)", tid=5), _meta("thread_name", 2, "XLA Modules", tid=2),
      _x("jit_step(42)", 2, 2, 0, 5000),
      _x("gemm_fusion_dot.525", 2, 1, 0, 3000, hlo_module="jit_step", hlo_op="gemm_fusion_dot.525"),
      _x("MemcpyD2H", 2, 5, 4000, 500),
  ])
  (step,) = profiling.summarize(trace)
  assert (step.name, step.runs, step.span_ms, step.op_ms) == ("jit_step", 1, 5.0, 3.5)
  assert [k for k, _ in step.kinds] == ["gemm_fusion_dot", "MemcpyD2H"]


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
