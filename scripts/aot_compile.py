r"""Compiles a run's programs for a TPU slice ahead of time, without a TPU and without weights, and reports
whether each fits a chip's HBM.

  python scripts/aot_compile.py --flagfile=experiments/configs/deepseekmath_gsm8k.cfg --model=qwen2.5-0.5b \
      --topology=v5e:2x4 --mesh=fsdp:8 --scan_layers
  python scripts/aot_compile.py --flagfile=experiments/configs/deepseekmath_gsm8k.cfg --model=deepseek-math-7b \
      --reward=orm --reward_model=deepseek-math-7b --topology=v5p:2x2x4 --mesh=fsdp:16 --scan_layers
  python scripts/aot_compile.py --topology=cpu --mesh=data:1           # the default run, this machine's CPU

Every flag of the runner (`experiments/grpo_math.py`) is accepted and means what it means there, so a runner
flagfile loads as it is; `--model` and `--reward_model` also take named shapes (`grpo_jax.models.presets`:
qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b, deepseek-math-7b; only the shapes matter, no weight is read) beside an HF checkpoint directory (its
config.json only; empty --model: the embedded tiny model). The script's own flags: --topology, --programs,
--hbm_gib, --json_out, --isolate.

The programs are the runner's own, from `experiments.trainer.programs.programs(config)`: the update step, the
π_ref / π_old log-prob forward, PPO's value forward, the rollouts' sampler, a learned reward model's scorer and
evaluation's samplers (with --lora_rank: the LoRA update, the frozen base its third argument, and π_ref the base;
--algo=flow_grpo, which runs on one device: the planner's turns, for the first device of --mesh), each with abstract
arguments (`jax.ShapeDtypeStruct`s carrying their shardings) at the widest shapes the runner
gives them. The real XLA compiler for the topology (libtpu, `pip install -e '.[tpu]'`) runs
`jit(...).trace(...).lower().compile()`. For each program it prints, per chip, XLA's `memory_analysis()`:
arguments, outputs, temporaries and generated code, minus the donated (aliased) bytes; then the same plus the
trees that stay resident between programs (train state, reference, reward model; with LoRA the adapters' train
state and the base once; `programs.resident`) that are not its arguments,
against the chip's HBM. FLOPs are the matmul FLOPs of the traced program with every scan and loop at its trip
count (XLA's `cost_analysis()` counts a loop body once; its figure is printed beside); "s at peak" is a step's
(or an evaluation's) FLOPs per chip over the chip's peak bf16 FLOP/s, a floor on the time. For a program with
loops it also prints its largest loop body's instructions that do work (`loop_instructions`): for a sampler over
unrolled layers, one decode step, an upper bound on the kernels it launches a token.

Exits non-zero with one line when a program does not fit in a chip's HBM, or with one line naming a bad flag.
"""

import dataclasses
import json
import math
import os
import re
import sys
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from experiments import cli
from experiments.methods import learned_reward
from experiments.runner import config as config_lib
from experiments.runner import placement as placement_lib
from experiments.runner import policy
from experiments.trainer import programs
from grpo_jax import chips
from grpo_jax import models
from grpo_jax import python_gc
from grpo_jax.chips import GiB

# Environment for loading libtpu as a compiler only, on a machine without a TPU: no lock file held
# against other JAX processes, and no TPU-VM metadata looked up (libtpu's init is quiet).
LIBTPU_ENV = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_HOSTNAMES": "localhost",
              "TPU_ACCELERATOR_TYPE": "v5litepod-1"}


class DoesNotFit(Exception):
  """A program needs more HBM per chip than the chip has."""


def quiet_libtpu() -> None:
  """Sets LIBTPU_ENV (where unset) before libtpu is first loaded."""
  for key, value in LIBTPU_ENV.items():
    os.environ.setdefault(key, value)


@dataclasses.dataclass(frozen=True)
class Target:
  """The devices to compile for, and the chip they sit on (None: the host, no HBM to check)."""
  name: str
  devices: tuple
  chip: chips.Chip | None
  devices_per_chip: int = 1

  @property
  def num_chips(self) -> int:
    return len(self.devices) // self.devices_per_chip


