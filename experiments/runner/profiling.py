"""A window of stage-2 steps under `jax.profiler`, and what its trace says per compiled program.

`--profile_steps=FIRST:LAST` traces steps FIRST to LAST (both included) into `<work_dir>/profile`, a directory that
TensorBoard's profile plugin and Perfetto (`*.trace.json.gz`) open, and prints one row per compiled program: how
often it ran in the window, its span and summed op time per run, and the op kinds it spent that time in. The
Python tracer is off: it slows a step by 2x on a CPU, and the per-program figures are the device's.

    python -m experiments.grpo_math --profile_steps=5:8 --steps=8 --work_dir=/tmp/profiled
    python scripts/profile_summary.py /tmp/profiled/profile     # the table again, or of any jax.profiler trace
"""

import bisect
import collections
import dataclasses
import gzip
import json
import pathlib
import re
import sys

import jax

from experiments.runner import config as config_lib

# Run-time options of the trace: the host's XLA op events and the device's, no Python function events.
_HOST_TRACER_LEVEL = 2
_PYTHON_TRACER_LEVEL = 0


class StepTracer:
  """Traces the steps of `--profile_steps` that a run takes: starts `jax.profiler` before the first (FIRST, or the
  first after a resumed checkpoint) and stops it after LAST, whose results the loop has fetched, so that its device
  work is in the trace; then reports `format_table(summarize(...))`. As a context manager, it stops a trace that
  the run leaves open (an error, `--stop_after`)."""

  def __init__(self, spec: str, out_dir: pathlib.Path, report=None):
    self.window = config_lib.profile_window(spec)
    if self.window and jax.process_count() > 1:  # each process traces its own host and devices
      out_dir = pathlib.Path(out_dir) / f"process_{jax.process_index()}"
    self.out_dir, self.first, self.active = pathlib.Path(out_dir), None, False
    self.report = report or (lambda text: print(text, file=sys.stderr))

  def before(self, step: int) -> None:
    if self.window and self.first is None and self.window[0] <= step <= self.window[1]:
      options = jax.profiler.ProfileOptions()
      options.host_tracer_level, options.python_tracer_level = _HOST_TRACER_LEVEL, _PYTHON_TRACER_LEVEL
      self.out_dir.mkdir(parents=True, exist_ok=True)
      jax.profiler.start_trace(str(self.out_dir), profiler_options=options)
      self.first, self.active = step, True

  def after(self, step: int) -> None:
    if self.active and step >= self.window[1]:
      self.close()
      where = f"profile of steps {self.first}-{step} in {self.out_dir}"
      try:  # the trace is written; a summary that fails to read it does not stop the run
        table = format_table(summarize(self.out_dir), steps=step - self.first + 1)
      except (OSError, ValueError) as err:
        self.report(f"{where}; no summary: {err}")
        return
      self.report(f"{where} (TensorBoard's profile plugin, or Perfetto on its trace.json.gz):\n{table}")

  def close(self) -> None:
    if self.active:
      jax.profiler.stop_trace()
      self.active = False

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


@dataclasses.dataclass(frozen=True)
class ProgramProfile:
  """One compiled program's XLA op events in a trace.

  Attributes:
    name: its HLO module (`jit_step`: a train step; `jit__sample_impl`: the sampler; ...).
    runs: its executions (on an accelerator, its XLA Modules events; on the host, distinct run ids, 0 when the
      events carry none).
    span_ms: mean time from its first op's start to its last op's end, per run (0 without run ids); on an
      accelerator, its XLA Modules events' mean duration.
    op_ms: the summed durations of its op events, per run (per trace without run ids). Ops that overlap (two
      threads of a CPU, streams of a GPU) each count, and work an op hands to a thread pool after its event
      ends does not: a program can show more or less op time than span.
    kinds: (op kind, share of op_ms) by share, largest first; a kind is an HLO op name without its number
      (`ynn_fusion.21` -> `ynn_fusion`).
  """
  name: str
  runs: int
  span_ms: float
  op_ms: float
  kinds: tuple[tuple[str, float], ...]


