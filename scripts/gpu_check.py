r"""The checks of issue #41 on one GPU, each figure beside its roofline: `scripts/gpu_check.sh` runs them in order.

  python scripts/gpu_check.py roofline --out=$OUT         # this device's measured bf16 matmul and copy rates
  python scripts/gpu_check.py init --out=$OUT             # init_params at Qwen2.5 shapes: compile and run times
  python scripts/gpu_check.py sampler --out=$OUT          # the sampler against HF generate (torch), 0.5B shapes
  python scripts/gpu_check.py grpo --out=$OUT             # a GRPO step through the runner, 0.5B shapes, profiled
  python scripts/gpu_check.py variants --out=$OUT         # the same GRPO step with one knob turned each (no profile)
  python scripts/gpu_check.py fixture --out=$OUT          # a tiny profiled GRPO step: trace_small.json.gz, a test fixture
  python scripts/gpu_check.py table --out=$OUT            # the Markdown table of what the parts wrote
  python scripts/gpu_check.py <part> --out=DIR --smoke    # tiny shapes, for a CPU (tests/scripts/test_gpu_check runs it)

Each part writes `<part>.json` under `--out` (checkpoints and runs under `--scratch`); `table` reads them. The roofline is measured, not taken from a data
sheet: the best of a few [8192, 8192] bf16 products (FLOP/s) and of a few copies of 1 GiB (bytes/s, read + write);
the table gives it as a share of the chip's data sheet (`grpo_jax.chips`) where the chip is known.
Against it:
  init: seconds (the goal: seconds on any backend, as on the CPU).
  sampler: decode limit = T x (weight bytes + KV-cache bytes at the mean length) / copy rate, as a fraction of the
    measured time (N rows, T new tokens, P prompt tokens: the cache holds N x (P + T/2) x L x 2 x K x D values
    at the mean length).
  grpo update: MFU = 6 x params x tokens / time / matmul rate (tokens: rows x (prompt + completion) in the update).
"""

import argparse
import json
import pathlib
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import chips, models, rollout_engine, sampling
from grpo_jax.models import presets
from grpo_jax.models import tiny

# Qwen2.5's sizes over the character tokenizer (random weights: no hub here).
QWEN = {size: presets.sizes(f"qwen2.5-{size}") for size in ("0.5b", "1.5b", "7b")}
SMOKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def config_for(size: str, smoke: bool, **runtime) -> models.ModelConfig:
  return tiny.tiny_config(**(SMOKE if smoke else QWEN[size]), param_dtype="bfloat16", dtype="bfloat16", **runtime)


def weight_bytes(config: models.ModelConfig) -> int:
  shapes = jax.eval_shape(models.init_params, config, jax.random.key(0))
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))


def _best(fn, repeats: int) -> float:
  jax.block_until_ready(fn())
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - start)
  return best


def roofline(args) -> dict:
  n = 512 if args.smoke else 8192
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
  matmul = jax.jit(lambda x: x @ x)
  flops = 2 * n**3 / _best(lambda: matmul(a), 5)
  size = (1 << 20) if args.smoke else (1 << 29)  # bf16 elements: 1 GiB
  x = jnp.ones((size,), jnp.bfloat16)
  copy = jax.jit(lambda y: y + 1)
  copy_rate = 2 * size * 2 / _best(lambda: copy(x), 5)
  return {"device": jax.devices()[0].device_kind, "backend": jax.default_backend(), "jax": jax.__version__,
          "matmul_flops": flops, "copy_bytes_per_s": copy_rate, "attention": attention_check(args.smoke)}