def target(topology: str) -> Target:
  """`cpu` (this machine's devices) or a TPU topology such as `v5e:2x4`, `v5p:2x2x1`, `v4:2x2x1`."""
  if topology == "cpu":
    return Target("cpu", tuple(jax.devices("cpu")), None)
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  quiet_libtpu()
  kwargs = {"chip_config_name": "megacore"} if topology.startswith("v4") else {}  # v4: one device per chip
  try:
    devices = topologies.get_topology_desc(topology_name=topology, platform="tpu", **kwargs).devices
  except Exception as err:  # pylint: disable=broad-except
    raise ValueError(f"cannot describe TPU topology {topology!r}: {str(err).splitlines()[0]}") from None
  kind = devices[0].device_kind
  if kind not in chips.TPUS:
    raise ValueError(f"topology {topology!r}: unknown chip {kind!r} (known: {', '.join(chips.TPUS)})")
  per_chip = len(devices) // len({tuple(d.coords) for d in devices})
  return Target(topology, tuple(devices), chips.TPUS[kind], per_chip)


# FLOPS


def matmul_flops(jaxpr, while_trips: int | tuple[int, ...] = 1) -> float:
  """2·M·N·K summed over the dot_generals of a jaxpr, each scan body times its length and each
  while body times `while_trips` (nested programs, remat and custom-derivative bodies included); a tuple gives
  the outermost while loops' trips, then those of the loops inside them (the last entry for any deeper): the
  rollout engine's phases and their steps."""
  trips = tuple(while_trips) if isinstance(while_trips, (tuple, list)) else (while_trips,)
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract)
      continue
    if name == "cond":
      total += max(matmul_flops(b.jaxpr, trips) for b in eqn.params["branches"])
      continue
    times = eqn.params["length"] if name == "scan" else trips[0] if name == "while" else 1
    inner = (trips[1:] or trips) if name == "while" else trips
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          total += times * matmul_flops(sub, inner)
  return total


_SHAPE = re.compile(r"%(\S+) = (pred|s8|u8|s16|u16|s32|u32|s64|u64|bf16|f16|f32|f64)\[([0-9,]*)\]")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
             "s64": 8, "u64": 8, "f64": 8}


def largest_arrays(hlo_text: str, n: int = 3) -> list[str]:
  """The n largest distinct array shapes defined in a compiled (per-device) HLO module, as 'dtype[dims] GiB'."""
  sizes = {}
  for _, dtype, dims in _SHAPE.findall(hlo_text):
    shape = tuple(int(d) for d in dims.split(",") if d)
    sizes[f"{dtype}[{','.join(map(str, shape))}]"] = math.prod(shape) * _ITEMSIZE[dtype]
  top = sorted(sizes.items(), key=lambda kv: -kv[1])[:n]
  return [f"{shape} {size / GiB:.2f} GiB" for shape, size in top]


_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$")
_WHILE_BODY = re.compile(r"\bwhile\(.*\bbody=%?([\w.\-]+)")
_DEFINED = re.compile(r"^(?:ROOT )?%?[\w.\-]+ = ")
_OP_NAME = re.compile(r"\s*([a-z][\w\-]*)\(")


def _opcode(line: str) -> str | None:
  """The opcode of an HLO instruction line (`%x = SHAPE opcode(...)`), past a tuple shape's nested parentheses."""
  defined = _DEFINED.match(line)
  if not defined:
    return None
  rest, depth, i = line[defined.end():], 0, 0
  if rest.startswith("("):  # a tuple shape: skip to its closing parenthesis
    for i, ch in enumerate(rest):
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth == 0:
        break
    rest = rest[i + 1:]
  else:
    rest = rest.split(" ", 1)[1] if " " in rest else ""
  op = _OP_NAME.match(rest)
  return op.group(1) if op else None
# Instructions that name, pack or reinterpret buffers and launch no work on a chip.
_NO_WORK = frozenset({"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all", "partition-id",
                      "replica-id", "opt-barrier"})


