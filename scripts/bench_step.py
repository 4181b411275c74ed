r"""Time per GRPO update step, tokens/s and peak memory per device, over mesh shapes and model sizes.

  python scripts/bench_step.py                                   # CPU: 8 fake devices, tiny and small models
  python scripts/bench_step.py --sizes small --meshes data:8 fsdp:8 data:2,fsdp:2,tensor:2 --steps 10
  python scripts/bench_step.py --sizes qwen2.5-0.5b --dtype bfloat16 --batch 16 --length 512 --remat \
      --meshes data:1                                            # on a GPU: adds the update step's MFU

One update step is `training.make_train_step(grpo_objective)` on a GRPO batch of `--batch` sequences of
`--length` tokens (random, with a completion mask), params and optimiser state placed by the rules
(`grpo_jax.partitioning`). The step is compiled and run once, then timed `--steps` times; the median is
reported. Peak memory is the device's `peak_bytes_in_use` where the backend reports it (GPU, TPU),
else XLA's compile-time estimate per device (arguments + outputs + temporaries − donated aliases).
MFU (accelerators only) = model FLOPs of the step / time / peak FLOPs of the devices, with model FLOPs
= 6 · (non-embedding params + unembedding) · tokens + 12 · layers · heads · head_dim · length · tokens
(forward + backward, causal attention counted in full as is customary).
"""

import argparse
import os
import statistics
import time

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  # Fake CPU devices (only the host platform reads this flag; accelerators are unaffected).
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from grpo_jax import chips, models, partitioning, training  # noqa: E402
from grpo_jax.models import presets  # noqa: E402
from grpo_jax.training import update as update_lib  # noqa: E402

SIZES = {
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, tie_word_embeddings=True, qkv_bias=True),
    "small": dict(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True, qkv_bias=True),
    "qwen2.5-0.5b": presets.PRESETS["qwen2.5-0.5b"],  # 494M parameters
}
DEFAULT_RULES = {"data": "dp", "fsdp": "fsdp", "tensor": "fsdp_tp"}


def model_flops(config: models.ModelConfig, num_sequences: int, length: int) -> float:
  """Training FLOPs (forward + backward) of one step, the usual 6·N·tokens plus attention."""
  c = config
  attn = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
  mlp = 3 * c.hidden_size * c.intermediate_size
  matmul_params = c.num_hidden_layers * (attn + mlp) + c.vocab_size * c.hidden_size  # + unembedding
  tokens = num_sequences * length
  attention = 12 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * length * tokens
  return 6.0 * matmul_params * tokens + attention


def grpo_batch(config: models.ModelConfig, n: int, length: int, prompt: int) -> training.Batch:
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, config.vocab_size, (n, length)).astype(np.int32)
  attention = np.ones((n, length), bool)
  loss_mask = np.zeros((n, length), bool)
  loss_mask[:, prompt:] = True
  old = (-rng.uniform(1, 4, (n, length)) * loss_mask).astype(np.float32)
  ref = (old + 0.05 * rng.normal(size=(n, length)) * loss_mask).astype(np.float32)
  adv = (np.repeat(rng.normal(size=(n, 1)), length, 1) * loss_mask).astype(np.float32)
  return training.Batch(tokens, attention, loss_mask, old, ref, adv)


def mesh_for(spec: str):
  """The mesh of a spec: over the first N devices for fixed sizes, over all with a -1."""
  devices = jax.devices()
  if "-1" not in spec:
    sizes = [int(part.split(":")[1]) for part in spec.split(",") if part.strip()]
    devices = devices[:int(np.prod(sizes))]
  return partitioning.make_mesh(spec, devices)


def rules_for(mesh, name: str | None) -> str:
  if name:
    return name
  used = [axis for axis, size in mesh.shape.items() if size > 1]
  return DEFAULT_RULES[used[-1]] if used else "dp"


def peak_memory(compiled, devices) -> tuple[float, str]:
  stats = [d.memory_stats() for d in devices]
  if all(s and "peak_bytes_in_use" in s for s in stats):
    return max(s["peak_bytes_in_use"] for s in stats), "measured"
  m = compiled.memory_analysis()
  estimate = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
  return float(estimate), "XLA estimate"