def attention_check(smoke: bool) -> dict:
  """The fused attention `--attention=auto` picks here (cuDNN on a GPU in bf16) against the einsum reference at
  0.5B's head shapes, bf16, padded rows: max |difference| / max |reference| of the output and of dq, dk, dv at real
  queries (bf16 operands: ~1e-2 is rounding, a wrong mask is O(1))."""
  from grpo_jax.models import attention  # pylint: disable=import-outside-toplevel
  impl = attention.resolve("auto", jax.default_backend(), jnp.bfloat16)
  b, l, n, k, d = (2, 16, 4, 2, 16) if smoke else (8, 320, 14, 2, 64)
  keys = jax.random.split(jax.random.key(7), 4)
  q = jax.random.normal(keys[0], (b, l, n, d), jnp.bfloat16)
  kv = [jax.random.normal(x, (b, l, k, d), jnp.bfloat16) for x in keys[1:3]]
  # as the runner's rows: a left-padded prompt, then a right-padded completion; each row its own padding
  left, length = jnp.arange(b) * (l // (4 * b)), jnp.arange(b)[::-1] * (l // (4 * b)) + l // 2
  key_mask = (jnp.arange(l)[None] >= left[:, None]) & (jnp.arange(l)[None] < (left + length)[:, None])
  allowed = key_mask[:, None, :] & jnp.tril(jnp.ones((l, l), bool))[None]
  real = key_mask[:, :, None, None]
  w = jax.random.normal(keys[3], (b, l, n, d), jnp.float32)

  def loss(name, q, k, v):
    out = attention.attend(q, k, v, allowed, implementation=name, causal=True).astype(jnp.float32)
    return jnp.sum(jnp.where(real, out * w, 0)), out

  def run(name):
    (_, out), grads = jax.jit(jax.value_and_grad(lambda *x: loss(name, *x), argnums=(0, 1, 2), has_aux=True))(q, *kv)
    return [jnp.where(real, out, 0)] + [g.astype(jnp.float32) for g in grads]

  got, want = run(impl), run("einsum")
  err = [float(jnp.max(jnp.abs(g - r)) / jnp.max(jnp.abs(r))) for g, r in zip(got, want)]
  return {"implementation": impl, "shape": [b, l, n, k, d], "out": err[0], "dq": err[1], "dk": err[2], "dv": err[3]}


def init(args) -> dict:
  rows = []
  for size in ["0.5b", "1.5b", "7b"][:1 if args.smoke else 3]:
    for scan in (False, True):
      config = config_for(size, args.smoke, scan_layers=scan)
      key = jax.random.key(0)
      start = time.perf_counter()
      compiled = models.init_params.lower(config, key).compile()
      compile_s = time.perf_counter() - start
      run_s = None
      if size == "0.5b":  # run it too (the bigger ones: compile only, the GPU's memory is for the next parts)
        start = time.perf_counter()
        jax.block_until_ready(compiled(key))
        run_s = time.perf_counter() - start
      rows.append({"shape": "smoke" if args.smoke else size, "scan_layers": scan, "compile_s": compile_s,
                   "run_s": run_s, "weight_bytes": weight_bytes(config)})
      print(rows[-1], flush=True)
  return {"rows": rows}


def decode_limit_s(config: models.ModelConfig, rows: int, prompt: int, new: int, copy_rate: float) -> float:
  """T decode steps, each reading the weights and the KV cache at the mean length once."""
  kv = rows * (prompt + new / 2) * config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * 2
  return new * (weight_bytes(config) + kv) / copy_rate


def sampler(args) -> dict:
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  config = config_for("0.5b", args.smoke)
  params = models.init_params(config, jax.random.key(0))
  ckpt = pathlib.Path(args.scratch) / "sampler_ckpt"
  models.save_hf(params, config, ckpt)
  device = "cuda" if torch.cuda.is_available() else "cpu"
  hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).to(device).eval()
  roof = json.loads((pathlib.Path(args.out) / "roofline.json").read_text())
  prompt_len, group = (8, 2) if args.smoke else (64, 8)
  sizes = [(4, 4)] if args.smoke else [(64, 128), (256, 256)]
  rows_out = []
  for rows, new in sizes:
    prompts = jax.random.randint(jax.random.key(1), (rows // group, prompt_len), 5, config.vocab_size - 1)
    mask = jnp.ones_like(prompts, bool)
    run = lambda: sampling.sample(params, config, prompts, mask, jax.random.key(2), num_samples=group,
                                  max_new_tokens=new, eos_token_ids=()).tokens
    jax_s = _best(run, 1 if args.smoke else 2)
    ids = torch.tensor(np.repeat(np.asarray(prompts), group, axis=0), device=device)

    def generate(tokens=new):
      with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=tokens,
                          min_new_tokens=tokens, top_k=0, top_p=1.0, temperature=1.0, pad_token_id=0)
      if device == "cuda":
        torch.cuda.synchronize()
      return out

    generate(4)  # warm-up: torch's kernels and caches, a few steps
    start = time.perf_counter()
    generate()
    hf_s = time.perf_counter() - start
    limit = decode_limit_s(config, rows, prompt_len, new, roof["copy_bytes_per_s"])
    rows_out.append({"rows": rows, "new_tokens": new, "prompt": prompt_len, "jax_s": jax_s, "hf_s": hf_s,
                     "tokens_per_s": rows * new / jax_s, "speedup": hf_s / jax_s, "decode_limit_s": limit,
                     "roofline_fraction": limit / jax_s})
    print(rows_out[-1], flush=True)
  return {"rows": rows_out}


def engine(args) -> dict:
  """The rollout engine beside the static sampler at the 0.5B step's shapes (16 prompts x 8 samples of up to 256
  tokens, prompt 64), with every completion at the cap (equal) and with a long tail of lengths (log-normal, median
  T/5, 5% at the cap; `bench_rollout.schedule`): seconds, useful tokens/s, and the equal case against the decode
  limit; the engine at a few slot counts, and at its default slots with a decode step's q/k/v and gate/up as one
  product each (`--decode_projections=together`)."""
  sys.path.insert(0, str(pathlib.Path(__file__).parent))
  import bench_rollout  # pylint: disable=import-outside-toplevel
  config = config_for("0.5b", args.smoke)
  params = models.init_params(config, jax.random.key(0))
  roof = json.loads((pathlib.Path(args.out) / "roofline.json").read_text())
  (prompts_n, group, new, prompt_len), slot_counts = ((2, 2, 8, 8), (2,)) if args.smoke else ((16, 8, 256, 64),
                                                                                               (32, 64, 128))
  prompts = jax.random.randint(jax.random.key(1), (prompts_n, prompt_len), 5, config.vocab_size - 1)
  mask = jnp.ones_like(prompts, bool)
  n = prompts_n * group
  rows_out = []
  for kind in ("equal", "tail"):
    lengths = bench_rollout.schedule(kind, n, new, new / 5, 0.05)
    common = dict(num_samples=group, max_new_tokens=new, eos_token_ids=(), max_lengths=lengths)
    fns = {"static": lambda: sampling.sample(params, config, prompts, mask, jax.random.key(2), **common)}
    for slots in slot_counts:
      fns[f"engine {slots}"] = (lambda s: lambda: rollout_engine.generate(
          params, config, prompts, mask, jax.random.key(2), num_slots=s, **common))(slots)
    together = config.replace(decode_projections="together")  # q/k/v and gate/up as one product each
    fns["engine (default slots), projections together"] = lambda: rollout_engine.generate(
        params, together, prompts, mask, jax.random.key(2), **common)
    limit = decode_limit_s(config, n, prompt_len, new, roof["copy_bytes_per_s"])
    for name, fn in fns.items():
      seconds = _best(lambda: fn().tokens, 1 if args.smoke else 2)
      rows_out.append({"workload": kind, "sampler": name, "seconds": seconds, "useful_tokens": int(lengths.sum()),
                       "tokens_per_s": float(lengths.sum()) / seconds,
                       "roofline_fraction": limit / seconds if kind == "equal" else None})
      print(rows_out[-1], flush=True)
  return {"rows": rows_out}


def layout(args) -> dict:
  """π_ref scoring and the GRPO update, padded and length-bucketed (`--token_layout`, #53), at the 0.5B step's
  shapes (16 prompts x 8 samples of up to 256 tokens, prompt 64), every completion at the cap (equal) and with a
  long tail (log-normal, median T/5, 5% at the cap): seconds, and the tokens' FLOPs (each prompt once, each
  completion's own tokens; the update 3x the forward) / time / the measured bf16 matmul rate."""
  sys.path.insert(0, str(pathlib.Path(__file__).parent))
  import bench_rollout  # pylint: disable=import-outside-toplevel
  import bench_update_layout  # pylint: disable=import-outside-toplevel
  config = config_for("0.5b", args.smoke)
  params = models.init_params(config, jax.random.key(0))
  roof = json.loads((pathlib.Path(args.out) / "roofline.json").read_text())
  b, g, t, p = (2, 2, 8, 8) if args.smoke else (16, 8, 256, 64)
  shape = argparse.Namespace(prompts=b, samples=g, prompt_len=p, max_new_tokens=t, widths=2 if args.smoke else 4,
                             micro_batches=2 if args.smoke else 8, padded_micro_batches=1,
                             algo="grpo", min_block_tokens=0 if args.smoke else None)  # smoke: blocks of 2 x 4
  rows_out = []
  for kind in ("equal", "tail"):
    lengths = bench_rollout.schedule(kind, b * g, t, t / 5, 0.05)
    forward = bench_update_layout.flops(config, shape, lengths)
    for name, (padded, bucketed, padded_cols, bucketed_cols) in bench_update_layout.programs(
        params, config, shape, lengths).items():
      for layout_name, fn, columns in (("padded", padded, padded_cols), ("buckets", bucketed, bucketed_cols)):
        seconds = _best(fn, 1 if args.smoke else 3)
        work = forward * (3 if name == "update" else 1)
        rows_out.append({"workload": kind, "program": name, "layout": layout_name, "seconds": seconds,
                         "columns": columns, "useful_tokens": int(lengths.sum()),
                         "mfu": work / seconds / roof["matmul_flops"]})
        print(rows_out[-1], flush=True)
  return {"rows": rows_out}


def _rss_bytes(pid: int) -> int:
  try:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def child_env(xla_flags: str = "") -> dict:
  """The environment of a part's child run: the parent's, without JAX_PLATFORMS (gpu_check.sh runs the grpo and
  variants parts' own JAX on the CPU, so that the child gets the GPU's memory, not what the parent's JAX
  preallocated: 75% of it), with `xla_flags` added to XLA_FLAGS."""
  import os  # pylint: disable=import-outside-toplevel
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS", ""), xla_flags]))
  return env


def run_watching_rss(cmd) -> list:
  """Runs `cmd`, echoing its output, with its resident memory sampled every 0.2 s: [(the peak RSS seen up to each
  output line, the line)], so that a peak shows which stage of the run (loading, compiling, a step) it came in."""
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())
  peak = [0]
  done = threading.Event()

  def watch():
    while not done.wait(0.2):
      peak[0] = max(peak[0], _rss_bytes(proc.pid))

  watcher = threading.Thread(target=watch, daemon=True)
  watcher.start()
  timeline = []
  for line in proc.stdout:
    print(line, end="", flush=True)
    peak[0] = max(peak[0], _rss_bytes(proc.pid))
    if line.strip():
      timeline.append((peak[0], line.strip()[:160]))
  done.set()
  if proc.wait():
    raise subprocess.CalledProcessError(proc.returncode, cmd)
  return timeline[-40:]