def loop_instructions(hlo_text: str) -> tuple[int, dict[str, int]]:
  """The while-loop body of a compiled HLO module with the most instructions that do work (not parameters, tuple
  packing, bitcasts or constants): their count and their opcodes' counts, most frequent first; (0, {}) without a
  loop. For a sampler over unrolled layers that body is one decode step, so the count is an upper bound on the
  kernels it launches a token (a fusion is one kernel; an async pair counts its start and its done)."""
  bodies, computations, current = set(), {}, None
  for line in hlo_text.splitlines():
    head = _COMPUTATION.match(line)
    if head:
      current = computations.setdefault(head.group(1), {})
      continue
    op = _opcode(line.strip())
    if current is None or not op:
      continue
    body = _WHILE_BODY.search(line)
    if body:
      bodies.add(body.group(1))
    if op not in _NO_WORK:
      current[op] = current.get(op, 0) + 1
  counts = [computations.get(b, {}) for b in bodies]
  if not counts:
    return 0, {}
  largest = max(counts, key=lambda c: sum(c.values()))
  return sum(largest.values()), dict(sorted(largest.items(), key=lambda kv: (-kv[1], kv[0])))


def largest_traced_arrays(jaxpr, n: int = 3) -> list[str]:
  """The n largest distinct intermediate arrays of a jaxpr (global shapes), as 'dtype[dims] GiB (global)'."""
  sizes = {}

  def visit(jaxpr):
    for eqn in jaxpr.eqns:
      for v in eqn.outvars:
        aval = getattr(v, "aval", None)
        if hasattr(aval, "shape") and hasattr(aval, "dtype"):
          try:
            sizes[f"{jnp.dtype(aval.dtype).name}[{','.join(map(str, aval.shape))}]"] = (
                math.prod(aval.shape) * jnp.dtype(aval.dtype).itemsize)
          except TypeError:  # PRNG keys
            pass
      for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
          sub = getattr(sub, "jaxpr", sub)
          if hasattr(sub, "eqns"):
            visit(sub)

  visit(jaxpr)
  top = sorted(sizes.items(), key=lambda kv: -kv[1])[:n]
  return [f"{shape} {size / GiB:.2f} GiB (global)" for shape, size in top]


# THE RUN'S SHAPES


def policy_config(model: config_lib.PolicyConfig, platform: str = "cpu"):
  """The policy's ModelConfig as the runner loads it on `platform` (`policy.model_config`), from a preset's shapes
  (`models.presets`), an HF checkpoint directory's config.json, or (empty `--model`) the embedded tiny model."""
  return policy.model_config(model, platform)


def reward_shapes(config: config_lib.Config, policy_shapes) -> programs.RewardModel | None:
  """The learned reward model's shapes and kind as the runner loads it (`learned_reward.model_config`); None with a
  rule reward."""
  found = learned_reward.model_config(config, policy_shapes)
  return programs.RewardModel(*found) if found else None


def _bytes_per_device(tree) -> int:
  """Bytes of one device's shards of a tree of sharded ShapeDtypeStructs (other leaves: none)."""
  leaves = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.ShapeDtypeStruct)]
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize for x in leaves)


# COMPILING


@dataclasses.dataclass
class Compiled:
  """One program's compiler figures, per chip."""
  name: str
  uses: str
  calls: int  # per step (or, for evaluation's programs, per evaluation)
  per: str  # "step" or "eval" (an evaluation)
  argument: int
  output: int
  alias: int
  temp: int
  code: int
  resident_other: int  # resident trees that are not this program's arguments
  flops: float  # matmul FLOPs per chip of one call, loops at their trip counts
  xla_flops: float  # XLA's cost_analysis per device (loop bodies once)
  compile_s: float
  largest: list = dataclasses.field(default_factory=list)  # the largest arrays of the compiled program
  error: str = ""  # the compiler's refusal (out of HBM); then `temp` is the compiler's figure
  loop_ops: int = 0  # instructions that do work in its largest while-loop body (`loop_instructions`)
  loop_op_kinds: dict = dataclasses.field(default_factory=dict)  # their opcodes' counts

  @property
  def program_bytes(self) -> int:
    return self.argument + self.output + self.temp + self.code - self.alias

  @property
  def peak_bytes(self) -> int:
    return self.program_bytes + self.resident_other


_OUT_OF_HBM = re.compile(r"HLO temporaries \(([0-9.]+)G\) exceeds available HBM \(([0-9.]+)G\)")


