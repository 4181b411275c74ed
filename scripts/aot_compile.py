r"""Compiles the GRPO runner's programs for a TPU topology ahead of time, without a TPU and without weights.

  python scripts/aot_compile.py --model=qwen2.5-0.5b --topology=v5e:2x4 --mesh=fsdp:8 --sharding_rules=fsdp \
      --batch_size=16 --group_size=8 --max_prompt_len=256 --max_new_tokens=768 --grad_accum_steps=16 \
      --dtype=bfloat16 --remat --scan_layers
  python scripts/aot_compile.py --model=deepseek-math-7b --topology=v5p:4x4x4 --mesh=fsdp:64 \
      --flagfile=experiments/configs/deepseekmath_gsm8k.cfg --reward_model      # the paper's setting
  python scripts/aot_compile.py --model=tiny --topology=cpu                      # this machine's CPU devices
  python scripts/aot_compile.py --model=tiny --tiny_layers=2 --topology=v5e:2x2 --mesh=fsdp:4  # the runner's tiny flags

The programs are the runner's own (experiments/grpo_math.py with `--mesh`/`--sharding_rules`), built
by the library functions it calls, at the shapes its flags give:

  update    training.make_train_step(grpo_objective, AdamW): one optimiser step over the B·G rows
            (or --minibatch_size) of P + T tokens, in --grad_accum_steps micro-batches; state donated
  logprobs  logprobs.jit_token_logprobs: the π_ref (and π_old) forward over the B·G rows (or --forward_rows)
  sampler   sampling.jit_sample: prefill B prompts, G samples each, T tokens with the KV cache
  reward    reward_models.outcome_scores: a reward model (policy backbone + scalar head) over the rows (same)

Arguments are `jax.ShapeDtypeStruct`s carrying their shardings, so nothing is allocated; the real XLA
compiler for the topology (libtpu, `pip install -e '.[tpu]'`) runs `jit(...).lower(...).compile()`.
For each program it prints, per chip, XLA's `memory_analysis()`: arguments, outputs, temporaries,
generated code, minus the donated (aliased) bytes; then the same plus the arrays that stay resident
between programs (policy params + AdamW moments, the reference params with --beta > 0, the reward
model with --reward_model) that are not its own arguments, against the chip's HBM. FLOPs are the
matmul FLOPs of the traced program with every scan and loop counted at its trip count (XLA's
`cost_analysis()` counts a loop body once; its figure is printed beside) and the sampler's decode loop
at T - 1 steps; "at peak" is FLOPs per chip / the chip's peak bf16 FLOP/s, a lower bound on the step
time against which a real run's MFU reads. The sampler also gets its HBM-bandwidth bound: each decode
step reads the chip's params and KV cache.

Exits non-zero with one line when a program does not fit in a chip's HBM.
"""

import dataclasses
import json
import math
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import logprobs as logprobs_lib
from grpo_jax import models
from grpo_jax import reward_models
from grpo_jax import sampling
from grpo_jax import partitioning
from grpo_jax import python_gc
from grpo_jax import training
from grpo_jax.training import update as update_lib

GiB = 2 ** 30
PROGRAMS = ("update", "logprobs", "sampler", "reward")

# Environment for loading libtpu as a compiler only, on a machine without a TPU: no lock file held
# against other JAX processes, and no TPU-VM metadata looked up (libtpu's init is quiet).
LIBTPU_ENV = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_HOSTNAMES": "localhost",
              "TPU_ACCELERATOR_TYPE": "v5litepod-1"}


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU chip: the HBM its compiler lets a program use, and Google Cloud's published peak figures."""
  name: str
  hbm_gib: float  # HBM per chip available to a program (libtpu's "available HBM"; physical: 32, 16, 95, 32)
  peak_flops: float  # dense bf16 FLOP/s per chip
  hbm_bandwidth: float  # bytes/s per chip