def grpo(args) -> dict:
  out = pathlib.Path(args.out)
  config = config_for("0.5b", args.smoke)
  scratch = pathlib.Path(args.scratch)
  ckpt = scratch / "grpo_ckpt"
  tiny.build_default_checkpoint(ckpt, **(SMOKE if args.smoke else QWEN["0.5b"]), param_dtype="bfloat16")
  batch, group, new, steps = (2, 2, 8, 4) if args.smoke else (16, 8, 256, 6)
  work = scratch / "grpo_run"
  metrics = scratch / "grpo_metrics.json"
  cmd = [sys.executable, str(pathlib.Path(__file__).parent / "bench_grpo_step.py"), f"--init_checkpoint={ckpt}",
         "--dtype=bfloat16", f"--batch_size={batch}", f"--group_size={group}", f"--max_new_tokens={new}",
         f"--steps={steps}", f"--profile_steps={steps}:{steps}", f"--work_dir={work}", f"--json_out={metrics}"]
  print(" ".join(cmd), flush=True)
  timeline = run_watching_rss(cmd)
  m = json.loads(metrics.read_text())
  roof = json.loads((out / "roofline.json").read_text())
  rows = batch * group
  completion = m.get("train/response_length", new)
  update_tokens = rows * (completion + args.prompt_tokens)
  n_params = sum(x.size for x in jax.tree.leaves(jax.eval_shape(models.init_params, config, jax.random.key(0))))
  result = {"step_s": m["step_s"], "sampling_s": m["train/time_sampling"], "scoring_s": m["train/time_scoring"],
            "update_s": m["train/time_update"], "tokens_per_s": m["train/tokens_per_s"],
            "peak_rss_bytes": m["peak_rss_bytes"], "weight_bytes": weight_bytes(config), "rows": rows,
            "new_tokens": new, "completion_mean": completion, "update_tokens": update_tokens, "params": n_params,
            "update_mfu": 6 * n_params * update_tokens / m["train/time_update"] / roof["matmul_flops"],
            "sampling_roofline_fraction": decode_limit_s(config, rows, args.prompt_tokens, new,
                                                         roof["copy_bytes_per_s"]) / m["train/time_sampling"],
            "rss_by_output_line": timeline}
  traces = sorted((work / "profile").glob("**/*.trace.json.gz"))
  if traces:  # the real accelerator trace, for tests/experiments/runner/test_profiling's fixture
    (out / "trace.json.gz").write_bytes(traces[-1].read_bytes())
    from experiments.runner import profiling  # pylint: disable=import-outside-toplevel
    result["profile_table"] = profiling.format_table(profiling.summarize(traces[-1]), steps=1)
  return result