def compile_program(name: str, program, tgt: Target, total_resident: int) -> Compiled:
  """Traces, lowers and compiles one `programs.Program` for `tgt`; its figures per chip."""
  k = tgt.devices_per_chip
  t0 = time.perf_counter()
  traced = program.jitted.trace(*program.args, **program.kwargs)
  flops = matmul_flops(traced.jaxpr.jaxpr, program.loop_trips) / len(tgt.devices) * k
  common = dict(name=name, uses=program.uses, calls=program.per_step or program.per_eval or program.per_run,
                per="step" if program.per_step else "eval" if program.per_eval else "run", flops=flops,
                resident_other=total_resident - k * sum(_bytes_per_device(program.args[i])
                                                        for i in program.resident_args))
  try:
    compiled = traced.lower().compile()
  except jax.errors.JaxRuntimeError as err:
    found = _OUT_OF_HBM.search(str(err))
    if "RESOURCE_EXHAUSTED" not in str(err) or not found:
      raise
    return Compiled(**common, argument=k * _bytes_per_device(program.args), output=0, alias=0,
                    temp=int(k * float(found.group(1)) * GiB), code=0, xla_flops=0.0,
                    compile_s=time.perf_counter() - t0, largest=largest_traced_arrays(traced.jaxpr.jaxpr),
                    error=str(err).strip().splitlines()[0])
  seconds = time.perf_counter() - t0
  text = compiled.as_text()
  loop_ops, kinds = loop_instructions(text)
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return Compiled(**common, argument=k * mem.argument_size_in_bytes, output=k * mem.output_size_in_bytes,
                  alias=k * mem.alias_size_in_bytes, temp=k * mem.temp_size_in_bytes,
                  code=k * mem.generated_code_size_in_bytes, xla_flops=float((cost or {}).get("flops", 0.0)) * k,
                  compile_s=seconds, largest=largest_arrays(text), loop_ops=loop_ops, loop_op_kinds=kinds)


def compile_programs(config, tgt: Target, names: Sequence[str] = (), log=print) -> tuple[list[Compiled], dict]:
  """Compiles the run's programs (`programs.programs(config)`; `names`: only these) for `tgt`; returns their
  figures and the resident bytes per chip by tree."""
  model_config = policy_config(config.model, tgt.devices[0].platform)
  reward = reward_shapes(config, model_config)
  placement = placement_lib.Placement.from_config(config.mesh, list(tgt.devices))
  listed = programs.programs(config, model_config, placement, reward)
  unknown = [n for n in names if n not in listed]
  if unknown:
    raise ValueError(f"--programs: {', '.join(unknown)} not among this run's programs ({', '.join(listed)})")
  resident = {name: tgt.devices_per_chip * _bytes_per_device(tree)
              for name, tree in programs.resident(config, model_config, placement, reward).items()}
  out = []
  for name, program in listed.items():
    if names and name not in names:
      continue
    log(f"compiling {name} ({program.uses}) ...")
    out.append(compile_program(name, program, tgt, sum(resident.values())))
    log(_progress(out[-1], tgt))
  return out, resident


def _gib(x: float) -> str:
  return f"{x / GiB:.3f}"


def _progress(r: Compiled, tgt: Target) -> str:
  verdict = f"REFUSED ({r.error})" if r.error else f"peak {_gib(r.peak_bytes)} GiB per chip"
  return (f"{r.name}: {r.compile_s:.1f} s to trace and compile; program {_gib(r.program_bytes)} GiB (temp "
          f"{_gib(r.temp)}) + resident {_gib(r.resident_other)}: {verdict}; {r.flops / 1e12:.3f} TFLOP per chip "
          f"per call" + (f" = {r.flops / tgt.chip.peak_flops:.3f} s at peak" if tgt.chip else ""))


# REPORT