def trace_file(trace_dir: pathlib.Path) -> pathlib.Path:
  """The newest `*.trace.json.gz` under a `jax.profiler` log directory (or the file itself)."""
  trace_dir = pathlib.Path(trace_dir)
  if trace_dir.is_file():
    return trace_dir
  found = sorted(trace_dir.glob("**/*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
  if not found:
    raise FileNotFoundError(f"{trace_dir}: no *.trace.json.gz (a jax.profiler log directory holds one under "
                            f"plugins/profile/<run>/)")
  return found[-1]


# Lines (threads) of an accelerator's process in a trace (xprof's derived timelines): one event per run of a
# program, named `<hlo module>(<program id>)`, and one per HLO op it ran; a GPU's kernels are also on its stream lines.
MODULES_LINE, OPS_LINE = "XLA Modules", "XLA Ops"


def _names(events, kind: str) -> dict:
  """pid (process_name) or (pid, tid) (thread_name) -> the name its metadata event gives."""
  out = {}
  for e in events:
    if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == kind and isinstance(e.get("args"), dict):
      out[e.get("pid") if kind == "process_name" else (e.get("pid"), e.get("tid"))] = str(e["args"].get("name", ""))
  return out


def _kernel_kind(name: str) -> str:
  """A GPU kernel's op kind: its fusion's name without the number (`gemm_fusion_dot_12` -> `gemm_fusion_dot`);
  cuBLAS's kernels by family and types (`cublas_nvjet_tst`, `cublas_gemm_f32f32_tf32f32_f32`: TF32 products)."""
  if name.startswith("nvjet_"):
    return "cublas_nvjet_" + (name.split("_")[2] if name.count("_") >= 2 else "")
  gemm = re.search(r"xmma_gemm_(\w+?)_[nt][nt]_", name)
  if gemm:
    return f"cublas_gemm_{gemm.group(1)}"
  return re.sub(r"[._]\d+$", "", name)


def _program(name: str, spans: list, evs: list, kind) -> ProgramProfile:
  total = sum(float(e.get("dur", 0.0)) for e in evs)
  kinds = collections.Counter()
  for e in evs:
    kinds[kind(e)] += float(e.get("dur", 0.0))
  runs = max(len(spans), 1)
  return ProgramProfile(name=name, runs=len(spans), span_ms=sum(b - a for a, b in spans) / runs / 1e3,
                 op_ms=total / runs / 1e3,
                 kinds=tuple((k, v / total if total else 0.0) for k, v in kinds.most_common()))


def _launches(events, device_pids: set) -> dict:
  """Program name -> sorted start times of the host's launches of it (PjRt's `... Execute (<module>)` events, or
  XLA GPU's `ExecuteThunks` with a module_name), the runs of a trace without an XLA Modules line."""
  named = collections.defaultdict(list)
  thunks = collections.defaultdict(list)
  for e in events:
    if not (isinstance(e, dict) and e.get("ph") == "X" and e.get("pid") not in device_pids):
      continue
    args, name = e.get("args") if isinstance(e.get("args"), dict) else {}, str(e.get("name", ""))
    if name.startswith("CommonPjRtLoadedExecutable::Execute (") and "name" in args:
      named[str(args["name"])].append(float(e["ts"]))
    elif name.endswith("ExecuteThunks") and "module_name" in args:
      thunks[str(args["module_name"])].append(float(e["ts"]))
  return {k: sorted(v) for k, v in {**thunks, **named}.items()}


def _device_programs(events) -> tuple[list[ProgramProfile], set]:
  """The programs of the accelerators' processes (`/device:GPU:0`, `/device:TPU:0`, ...). With xprof's derived
  lines, each event of the XLA Modules line is a run (its span), and the ops of the XLA Ops line (or, without one,
  of the stream lines) that start inside it are its ops. Without them (a GPU trace as jax writes it: only stream
  lines, each kernel's args naming its `hlo_module`), a program's ops are its kernels and memory copies, its runs
  the host's launches of it, each kernel in the run of the last launch before it. Returns (programs, the
  accelerators' pids)."""
  processes, threads = _names(events, "process_name"), _names(events, "thread_name")
  pids = {pid for pid, name in processes.items() if name.startswith("/device:") and "CPU" not in name}
  runs = collections.defaultdict(list)  # program -> [(start, end)]
  ops = collections.defaultdict(list)  # pid -> [event]
  kernels = collections.defaultdict(list)
  for e in events:
    if not (isinstance(e, dict) and e.get("ph") == "X" and e.get("pid") in pids):
      continue
    line = threads.get((e["pid"], e.get("tid")), "")
    if line == MODULES_LINE:
      runs[(e["pid"], re.sub(r"\(\d+\)$", "", str(e.get("name", ""))))].append(
          (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))))
    elif line == OPS_LINE:
      ops[e["pid"]].append(e)
    elif line.startswith("Stream"):
      kernels[e["pid"]].append(e)
  by_program = collections.defaultdict(lambda: ([], []))  # name -> (spans, op events)
  for (pid, name), spans in runs.items():
    spans.sort()
    by_program[name][0].extend(spans)
    for e in ops[pid] or kernels[pid]:
      ts = float(e["ts"])
      i = bisect.bisect_right(spans, (ts, float("inf"))) - 1
      if i >= 0 and spans[i][0] <= ts < spans[i][1]:
        by_program[name][1].append(e)
  programs = [_program(name, spans, evs, lambda e: re.sub(r"\.\d+$", "", str(e.get("name", ""))))
              for name, (spans, evs) in by_program.items()]
  # Devices without an XLA Modules line: their stream lines' kernels, by the module their args name.
  launches = None
  for pid in pids - {pid for pid, _ in runs}:
    named = collections.defaultdict(list)
    for e in kernels[pid]:
      if isinstance(e.get("args"), dict) and "hlo_module" in e["args"]:
        named[str(e["args"]["hlo_module"])].append(e)
    if named and launches is None:
      launches = _launches(events, pids)
    for name, evs in named.items():
      starts = launches.get(name, [])
      per_run = collections.defaultdict(list)
      for e in evs:  # the run of the last launch before the kernel (a kernel before any launch: the first run)
        per_run[max(bisect.bisect_right(starts, float(e["ts"])) - 1, 0)].append(e)
      spans = sorted((min(float(e["ts"]) for e in r), max(float(e["ts"]) + float(e.get("dur", 0.0)) for e in r))
                     for r in per_run.values())
      programs.append(_program(name, spans, evs, lambda e: _kernel_kind(str(e.get("name", "")))))
  return programs, pids