def fixture(args) -> dict:
  """A profiled GRPO step at tiny shapes (2 layers, 2 x 2 rows, 8 new tokens): a real trace of this backend small
  enough to commit as tests/data's fixture for `profiling.summarize` (the 0.5B step's trace is tens of MB)."""
  out, scratch = pathlib.Path(args.out), pathlib.Path(args.scratch)
  ckpt = scratch / "fixture_ckpt"
  if not ckpt.exists():
    tiny.build_default_checkpoint(ckpt, **SMOKE, param_dtype="bfloat16")
  work = scratch / "fixture_run"
  metrics = scratch / "fixture_metrics.json"
  cmd = [sys.executable, str(pathlib.Path(__file__).parent / "bench_grpo_step.py"), f"--init_checkpoint={ckpt}",
         "--dtype=bfloat16", "--batch_size=2", "--group_size=2", "--max_new_tokens=8", "--steps=2",
         "--profile_steps=2:2", f"--work_dir={work}", f"--json_out={metrics}"]
  print(" ".join(cmd), flush=True)
  subprocess.run(cmd, env=child_env(), check=True)
  traces = sorted((work / "profile").glob("**/*.trace.json.gz"))
  if not traces:
    raise FileNotFoundError(f"no *.trace.json.gz under {work / 'profile'}")
  (out / "trace_small.json.gz").write_bytes(traces[-1].read_bytes())
  from experiments.runner import profiling  # pylint: disable=import-outside-toplevel
  return {"trace_bytes": traces[-1].stat().st_size, "backend": jax.default_backend(),
          "profile_table": profiling.format_table(profiling.summarize(traces[-1]), steps=1)}