def bench(size: str, spec: str, args) -> dict:
  overrides = dict(dtype=args.dtype, param_dtype=args.dtype, remat=args.remat)
  config = models.ModelConfig(**SIZES[size], **overrides)
  mesh = mesh_for(spec)
  rules_name = rules_for(mesh, args.rules)
  rules = partitioning.get_rules(rules_name)
  optimizer = training.make_optimizer(1e-5, max_grad_norm=1.0)
  params = partitioning.init_params(config, jax.random.key(0), mesh, rules)
  num_params = sum(x.size for x in jax.tree.leaves(params))
  state, shardings = partitioning.init_train_state(params, optimizer, mesh, rules, donate=True)
  objective = update_lib.bind(training.grpo_objective, config=config, use_reference=True,
                              chunk_size=args.logprob_chunk, loss_kwargs=dict(epsilon=0.2, beta=0.04))
  batch_sharding = partitioning.batch_sharding(mesh, rules)
  step = training.make_train_step(objective, optimizer, args.grad_accum, state_shardings=shardings,
                                  batch_shardings=batch_sharding, mesh=mesh, rules=rules)
  batch = partitioning.put(grpo_batch(config, args.batch, args.length, args.length // 4), batch_sharding)
  compiled = step.program().lower(state, batch).compile()
  state, metrics = compiled(state, batch)  # warm-up (and a check that the step runs)
  jax.block_until_ready(metrics)
  times = []
  for _ in range(args.steps):
    t0 = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - t0)
  seconds = statistics.median(times)
  memory, source = peak_memory(compiled, mesh.devices.flat)
  row = dict(size=size, params=num_params, mesh=spec, rules=rules_name, devices=mesh.devices.size, seconds=seconds,
             tokens_per_s=args.batch * args.length / seconds, memory=memory, memory_source=source)
  device = mesh.devices.flat[0]
  if device.platform != "cpu":
    chip = chips.find(device.device_kind)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else (chip.peak_flops if chip else None)
    if peak:
      row["mfu"] = model_flops(config, args.batch, args.length) / seconds / (peak * mesh.devices.size)
  return row


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=sorted(SIZES))
  parser.add_argument("--meshes", nargs="+", default=["data:1", "data:8", "fsdp:8", "data:2,fsdp:2,tensor:2"],
                      help="mesh specs; data:1 runs on one device")
  parser.add_argument("--rules", default=None, choices=sorted(partitioning.RULES),
                      help="rule preset for every mesh (default: by the mesh's innermost axis > 1)")
  parser.add_argument("--batch", type=int, default=16, help="sequences per update step")
  parser.add_argument("--length", type=int, default=128, help="tokens per sequence (prompt = a quarter)")
  parser.add_argument("--grad_accum", type=int, default=1, help="micro-batches per step")
  parser.add_argument("--logprob_chunk", type=int, default=128)
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--remat", action="store_true", help="rematerialise each layer")
  parser.add_argument("--steps", type=int, default=5, help="timed steps (the median is reported)")
  parser.add_argument("--peak_tflops", type=float, default=0.0, help="peak TFLOP/s per device (default: by kind)")
  args = parser.parse_args()

  devices = jax.devices()
  print(f"{len(devices)} x {devices[0].device_kind} ({devices[0].platform}), jax {jax.__version__}; "
        f"batch {args.batch} x {args.length} tokens, {args.dtype}, remat {args.remat}, "
        f"grad_accum {args.grad_accum}, median of {args.steps} steps\n")
  rows = []
  for size in args.sizes:
    for spec in args.meshes:
      rows.append(bench(size, spec, args))
      r = rows[-1]
      print(f"  {size} {spec} {r['rules']}: {r['seconds'] * 1e3:.1f} ms", flush=True)
  mfu = any("mfu" in r for r in rows)
  print("\n| model | params | mesh | rules | devices | step (ms) | tokens/s | peak memory / device (MiB) |"
        + (" MFU |" if mfu else ""))
  print("|---|---|---|---|---|---|---|---|" + ("---|" if mfu else ""))
  for r in rows:
    line = (f"| {r['size']} | {r['params'] / 1e6:.1f}M | {r['mesh']} | {r['rules']} | {r['devices']} | "
            f"{r['seconds'] * 1e3:.1f} | {r['tokens_per_s']:,.0f} | {r['memory'] / 2**20:.1f} ({r['memory_source']}) |")
    print(line + (f" {100 * r['mfu']:.1f}% |" if "mfu" in r else (" |" if mfu else "")))


if __name__ == "__main__":
  main()