CHIPS = {  # by the topology's device_kind
    "TPU v4": Chip("v4", 30.75, 275e12, 1.2e12),
    "TPU v5 lite": Chip("v5e", 15.75, 197e12, 0.819e12),
    "TPU v5": Chip("v5p", 95.74, 459e12, 2.765e12),
    "TPU v6 lite": Chip("v6e", 31.25, 918e12, 1.64e12),
}

# Named shapes (random weights are never built; only the shapes matter).
_QWEN = dict(model_type="qwen2", qkv_bias=True, rope_theta=1e6, rms_norm_eps=1e-6, eos_token_ids=(151645, 151643),
             pad_token_id=151643, max_position_embeddings=32768)
NAMED = {
    "qwen2.5-0.5b": dict(_QWEN, vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(_QWEN, vocab_size=151_936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, head_dim=128, tie_word_embeddings=True),
    "qwen2.5-7b": dict(_QWEN, vocab_size=152_064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, head_dim=128, tie_word_embeddings=False),
    # DeepSeekMath-7B (arXiv 2402.03300): the DeepSeek-LLM 7B architecture, Llama-shaped.
    "deepseek-math-7b": dict(model_type="llama", vocab_size=102_400, hidden_size=4096, intermediate_size=11008,
                             num_hidden_layers=30, num_attention_heads=32, num_key_value_heads=32, head_dim=128,
                             rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=4096,
                             tie_word_embeddings=False, bos_token_id=100000, eos_token_ids=(100001,),
                             pad_token_id=100001),
}


class DoesNotFit(Exception):
  """A program needs more HBM per chip than the chip has."""


def quiet_libtpu() -> None:
  """Sets LIBTPU_ENV (where unset) before libtpu is first loaded."""
  for key, value in LIBTPU_ENV.items():
    os.environ.setdefault(key, value)


def model_config(model: str, *, dtype: str = "float32", remat: bool = False, remat_policy: str = "full",
                 scan_layers: bool = False, tiny_layers: int = 4, tiny_hidden_size: int = 128) -> models.ModelConfig:
  """A named shape (`tiny`, NAMED) or an HF checkpoint directory's config.json.

  `tiny` is the runner's embedded model at its `--tiny_layers` and `--tiny_hidden_size` (MLP 3x the hidden size).
  """
  runtime = dict(dtype=dtype, param_dtype=dtype, remat=remat, remat_policy=remat_policy, scan_layers=scan_layers)
  if model == "tiny":
    return models.tiny_config(num_hidden_layers=tiny_layers, hidden_size=tiny_hidden_size,
                              intermediate_size=3 * tiny_hidden_size, **runtime)
  if model in NAMED:
    return models.ModelConfig(**NAMED[model], **runtime)
  return models.read_config(model, **runtime)


@dataclasses.dataclass(frozen=True)
class Target:
  """The devices to compile for, and the chip they sit on (None: the host, no HBM to check)."""
  name: str
  devices: tuple
  chip: Chip | None
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
  if kind not in CHIPS:
    raise ValueError(f"topology {topology!r}: unknown chip {kind!r} (known: {', '.join(CHIPS)})")
  per_chip = len(devices) // len({tuple(d.coords) for d in devices})
  return Target(topology, tuple(devices), CHIPS[kind], per_chip)


# FLOPS


def matmul_flops(jaxpr, while_trips: int = 1) -> float:
  """2·M·N·K summed over the dot_generals of a jaxpr, each scan body times its length and each
  while body times `while_trips` (nested programs, remat and custom-derivative bodies included)."""
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract)
      continue
    if name == "cond":
      total += max(matmul_flops(b.jaxpr, while_trips) for b in eqn.params["branches"])
      continue
    times = eqn.params["length"] if name == "scan" else while_trips if name == "while" else 1
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          total += times * matmul_flops(sub, while_trips)
  return total


# SHAPES AND SHARDINGS