# One knob each against the `grpo` part's step, same shapes: what to try next when the step is far from its roofline.
# Measured on an H100 (BENCHMARKS.md) and dropped from here: CUDA graphs over whole while loops (XLA command buffers,
# 0.97x) and `--attention=xla` (the same programs: the runner's GRPO forwards attend against a prompt cache, where
# cuDNN falls back to xla). Next: a decode step's q/k/v and gate/up as one product each (fewer, wider kernels: #52
# asks for at most half of the ~530 a decode step), and cuBLAS for every product instead of XLA's Triton GEMMs.
VARIANTS = (("decode steps: q/k/v and gate/up as one product each", ("--decode_projections=together",), ""),
            ("cuBLAS GEMMs (XLA's Triton GEMM fusions off)", (), "--xla_gpu_enable_triton_gemm=false"))


def variants(args) -> dict:
  """Each variant of VARIANTS as its own process (XLA_FLAGS are read once per process), 4 steps (the median of the
  last 3), within --variant_seconds each; a variant that fails or runs out is a row with its last output line."""
  scratch = pathlib.Path(args.scratch)
  ckpt = scratch / "grpo_ckpt"
  if not ckpt.exists():
    tiny.build_default_checkpoint(ckpt, **(SMOKE if args.smoke else QWEN["0.5b"]), param_dtype="bfloat16")
  batch, group, new, steps = (2, 2, 8, 3) if args.smoke else (16, 8, 256, 4)
  rows = []
  for name, runner_flags, xla_flags in VARIANTS[:1 if args.smoke else None]:
    metrics = scratch / f"variant_{len(rows)}.json"
    cmd = [sys.executable, str(pathlib.Path(__file__).parent / "bench_grpo_step.py"), f"--init_checkpoint={ckpt}",
           "--dtype=bfloat16", f"--batch_size={batch}", f"--group_size={group}", f"--max_new_tokens={new}",
           f"--steps={steps}", f"--work_dir={scratch / f'variant_{len(rows)}'}", f"--json_out={metrics}",
           *runner_flags]
    env = child_env(xla_flags)
    row = {"name": name, "runner_flags": list(runner_flags), "xla_flags": xla_flags}
    start = time.perf_counter()
    try:
      proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.variant_seconds)
      print(proc.stdout[-2000:], proc.stderr[-3000:], flush=True)
      if proc.returncode:
        row["error"] = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
      else:
        m = json.loads(metrics.read_text())
        row.update(step_s=m["step_s"], sampling_s=m["train/time_sampling"], scoring_s=m["train/time_scoring"],
                   update_s=m["train/time_update"])
    except subprocess.TimeoutExpired:
      row["error"] = f"out of time after {args.variant_seconds} s"
    row["wall_s"] = time.perf_counter() - start
    rows.append(row)
    print(row, flush=True)
  return {"rows": rows}