def summarize(trace_dir) -> list[ProgramProfile]:
  """The programs of a trace, by total op time, largest first.

  On an accelerator (a GPU's or TPU's process), from its XLA Modules and XLA Ops lines (`_device_programs`); on the
  host, XLA op events are those whose args name an `hlo_module` and an `hlo_op` (the CPU's thunks), grouped by
  module and by run id. Host op events of a program that an accelerator ran (its launches) are left out. With
  several accelerators, a program's runs are those of all of them.
  """
  path = trace_file(trace_dir)
  try:
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
  except (OSError, EOFError, ValueError, KeyError, TypeError) as err:
    raise ValueError(f"{path}: not a readable trace ({type(err).__name__}: {err})") from None
  programs, device_pids = _device_programs(events)
  on_device = {p.name for p in programs}
  ops = collections.defaultdict(list)
  for e in events:
    args = e.get("args") if isinstance(e, dict) else None
    if (isinstance(args, dict) and e.get("ph") == "X" and "hlo_module" in args and "hlo_op" in args
        and e.get("pid") not in device_pids and args["hlo_module"] not in on_device):
      ops[args["hlo_module"]].append(e)
  for name, evs in ops.items():
    by_run = collections.defaultdict(list)
    for e in evs:
      if "run_id" in e["args"]:
        by_run[e["args"]["run_id"]].append(e)
    runs = len(by_run)
    total = sum(float(e.get("dur", 0.0)) for e in evs)
    kinds = collections.Counter()
    for e in evs:
      kinds[re.sub(r"\.\d+$", "", str(e["args"]["hlo_op"]))] += float(e.get("dur", 0.0))
    spans = [max(e["ts"] + e.get("dur", 0.0) for e in r) - min(e["ts"] for e in r) for r in by_run.values()]
    programs.append(ProgramProfile(
        name=name, runs=runs, span_ms=sum(spans) / runs / 1e3 if runs else 0.0,
        op_ms=total / max(runs, 1) / 1e3,
        kinds=tuple((k, v / total if total else 0.0) for k, v in kinds.most_common())))
  return sorted(programs, key=lambda p: -p.op_ms * max(p.runs, 1))


def format_table(programs: list[ProgramProfile], steps: int | None = None, top: int = 4,
                 min_share: float = 0.001) -> str:
  """A Markdown table of `summarize`'s programs that hold at least `min_share` of the trace's op time (the rest,
  such as a runner's eager ops, summed in a last line); with `steps`, each program's op time per traced step too."""
  total = lambda p: p.op_ms * max(p.runs, 1)
  everything = sum(map(total, programs)) or 1.0
  shown = [p for p in programs if total(p) >= min_share * everything]
  rest = [p for p in programs if total(p) < min_share * everything]
  head = ("| program | runs | span ms/run | op ms/run |" + (" op ms/step |" if steps else "") +
          " where the op time went |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for p in shown:
    where = ", ".join(f"{k} {100 * share:.0f}%" for k, share in p.kinds[:top])
    per_step = f" {total(p) / steps:.1f} |" if steps else ""
    lines.append(f"| {p.name} | {p.runs} | {p.span_ms:.1f} | {p.op_ms:.1f} |{per_step} {where} |")
  if rest:
    lines.append(f"\n{len(rest)} more programs below {100 * min_share:g}% of the op time each: "
                 f"{sum(map(total, rest)):.1f} ms of op time in all")
  return "\n".join(lines)