def _abstract(shapes, shardings):
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def _bytes_per_device(tree) -> int:
  """Bytes of one device's shards of a tree of sharded ShapeDtypeStructs."""
  leaves = jax.tree.leaves(tree)
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize for x in leaves)


@dataclasses.dataclass(frozen=True)
class Work:
  """The runner's flags that set the programs' shapes."""
  batch_size: int = 8
  group_size: int = 8
  max_prompt_len: int = 16
  max_new_tokens: int = 40
  grad_accum_steps: int = 1
  minibatch_size: int = 0
  logprob_chunk: int = 128
  forward_rows: int = 0  # rows per call of the log-prob and reward forwards (0: all B·G at once, as the runner)
  beta: float = 0.04
  reward_model: bool = False
  learning_rate: float = 1e-6

  @property
  def rows(self) -> int:
    return self.batch_size * self.group_size

  @property
  def forward_calls(self) -> int:
    return self.rows // (self.forward_rows or self.rows)

  @property
  def length(self) -> int:
    return self.max_prompt_len + self.max_new_tokens


@dataclasses.dataclass
class Compiled:
  """One program's compiler figures, per chip."""
  name: str
  argument: int
  output: int
  alias: int
  temp: int
  code: int
  resident_other: int  # resident arrays of other roles, not arguments of this program
  flops: float  # matmul FLOPs per chip, loops at their trip counts
  xla_flops: float  # XLA's cost_analysis per device (loop bodies once)
  compile_s: float
  largest: list = dataclasses.field(default_factory=list)  # the largest arrays of the compiled program
  bandwidth_s: float | None = None  # sampler: decode-loop HBM bound
  error: str = ""  # the compiler's refusal (out of HBM); then `temp` is the compiler's figure

  @property
  def program_bytes(self) -> int:
    return self.argument + self.output + self.temp + self.code - self.alias

  @property
  def peak_bytes(self) -> int:
    return self.program_bytes + self.resident_other


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


_OUT_OF_HBM = re.compile(r"HLO temporaries \(([0-9.]+)G\) exceeds available HBM \(([0-9.]+)G\)")


def _compile(name, jitted, args, *, num_devices, devices_per_chip, while_trips=1, resident_other=0) -> Compiled:
  t0 = time.perf_counter()
  traced = jitted.trace(*args)
  flops = matmul_flops(traced.jaxpr.jaxpr, while_trips) / num_devices * devices_per_chip
  try:
    compiled = traced.lower().compile()
  except jax.errors.JaxRuntimeError as err:
    found = _OUT_OF_HBM.search(str(err))
    if "RESOURCE_EXHAUSTED" not in str(err) or not found:
      raise
    per_device_args = sum(math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
                          for x in jax.tree.leaves(args) if jnp.issubdtype(x.dtype, jnp.number) or x.dtype == bool)
    return Compiled(name, argument=devices_per_chip * per_device_args, output=0, alias=0,
                    temp=int(devices_per_chip * float(found.group(1)) * GiB), code=0, resident_other=resident_other,
                    flops=flops, xla_flops=0.0, compile_s=time.perf_counter() - t0,
                    largest=largest_traced_arrays(traced.jaxpr.jaxpr), error=str(err).strip().splitlines()[0])
  seconds = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  k = devices_per_chip
  return Compiled(name, argument=k * mem.argument_size_in_bytes, output=k * mem.output_size_in_bytes,
                  alias=k * mem.alias_size_in_bytes, temp=k * mem.temp_size_in_bytes,
                  code=k * mem.generated_code_size_in_bytes, resident_other=resident_other, flops=flops,
                  xla_flops=float((cost or {}).get("flops", 0.0)) * k, compile_s=seconds,
                  largest=largest_arrays(compiled.as_text()))