def _fmt(x, spec=".2f"):
  return "-" if x is None else format(x, spec)


def table(args) -> str:
  out = pathlib.Path(args.out)
  read = lambda name: json.loads((out / f"{name}.json").read_text()) if (out / f"{name}.json").is_file() else None
  roof, ini, samp, step = read("roofline"), read("init"), read("sampler"), read("grpo")
  lines = []
  if roof:
    lines.append(f"{roof['device']} ({roof['backend']}, jax {roof['jax']}): measured bf16 matmul "
                 f"{roof['matmul_flops'] / 1e12:.0f} TFLOP/s, copy {roof['copy_bytes_per_s'] / 1e12:.2f} TB/s\n")
  lines += ["| what | measured | against the roofline |", "|---|---|---|"]
  chip = chips.find(roof["device"]) if roof else None
  if chip and chip.hbm_bandwidth:
    lines.append(f"| the roofline itself | bf16 matmul {roof['matmul_flops'] / 1e12:.0f} TFLOP/s, copy "
                 f"{roof['copy_bytes_per_s'] / 1e12:.2f} TB/s | {100 * roof['matmul_flops'] / chip.peak_flops:.0f}% "
                 f"and {100 * roof['copy_bytes_per_s'] / chip.hbm_bandwidth:.0f}% of the data sheet's "
                 f"{chip.peak_flops / 1e12:.0f} TFLOP/s and {chip.hbm_bandwidth / 1e12:.2f} TB/s |")
  att = (roof or {}).get("attention")
  if att:
    lines.append(f"| attention `auto` = {att['implementation']} vs einsum, bf16 {att['shape']} | relative error: "
                 f"out {att['out']:.1e}, dq {att['dq']:.1e}, dk {att['dk']:.1e}, dv {att['dv']:.1e} | - |")
  for r in (ini or {}).get("rows", []):
    run = f", runs in {r['run_s']:.2f} s" if r["run_s"] is not None else ""
    lines.append(f"| init_params {r['shape']}{' scanned' if r['scan_layers'] else ''} | compiles in "
                 f"{r['compile_s']:.1f} s{run} | goal: seconds |")
  if step:
    lines.append(f"| GRPO step, {step['rows']} rows x {step['new_tokens']} new tokens | {step['step_s']:.3f} s "
                 f"(sampling {step['sampling_s']:.3f}, scoring {step['scoring_s']:.3f}, update "
                 f"{step['update_s']:.3f}); {step['tokens_per_s']:,.0f} generated tokens/s | goal 0.5 s |")
    lines.append(f"| its sampling | {step['sampling_s']:.3f} s | {100 * step['sampling_roofline_fraction']:.0f}% "
                 f"of the decode limit |")
    lines.append(f"| its update | {step['update_s']:.3f} s, {step['update_tokens']:,.0f} tokens | "
                 f"{100 * step['update_mfu']:.0f}% MFU (goal 50%) |")
    lines.append(f"| peak host RSS | {step['peak_rss_bytes'] / 2**30:.2f} GiB for "
                 f"{step['weight_bytes'] / 2**30:.2f} GiB of weights | "
                 f"{step['peak_rss_bytes'] / step['weight_bytes']:.1f}x the weights (goal ~2x + a constant) |")
  for r in (samp or {}).get("rows", []):
    lines.append(f"| sampler {r['rows']} x {r['new_tokens']} (prompt {r['prompt']}) | {r['jax_s']:.3f} s, "
                 f"{r['tokens_per_s']:,.0f} tokens/s; HF generate {r['hf_s']:.3f} s ({r['speedup']:.1f}x) | "
                 f"{100 * r['roofline_fraction']:.0f}% of the decode limit (goal 40% at 256 x 256) |")
  for r in (read("engine") or {}).get("rows", []):
    frac = "-" if r["roofline_fraction"] is None else f"{100 * r['roofline_fraction']:.0f}% of the decode limit"
    lines.append(f"| {r['sampler']}, {r['workload']} lengths ({r['useful_tokens']:,} useful tokens) | "
                 f"{r['seconds']:.3f} s, {r['tokens_per_s']:,.0f} useful tokens/s | {frac} |")
  for r in (read("layout") or {}).get("rows", []):
    goal = " (goal 50% for the update)" if r["program"] == "update" else ""
    lines.append(f"| {r['program']}, {r['layout']}, {r['workload']} lengths ({r['columns']:,} columns for "
                 f"{r['useful_tokens']:,} tokens) | {r['seconds']:.3f} s | {100 * r['mfu']:.0f}% of the measured "
                 f"matmul rate on the tokens' FLOPs{goal} |")
  for r in (read("variants") or {}).get("rows", []):
    if "error" in r:
      lines.append(f"| GRPO step, {r['name']} | failed: {r['error']} | - |")
    else:
      ratio = f"{step['step_s'] / r['step_s']:.2f}x the step above" if step else "-"
      lines.append(f"| GRPO step, {r['name']} | {r['step_s']:.3f} s (sampling {r['sampling_s']:.3f}, scoring "
                   f"{r['scoring_s']:.3f}, update {r['update_s']:.3f}) | {ratio} |")
  text = "\n".join(lines)
  if step and step.get("profile_table"):
    text += "\n\nProfile of the last GRPO step:\n\n" + step["profile_table"]
  return text


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("part", choices=["roofline", "init", "sampler", "engine", "layout", "grpo", "variants",
                                       "fixture", "table"])
  parser.add_argument("--out", required=True, help="directory for <part>.json (and the trace)")
  parser.add_argument("--scratch", default="/tmp/gpu_check_scratch",
                      help="checkpoints and run directories (not under --out, which comes back small)")
  parser.add_argument("--smoke", action="store_true", help="tiny shapes (a CPU check of the script itself)")
  parser.add_argument("--prompt_tokens", type=float, default=40.0,
                      help="mean prompt tokens of the GRPO rows, for the update's FLOPs and the decode limit")
  parser.add_argument("--variant_seconds", type=float, default=150.0, help="the time limit of each variant's run")
  args = parser.parse_args()
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  if args.part == "table":
    text = table(args)
    (out / "gpu_check.md").write_text(text + "\n")
    print(text)
    return
  result = {"roofline": roofline, "init": init, "sampler": sampler, "engine": engine, "layout": layout, "grpo": grpo,
            "variants": variants, "fixture": fixture}[args.part](args)
  (out / f"{args.part}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
  main()