def report(config, tgt: Target, results: list[Compiled], resident: dict, hbm_gib: float | None) -> list[str]:
  """Printable lines; the last names the first program that does not fit (or says all fit)."""
  model_config = policy_config(config.model, tgt.devices[0].platform)
  n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(jax.eval_shape(models.init_params, model_config,
                                                                             jax.random.key(0))))
  hbm = hbm_gib * GiB if hbm_gib else (tgt.chip.usable_gib * GiB if tgt.chip else None)
  rollout, algo, m = config.rollout, config.algorithm, config.model
  lines = [f"model: {m.init_checkpoint or m.model or 'embedded tiny'}, {n_params / 1e9:.3f}B params, "
           f"{model_config.num_hidden_layers} layers, {model_config.dtype}, remat="
           f"{model_config.remat_policy if model_config.remat else 'off'}, scan_layers={model_config.scan_layers}, "
           f"attention={model_config.attention}",
           f"target: {tgt.name}, {tgt.num_chips} chips ({len(tgt.devices)} devices)"
           + (f", {tgt.chip.name}: {tgt.chip.usable_gib} GiB HBM, {tgt.chip.peak_flops / 1e12:.0f} TFLOP/s bf16 "
              f"per chip" if tgt.chip else "") + f"; mesh {config.mesh.mesh}, rules {config.mesh.sharding_rules}",
           f"run: --algo={algo.algo}, B={rollout.batch_size} prompts x G={rollout.group_size} samples of P+T = "
           f"{config.task.max_prompt_len}+{rollout.max_new_tokens} tokens, --grad_accum_steps="
           f"{algo.grad_accum_steps}, --logprob_chunk={m.logprob_chunk}, --beta={algo.beta}, --reward="
           f"{config.task.reward}, --forward_rows={config.mesh.forward_rows}, --forward_memory_budget="
           f"{config.mesh.forward_memory_budget}",
           "resident per chip (GiB): " + ", ".join(f"{k} {_gib(v)}" for k, v in resident.items()),
           "",
           "| program | calls | args GiB | out GiB | alias GiB | temp GiB | code GiB | program GiB | + resident GiB "
           "| peak GiB | HBM % | TFLOP/chip a call | XLA TFLOP/dev (loops once) | s at peak | compile s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  problem = None
  for r in results:
    at_peak = r.calls * r.flops / tgt.chip.peak_flops if tgt.chip else float("nan")
    share = f"{100 * r.peak_bytes / hbm:.0f}" if hbm else "-"
    lines.append(f"| {r.name} | {r.calls}/{r.per} | {_gib(r.argument)} | {_gib(r.output)} | {_gib(r.alias)} | "
                 f"{_gib(r.temp)} | {_gib(r.code)} | {_gib(r.program_bytes)} | {_gib(r.resident_other)} | "
                 f"{_gib(r.peak_bytes)} | {share} | {r.flops / 1e12:.3f} | "
                 f"{r.xla_flops / tgt.devices_per_chip / 1e12:.3f} | {at_peak:.3f} | {r.compile_s:.1f} |")
    if r.error and not r.temp and problem is None:  # a crash, no figures
      problem = f"COMPILER CRASHED: {r.name} on {tgt.name}: {r.error}"
    if ((hbm and r.peak_bytes > hbm) or r.error) and problem is None:
      what = "its arguments" if r.argument - r.alias >= r.temp else "its temporaries"
      problem = (f"DOES NOT FIT: {r.name} needs {_gib(r.peak_bytes)} GiB per chip on {tgt.name} "
                 f"({_gib(r.program_bytes)} program, mostly {what}, + {_gib(r.resident_other)} resident) "
                 f"> {hbm / GiB if hbm else tgt.chip.usable_gib:.2f} GiB HBM; largest arrays: {'; '.join(r.largest)}")
  lines.append("")
  for r in results:
    lines.append(f"{r.name}: {r.uses}")
    if r.error:
      lines.append(f"{r.name}: the compiler refused it: {r.error}")
    lines.append(f"{r.name}: largest arrays{'' if r.error else ' per device'}: {'; '.join(r.largest)}")
    if r.loop_ops:  # a sampler's: one decode step (over unrolled layers)
      kinds = ", ".join(f"{k} {v}" for k, v in list(r.loop_op_kinds.items())[:6])
      lines.append(f"{r.name}: its largest loop body: {r.loop_ops} instructions that do work a trip ({kinds})")
  lines.append(problem or ("fits: every program within " + (f"{hbm / GiB:.2f} GiB per chip" if hbm
                                                              else "(no HBM to check on the host)")))
  return lines


def main(argv):
  if len(argv) > 1:
    sys.exit(f"aot_compile: unexpected arguments: {' '.join(argv[1:])}")
  python_gc.collect_less()  # compiling is Python-heavy: fewer full collections
  from absl import flags  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  jax.config.update("jax_platforms", "cpu")  # compile only: nothing runs, no accelerator is claimed
  log = lambda s: print(s, file=sys.stderr, flush=True)
  if f.hbm_gib is not None and not (math.isfinite(f.hbm_gib) and f.hbm_gib > 0):
    sys.exit(f"aot_compile: --hbm_gib must be a finite number of GiB > 0, not {f.hbm_gib}")
  out_dir = os.path.dirname(os.path.abspath(f.json_out)) if f.json_out else ""
  if f.json_out and not (os.path.isdir(out_dir) and os.access(out_dir, os.W_OK)):
    sys.exit(f"aot_compile: --json_out: cannot write {f.json_out} (its directory {out_dir} is missing or read-only)")
  try:
    config = cli.config_from_flags()
    tgt = target(f.topology)
    if f.isolate and len(f.programs) != 1:
      results, resident = _compile_in_children(config, tgt, f.programs, log)
    else:
      results, resident = compile_programs(config, tgt, f.programs, log=log)
  except cli.ERRORS as err:
    sys.exit(f"aot_compile: {err}")
  lines = report(config, tgt, results, resident, f.hbm_gib)
  print("\n".join(lines[:-1]))
  if f.json_out:
    with open(f.json_out, "a") as out:
      out.write(json.dumps({"config": config.flat(), "topology": f.topology, "resident": resident,
                            "programs": [dataclasses.asdict(r) | {"peak_bytes": r.peak_bytes} for r in results],
                            "verdict": lines[-1]}) + "\n")
  if not lines[-1].startswith("fits"):
    sys.exit(lines[-1])
  print(lines[-1])


def _compile_in_children(config: config_lib.Config, tgt: Target, names: Sequence[str],
                         log) -> tuple[list[Compiled], dict]:
  """Each program compiled by a child run of this script (`--programs=<one> --noisolate`), so that a crash of
  the compiler (libtpu 0.0.42 died with SIGSEGV instead of RESOURCE_EXHAUSTED on log-prob forwards far over HBM)
  is reported as that program's failure."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import tempfile  # pylint: disable=import-outside-toplevel
  skip = ("--programs", "--json_out", "--isolate", "--noisolate")
  argv = [a for a in sys.argv[1:] if not a.startswith(skip)]
  if not names:  # the run's programs, listed without compiling
    placement = placement_lib.Placement.from_config(config.mesh, list(tgt.devices))
    model_config = policy_config(config.model, tgt.devices[0].platform)
    names = list(programs.programs(config, model_config, placement, reward_shapes(config, model_config)))
  results, resident = [], {}
  for name in names:
    with tempfile.TemporaryDirectory() as tmp:
      out = os.path.join(tmp, "figures.jsonl")
      child = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, f"--programs={name}",
                              f"--json_out={out}", "--noisolate"], stdout=subprocess.DEVNULL, check=False)
      if os.path.exists(out):
        record = json.loads(open(out).read().splitlines()[-1])
        fields = {f.name for f in dataclasses.fields(Compiled)}
        results.append(Compiled(**{k: v for k, v in record["programs"][0].items() if k in fields}))
        resident = record["resident"]
      elif child.returncode > 0:
        raise ValueError(f"compiling {name} failed in a child process (exit status {child.returncode}; see above)")
      elif child.returncode < 0:
        results.append(Compiled(name, "", 0, "step", 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0,
                                error=f"the TPU compiler crashed (signal {-child.returncode})"))
        log(f"{name}: {results[-1].error}")
  return results, resident


def define_flags():
  """This script's own flags (the runner's are defined by importing `experiments.cli`)."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  flags.DEFINE_string("topology", "v5e:2x4", "TPU topology (v4:2x2x1, v5e:2x4, v5p:2x2x1, v6e:2x4, ...) or 'cpu' "
                      "(this machine's devices; XLA_FLAGS=--xla_force_host_platform_device_count=8 fakes 8).")
  flags.DEFINE_list("programs", [], "Programs to compile (default: all of the run's: sampler, reward, logprobs, "
                    "batch, update, eval_greedy, eval_samples, those the config runs).")
  flags.DEFINE_float("hbm_gib", None, "HBM per chip to check against (default: the chip's; none on the host).")
  flags.DEFINE_string("json_out", "", "Append one JSON record of the figures to this file.")
  flags.DEFINE_bool("isolate", True, "Compile each program in a child process (a compiler crash is then reported "
                    "as that program's failure).")


if __name__ == "__main__":
  from absl import app  # pylint: disable=import-outside-toplevel
  define_flags()
  app.run(main)