def compile_programs(config: models.ModelConfig, tgt: Target, mesh_spec: str, rules_name: str | Mapping,
                     work: Work, programs: Sequence[str] = PROGRAMS, log=print) -> tuple[list[Compiled], dict]:
  """Compiles the runner's programs for `tgt`; returns their figures and the resident bytes per chip."""
  mesh = partitioning.make_mesh(mesh_spec, devices=list(tgt.devices))
  rules = partitioning.get_rules(rules_name)
  dp = partitioning.data_parallel_size(mesh, rules)
  minibatch = work.minibatch_size or work.rows
  for what, size in (("batch_size*group_size", work.rows), ("minibatch_size / grad_accum_steps",
                                                            minibatch // work.grad_accum_steps),
                     ("batch_size", work.batch_size)):
    if size % dp:
      raise ValueError(f"{what} = {size} must be a multiple of the mesh's data-parallel size {dp}")
  if work.forward_rows and (work.rows % work.forward_rows or work.forward_rows % dp):
    raise ValueError(f"--forward_rows = {work.forward_rows} must divide batch_size*group_size = {work.rows} and be a "
                     f"multiple of the mesh's data-parallel size {dp}")
  if minibatch % work.grad_accum_steps or work.rows % minibatch:
    raise ValueError("--minibatch_size must divide batch_size*group_size and be divisible by --grad_accum_steps")

  key = jax.random.key(0)
  optimizer = training.make_optimizer(work.learning_rate, max_grad_norm=1.0)
  params_shapes = jax.eval_shape(models.init_params, config, key)
  params = _abstract(params_shapes, partitioning.param_shardings(mesh, rules, params_shapes))
  state_shapes = jax.eval_shape(lambda p: training.init_train_state(p, optimizer), params_shapes)
  state_sh = partitioning.state_shardings(mesh, rules, state_shapes)
  state = _abstract(state_shapes, state_sh)
  rm_shapes = jax.eval_shape(lambda k: models.init_scalar_params(config, k), key)
  rm_params = _abstract(rm_shapes, partitioning.param_shardings(mesh, rules, rm_shapes))
  resident = {"policy params + AdamW": _bytes_per_device(state),
              "reference params": _bytes_per_device(params) if work.beta > 0 else 0,
              "reward model": _bytes_per_device(rm_params) if work.reward_model else 0}
  resident = {k: v * tgt.devices_per_chip for k, v in resident.items()}
  total_resident = sum(resident.values())
  per_chip = lambda tree: _bytes_per_device(tree) * tgt.devices_per_chip
  common = dict(num_devices=len(tgt.devices), devices_per_chip=tgt.devices_per_chip)

  out = []

  def done(r: Compiled):
    out.append(r)
    log(_progress(r, tgt))

  n, length = work.rows, work.length
  fwd = work.forward_rows or n
  rows_sh = partitioning.logical_sharding(mesh, rules, ("batch", None), (n, length))
  seq = lambda dtype, rows=n: jax.ShapeDtypeStruct((rows, length), dtype, sharding=rows_sh if rows == n else
                                                   partitioning.logical_sharding(mesh, rules, ("batch", None),
                                                                                 (rows, length)))
  for name in programs:
    log(f"compiling {name} ...")
    if name == "update":
      objective = update_lib.bind(
          training.grpo_objective, config=config, use_reference=work.beta > 0, chunk_size=work.logprob_chunk,
          loss_kwargs=dict(epsilon=0.2, beta=work.beta, kl="k3", aggregation="seq-mean-token-mean",
                           max_len=work.max_new_tokens))
      batch_sh = partitioning.batch_sharding(mesh, rules)
      step = training.make_train_step(objective, optimizer, work.grad_accum_steps, state_shardings=state_sh,
                                      batch_shardings=batch_sh, mesh=mesh, rules=rules)
      f32, b = lambda: seq(jnp.float32, minibatch), lambda: seq(jnp.bool_, minibatch)
      batch = training.Batch(tokens=seq(jnp.int32, minibatch), attention_mask=b(), loss_mask=b(), old_logp=f32(),
                             ref_logp=f32(), advantages=f32())
      done(_compile(name, step.jitted, (state, batch), resident_other=total_resident - per_chip(state),
                          **common))
    elif name == "logprobs":  # one call's figures; its FLOPs times the calls of a step
      fn = logprobs_lib.jit_token_logprobs(config, mesh=mesh, rules=rules, chunk_size=work.logprob_chunk)
      compiled = _compile(name, fn.jitted((fwd, length)), (params, seq(jnp.int32, fwd), seq(jnp.bool_, fwd)),
                          resident_other=total_resident - per_chip(params) * (work.beta > 0), **common)
      compiled.flops *= work.forward_calls
      done(compiled)
    elif name == "sampler":
      b, p = work.batch_size, work.max_prompt_len
      fn = sampling.jit_sample(config, (b, p), mesh=mesh, rules=rules, num_samples=work.group_size,
                               max_new_tokens=work.max_new_tokens)
      prompt_sh = partitioning.logical_sharding(mesh, rules, ("batch", None), (b, p))
      scalar = partitioning.replicated(mesh)
      args = (params, jax.ShapeDtypeStruct((b, p), jnp.int32, sharding=prompt_sh),
              jax.ShapeDtypeStruct((b, p), jnp.bool_, sharding=prompt_sh),
              jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=scalar),
              jax.ShapeDtypeStruct((), jnp.float32, sharding=scalar))
      compiled = _compile(name, fn, args, while_trips=work.max_new_tokens - 1,
                          resident_other=total_resident - per_chip(params), **common)
      if tgt.chip is not None:
        kv_shape = (n, length, config.num_key_value_heads, config.head_dim)
        kv_sh = partitioning.logical_sharding(mesh, rules, ("batch", "length", "kv_heads", None), kv_shape)
        kv_bytes = (2 * config.num_hidden_layers * math.prod(kv_sh.shard_shape(kv_shape))
                    * jnp.dtype(config.dtype).itemsize)
        # Each decode step reads the chip's params and its half-full (on average) KV cache.
        step_bytes = per_chip(params) + tgt.devices_per_chip * kv_bytes / 2
        compiled.bandwidth_s = work.max_new_tokens * step_bytes / tgt.chip.hbm_bandwidth
      done(compiled)
    elif name == "reward":
      rows = partitioning.logical_sharding(mesh, rules, ("batch", None), (fwd, length))
      fn = partitioning.jit_with_rules(lambda prm, t, m: reward_models.outcome_scores(prm, config, t, m),
                                       mesh, rules,
                                       in_shardings=(jax.tree.map(lambda x: x.sharding, rm_params), rows, rows),
                                       out_shardings=partitioning.logical_sharding(mesh, rules, ("batch",), (fwd,)))
      compiled = _compile(name, fn, (rm_params, seq(jnp.int32, fwd), seq(jnp.bool_, fwd)),
                          resident_other=total_resident - resident["reward model"], **common)
      compiled.flops *= work.forward_calls
      done(compiled)
    else:
      raise ValueError(f"unknown program {name!r}; choose from {PROGRAMS}")
  return out, resident


def _progress(r: Compiled, tgt: Target) -> str:
  verdict = f"REFUSED ({r.error})" if r.error else f"peak {_gib(r.peak_bytes)} GiB per chip"
  return (f"{r.name}: {r.compile_s:.1f} s to trace and compile; program {_gib(r.program_bytes)} GiB (temp "
          f"{_gib(r.temp)}) + resident {_gib(r.resident_other)}: {verdict}; {r.flops / 1e12:.3f} TFLOP per chip"
          + (f" = {r.flops / tgt.chip.peak_flops:.3f} s at peak" if tgt.chip else ""))


# REPORT


def _gib(x: float) -> str:
  return f"{x / GiB:.3f}"


def report(config: models.ModelConfig, tgt: Target, mesh_spec: str, rules_name: str, work: Work,
           results: list[Compiled], resident: dict, hbm_gib: float | None) -> list[str]:
  """Printable lines; the last names the first program that does not fit (or says all fit)."""
  n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(jax.eval_shape(models.init_params, config,
                                                                             jax.random.key(0))))
  hbm = hbm_gib * GiB if hbm_gib else (tgt.chip.hbm_gib * GiB if tgt.chip else None)
  lines = [f"model: {n_params / 1e9:.3f}B params, {config.num_hidden_layers} layers, {config.dtype}, remat="
           f"{config.remat_policy if config.remat else 'off'}, scan_layers={config.scan_layers}",
           f"target: {tgt.name}, {tgt.num_chips} chips ({len(tgt.devices)} devices)"
           + (f", {tgt.chip.name}: {tgt.chip.hbm_gib} GiB HBM, {tgt.chip.peak_flops / 1e12:.0f} TFLOP/s bf16 "
              f"per chip" if tgt.chip else "") + f"; mesh {mesh_spec or 'data:-1'}, rules {rules_name}",
           f"work: B={work.batch_size} prompts x G={work.group_size} = {work.rows} rows of P+T = "
           f"{work.max_prompt_len}+{work.max_new_tokens} tokens; {work.grad_accum_steps} micro-batches of "
           f"{(work.minibatch_size or work.rows) // work.grad_accum_steps} rows; log-prob and reward forwards "
           f"{work.forward_calls} x {work.forward_rows or work.rows} rows; logprob chunk {work.logprob_chunk}",
           "resident per chip (GiB): " + ", ".join(f"{k} {_gib(v)}" for k, v in resident.items()),
           "",
           "| program | args GiB | out GiB | alias GiB | temp GiB | code GiB | program GiB | + resident GiB "
           "| peak GiB | HBM % | TFLOP/chip | XLA TFLOP/dev (loops once) | s at peak | compile s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  problem = None
  for r in results:
    at_peak = r.flops / tgt.chip.peak_flops if tgt.chip else float("nan")
    share = f"{100 * r.peak_bytes / hbm:.0f}" if hbm else "-"
    lines.append(f"| {r.name} | {_gib(r.argument)} | {_gib(r.output)} | {_gib(r.alias)} | {_gib(r.temp)} | "
                 f"{_gib(r.code)} | {_gib(r.program_bytes)} | {_gib(r.resident_other)} | {_gib(r.peak_bytes)} | "
                 f"{share} | {r.flops / 1e12:.3f} | {r.xla_flops / tgt.devices_per_chip / 1e12:.3f} | "
                 f"{at_peak:.3f} | {r.compile_s:.1f} |")
    if r.error and not r.temp and problem is None:  # a crash, no figures
      problem = f"COMPILER CRASHED: {r.name} on {tgt.name}: {r.error}"
    if ((hbm and r.peak_bytes > hbm) or r.error) and problem is None:
      what = ("its arguments" if r.argument - r.alias >= r.temp else "its temporaries")
      problem = (f"DOES NOT FIT: {r.name} needs {_gib(r.peak_bytes)} GiB per chip on {tgt.name} "
                 f"({_gib(r.program_bytes)} program, mostly {what}, + {_gib(r.resident_other)} resident) "
                 f"> {hbm / GiB if hbm else tgt.chip.hbm_gib:.2f} GiB HBM; largest arrays: {'; '.join(r.largest)}")
  lines.append("")
  for r in results:
    if r.error:
      lines.append(f"{r.name}: the compiler refused it: {r.error}")
    lines.append(f"{r.name}: largest arrays{'' if r.error else ' per device'}: {'; '.join(r.largest)}")
    if r.bandwidth_s is not None:
      lines.append(f"{r.name}: HBM-bandwidth bound of the decode loop: {r.bandwidth_s:.3f} s "
                   f"(T x (params + mean KV cache per chip) / {tgt.chip.hbm_bandwidth / 1e12:.2f} TB/s)")
  lines.append(problem or ("fits: every program within " + (f"{hbm / GiB:.2f} GiB per chip" if hbm
                                                              else "(no HBM to check on the host)")))
  return lines


def main(argv):
  del argv
  python_gc.collect_less()  # compiling is Python-heavy: fewer full collections (BENCHMARKS.md, fourteenth pass)
  from absl import flags  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  jax.config.update("jax_platforms", "cpu")  # compile only: nothing runs, no accelerator is claimed
  config = model_config(f.model, dtype=f.dtype, remat=f.remat, remat_policy=f.remat_policy,
                        scan_layers=f.scan_layers, tiny_layers=f.tiny_layers, tiny_hidden_size=f.tiny_hidden_size)
  work = Work(batch_size=f.batch_size, group_size=f.group_size, max_prompt_len=f.max_prompt_len,
              max_new_tokens=f.max_new_tokens, grad_accum_steps=f.grad_accum_steps, minibatch_size=f.minibatch_size,
              logprob_chunk=f.logprob_chunk, forward_rows=f.forward_rows, beta=f.beta, reward_model=f.reward_model,
              learning_rate=f.learning_rate)
  programs = [p for p in f.programs if p != "reward" or f.reward_model]  # rule rewards: no reward model
  log = lambda s: print(s, file=sys.stderr, flush=True)
  try:
    tgt = target(f.topology)
    if f.isolate and len(programs) > 1:
      results, resident = _compile_in_children(programs, log)
    else:
      results, resident = compile_programs(config, tgt, f.mesh, f.sharding_rules, work, programs, log=log)
  except ValueError as err:
    sys.exit(f"aot_compile: {err}")
  lines = report(config, tgt, f.mesh, f.sharding_rules, work, results, resident, f.hbm_gib)
  print("\n".join(lines[:-1]))
  if f.json_out:
    with open(f.json_out, "a") as out:
      out.write(json.dumps({"flags": {k: getattr(f, k) for k in _FLAG_NAMES}, "resident": resident,
                            "programs": [dataclasses.asdict(r) | {"peak_bytes": r.peak_bytes} for r in results],
                            "verdict": lines[-1]}) + "\n")
  if not lines[-1].startswith("fits"):
    sys.exit(lines[-1])
  print(lines[-1])


def _compile_in_children(programs: Sequence[str], log) -> tuple[list[Compiled], dict]:
  """Each program compiled by a child run of this script (`--programs=<one> --noisolate`), so that a crash of
  the compiler (libtpu 0.0.42 died with SIGSEGV instead of RESOURCE_EXHAUSTED on log-prob forwards far over HBM)
  is reported as that program's failure."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import tempfile  # pylint: disable=import-outside-toplevel
  skip = ("--programs", "--json_out", "--isolate", "--noisolate")
  argv = [a for a in sys.argv[1:] if not a.startswith(skip)]
  results, resident = [], {}
  for name in programs:
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
        how = f"signal {-child.returncode}"
        results.append(Compiled(name, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0,
                                error=f"the TPU compiler crashed ({how}); seen on log-prob forwards far over HBM, "
                                      f"which compile with a smaller --forward_rows"))
        log(f"{name}: {results[-1].error}")
  return results, resident


_FLAG_NAMES = ("model", "topology", "mesh", "sharding_rules", "batch_size", "group_size", "max_prompt_len",
               "max_new_tokens", "grad_accum_steps", "minibatch_size", "dtype", "remat", "remat_policy",
               "scan_layers", "logprob_chunk", "forward_rows", "beta", "reward_model", "programs")


def define_flags():
  from absl import flags  # pylint: disable=import-outside-toplevel
  flags.DEFINE_string("model", "tiny", "Named shapes (tiny, " + ", ".join(NAMED) + ") or an HF checkpoint "
                      "directory (its config.json only).")
  flags.DEFINE_integer("tiny_layers", 4, "--model=tiny: decoder layers (the runner's flag of the same name).")
  flags.DEFINE_integer("tiny_hidden_size", 128, "--model=tiny: hidden size, the MLP 3x (the runner's flag).")
  heads = models.tiny_config().num_attention_heads
  flags.register_validator("tiny_layers", lambda v: v >= 1, message="--tiny_layers must be >= 1")
  flags.register_validator("tiny_hidden_size", lambda v: v >= 1 and v % (2 * heads) == 0,
                           message=f"--tiny_hidden_size must be a positive multiple of {2 * heads}")
  flags.DEFINE_string("topology", "v5e:2x4", "TPU topology (v4:2x2x1, v5e:2x4, v5p:2x2x1, v6e:2x4, ...) or 'cpu' "
                      "(this machine's devices; XLA_FLAGS=--xla_force_host_platform_device_count=8 fakes 8).")
  flags.DEFINE_string("mesh", "", "Device mesh over the topology, e.g. 'fsdp:8' or 'data:2,fsdp:4' (as the runner's).")
  flags.DEFINE_enum("sharding_rules", "fsdp", sorted(partitioning.RULES), "Rule preset (as the runner's).")
  flags.DEFINE_integer("batch_size", 32, "Prompts per step (B).")
  flags.DEFINE_integer("group_size", 8, "Samples per prompt (G).")
  flags.DEFINE_integer("max_prompt_len", 16, "Prompt tokens (P).")
  flags.DEFINE_integer("max_new_tokens", 40, "Completion budget (T).")
  flags.DEFINE_integer("grad_accum_steps", 1, "Micro-batches per optimiser step.")
  flags.DEFINE_integer("minibatch_size", 0, "Rows per optimiser step (0: all B*G).")
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute and parameter dtype.")
  flags.DEFINE_bool("remat", False, "Rematerialise each layer in the backward pass.")
  flags.DEFINE_enum("remat_policy", "full", list(models.REMAT_POLICIES), "What a rematerialised layer keeps.")
  flags.DEFINE_bool("scan_layers", False, "The layer stack as one lax.scan (faster compiles).")
  flags.DEFINE_integer("logprob_chunk", 128, "Sequence chunk of the log-prob computation.")
  flags.DEFINE_integer("forward_rows", 0, "Rows per call of the log-prob and reward forwards (0: all B*G rows in "
                       "one call, as the runner does today); the figures are one call's, the FLOPs a step's.")
  flags.DEFINE_float("beta", 0.04, "KL coefficient; > 0 keeps the reference params resident.")
  flags.DEFINE_bool("reward_model", False, "A reward model (policy-sized backbone + scalar head) is resident and "
                    "scores the rows.")
  flags.DEFINE_float("learning_rate", 1e-6, "Unused by the shapes; accepted so runner flagfiles load.")
  flags.DEFINE_list("programs", list(PROGRAMS), "Programs to compile: " + ", ".join(PROGRAMS) + " (reward only "
                    "with --reward_model).")
  flags.DEFINE_float("hbm_gib", None, "HBM per chip to check against (default: the chip's; none on the host).")
  flags.DEFINE_string("json_out", "", "Append one JSON record of the figures to this file.")
  flags.DEFINE_bool("isolate", True, "Compile each program in a child process (a compiler crash is then reported "
                    "as that program's failure).")
  # Runner flags that a flagfile (e.g. experiments/configs/deepseekmath_gsm8k.cfg) may carry; ignored here.
  for name in ("task", "prompt_template", "reward", "lr_schedule", "kl", "loss_aggregation", "advantage_scale",
               "work_dir"):
    flags.DEFINE_string(name, None, "Runner flag, ignored.")
  for name in ("warmup_steps", "num_epochs", "num_test", "eval_batch_size", "eval_every", "save_every", "steps",
               "sft_steps"):
    flags.DEFINE_integer(name, None, "Runner flag, ignored.")
  for name in ("max_grad_norm", "epsilon", "temperature"):
    flags.DEFINE_float(name, None, "Runner flag, ignored.")


if __name__ == "__main__":
  from absl import app  # pylint: disable=import-outside-toplevel
  define_flags()
  app.run(main)
