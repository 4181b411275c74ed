r"""Rollouts with a long tail of completion lengths: the static sampler, the rollout engine and their peers (#52).

  JAX_PLATFORMS=cpu python scripts/bench_rollout.py                         # tiny model, both workloads
  JAX_PLATFORMS=cpu python scripts/bench_rollout.py --peers=hf --vllm_python=/work/vllm_venv/bin/python
  JAX_PLATFORMS=cpu python scripts/bench_rollout.py --model=0.5b --prompts=8 --samples=4 --max_new_tokens=64
  JAX_PLATFORMS=cpu python scripts/bench_rollout.py --part=runner     # the runner on the 1-8-operation task
  JAX_PLATFORMS=cpu python scripts/bench_rollout.py --part=runner --runner_issue_commit=14ef70e   # vs #53's run
  JAX_PLATFORMS=cpu python scripts/bench_rollout.py --part=runner --runner_issue_commit=14ef70e --runner_cache=warm

The work: `--prompts` prompts of `--prompt_len` random tokens x `--samples` completions each, sampled at
temperature 1 (no top-k/top-p). Each completion's length is set ahead by a benchmark-only stop schedule, the same
for every engine: `tail`, log-normal with median `--median` tokens and `--at_cap` of them at the `--max_new_tokens`
cap (σ = ln(cap / median) / Φ⁻¹(1 - at_cap)), rounded and clipped to [1, cap]; `equal`, every completion at the cap.
Our samplers take the schedule as `max_lengths` (a completion ends at its own cap), Hugging Face `generate` as a
logits processor that forces the end token at a row's length, vLLM as per-request min_tokens = max_tokens
(`scripts/bench_rollout_peers.py`, run in vLLM's own venv: `scripts/setup_vllm_cpu.sh`). Every run's lengths are
checked against the schedule.

Reported: useful tokens per second (generated, not padded: the schedule's sum), mean ± s.e. over `--repeats`
after a warm-up (compilation excluded), each engine's ratio to the static sampler paired repeat by repeat, and the
fraction of the roofline: the FLOPs the useful tokens need (matmuls and attention over their own context, 2 per
multiply-add) / time / the machine's float32 matmul GFLOP/s measured in this run. As the runner does, our
samplers split their rows over `--jax_devices` CPU devices (default one per core), one engine per device.
"""

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

_DEVICES = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--jax_devices=")), os.cpu_count() or 1))
if __name__ == "__main__":  # CPU devices before JAX starts (imported, e.g. by gpu_check, it changes nothing)
  os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={_DEVICES}")

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
from scipy import stats  # pylint: disable=wrong-import-position

from grpo_jax import models, partitioning, rollout_engine, sampling  # pylint: disable=wrong-import-position
from grpo_jax.models import presets  # pylint: disable=wrong-import-position
from grpo_jax.models import tiny  # pylint: disable=wrong-import-position

HERE = pathlib.Path(__file__).parent
SHAPES = {  # the tiny checkpoint of bench_vs_torch, and Qwen2.5-0.5B's sizes (random weights: no hub here)
    "tiny": dict(num_hidden_layers=4, hidden_size=128, intermediate_size=384),
    "0.5b": presets.sizes("qwen2.5-0.5b"),
}


def schedule(kind: str, n: int, cap: int, median: float, at_cap: float, seed: int = 0) -> np.ndarray:
  """[n] completion lengths in [1, cap]: `tail` log-normal (median, P(>= cap) = at_cap), `equal` all at cap."""
  if kind == "equal":
    return np.full(n, cap, np.int32)
  sigma = np.log(cap / median) / stats.norm.ppf(1 - at_cap)
  draw = np.exp(np.random.default_rng(seed).normal(np.log(median), sigma, n))
  return np.clip(np.round(draw), 1, cap).astype(np.int32)


def useful_flops(config, prompt_len: int, lengths: np.ndarray) -> float:
  """Matmul + attention FLOPs of decoding each completion's tokens, token t attending to P + t keys."""
  e, h, k, d, m, v = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                      config.head_dim, config.intermediate_size, config.vocab_size)
  matmul = config.num_hidden_layers * (2 * e * (h * d + 2 * k * d) + 2 * h * d * e + 6 * e * m) + 2 * e * v
  lengths = np.asarray(lengths, np.float64)  # int32 lengths times a 0.5B model's FLOPs per token would overflow
  keys = prompt_len * lengths + lengths * (lengths - 1) / 2  # Σ_t (P + t)
  return float(np.sum(matmul * lengths + config.num_hidden_layers * 4 * h * d * keys))


def matmul_gflops(n: int = 1024, repeats: int = 15) -> float:
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  jax.block_until_ready(f(a))
  best = min(_seconds(lambda: f(a)) for _ in range(repeats))
  return 2 * n ** 3 / best / 1e9


def _seconds(fn) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def mean_se(xs) -> tuple[float, float]:
  xs = list(xs)
  return statistics.mean(xs), (statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan"))


def placed(params, config, prompt_shape, args, mesh):
  """The params on the samplers' shardings of `mesh` (None: as they are), placed once as the runner holds them:
  a sampler's call would otherwise copy every tensor onto the mesh, host work that a short call cannot hide."""
  if mesh is None:
    return params
  rules = partitioning.get_rules("dp")
  return partitioning.put(params, sampling.placements(mesh, rules, config, prompt_shape, args.samples,
                                                      args.max_new_tokens)[0])


def ours(params, config, tokens, lengths, args, mesh):
  """name -> fn() for the static sampler and the engine at each slot count (0: its default)."""
  rules = partitioning.get_rules("dp") if mesh is not None else None
  params = placed(params, config, tokens.shape, args, mesh)
  key = jax.random.key(0)
  common = dict(num_samples=args.samples, max_new_tokens=args.max_new_tokens, temperature=1.0, eos_token_ids=(),
                max_lengths=lengths)
  mask = np.ones(tokens.shape, bool)
  segments = min(8, max(1, args.max_new_tokens // 8))
  fns = {"static": lambda: sampling.sample(params, config, tokens, mask, key, cache_segments=segments,
                                           mesh=mesh, rules=rules, **common)}
  for slots in args.slots:
    name = "engine" + ("" if not slots else f" ({slots} slots)")
    fns[name] = (lambda s: lambda: rollout_engine.generate(params, config, tokens, mask, key, num_slots=s,
                                                           mesh=mesh, rules=rules, **common))(slots)
  return fns


def peer(name, args, ckpt, workload) -> dict:
  python = args.vllm_python if name == "vllm" else sys.executable
  cmd = [python, str(HERE / "bench_rollout_peers.py"), f"--engine={name}", f"--model_dir={ckpt}",
         f"--workload={workload}", f"--repeats={args.repeats}"]
  # HF: the fastest of 1 and 2 torch threads; vLLM: its own thread binding (on 2 cores it keeps one for its
  # scheduler: binding both measured ~10x slower).
  cmd += ["--threads=1,2"] if name == "hf" else []
  out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
  if out.returncode or not lines:
    return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1][:200]}
  return json.loads(lines[-1])


RUNNER_TASK = ["--synthetic_min_steps=1", "--synthetic_max_steps=8", "--max_prompt_len=64", "--max_new_tokens=192",
               "--batch_size=16", "--group_size=8", "--num_test=64", "--eval_batch_size=64", "--eval_every=0",
               "--tensorboard=false", "--compilation_cache_dir="]  # every variant compiles its own programs


RUNNER_VARIANTS = {  # name -> flags: the baseline first
    "static sampler, widths multiple of 4": ["--sampler=static"],
    "engine, widths multiple of 4": ["--sampler=engine"],
    "engine, widths doubling": ["--sampler=engine", "--completion_widths=doubling"],
    "engine, length buckets": ["--sampler=engine", "--token_layout=buckets"],
    "engine, length buckets, 3 widths": ["--sampler=engine", "--token_layout=buckets", "--bucket_widths=3"],
    "engine, length buckets, scanned layers": ["--sampler=engine", "--token_layout=buckets", "--scan_layers"],
    "engine, length buckets, 3 widths, not compiled ahead": ["--sampler=engine", "--token_layout=buckets",
                                                             "--bucket_widths=3", "--compile_ahead=false"],
}


def runner(args) -> None:
  """The runner on the 1-8-operation synthetic task, where lengths vary by themselves: one SFT policy, then
  `--runner_steps` GRPO steps from it for each variant (no persistent compilation cache): each step's sampling
  seconds (`train/time_sampling`), the stage-2 seconds (the last step's record time less the start evaluation's,
  compilation included; with `--compile_ahead` some of the first step's compiling runs beside the start
  evaluation, before that record), the whole run's seconds (the process, from start to exit: loading, the start
  and final evaluations and the export included) and the distinct training widths. `--runner_issue_commit=REV`
  adds, as the baseline, the same command run from a git worktree at REV with that commit's defaults (issue #53's
  12 steps as the issue measured them), so the ratios to it come from one sitting. `--runner_cache=warm` measures
  every variant's second run instead: each runs once first, unmeasured, into a compilation cache of its own, and
  its measured runs load their programs from it (a researcher's next run of the same shapes)."""
  tmp = pathlib.Path(tempfile.mkdtemp())
  trees = {}  # variant name -> the checkout it runs from (None: this one)
  if args.runner_issue_commit:  # the baseline: the issue's command as it ran at the commit it was measured at
    tree = tmp / "at_commit"
    added = subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.runner_issue_commit],
                           capture_output=True, text=True, cwd=pathlib.Path(__file__).resolve().parent.parent)
    if added.returncode:
      sys.exit(f"bench_rollout: --runner_issue_commit={args.runner_issue_commit}: no worktree: "
               f"{(added.stderr.strip().splitlines() or ['git failed'])[-1]}")
    trees[f"the issue's command at {args.runner_issue_commit} (its defaults)"] = tree

  def run(work, *flags, cwd=None):
    try:
      subprocess.run([sys.executable, "-m", "experiments.grpo_math", f"--work_dir={work}", *RUNNER_TASK, *flags],
                     check=True, capture_output=True, text=True, cwd=cwd)
    except subprocess.CalledProcessError as e:
      last = (e.stderr.strip().splitlines() or ["no output"])[-1]
      sys.exit(f"bench_rollout: a runner failed ({cwd or 'this checkout'}): {last}")

  def stop(signum, _):  # SIGTERM as an exit, so the worktree goes (subprocess.run kills the run in flight)
    sys.exit(f"bench_rollout: stopped by {signal.Signals(signum).name}")

  signal.signal(signal.SIGTERM, stop)
  try:
    _runner_rounds(args, tmp, trees, run)
  finally:  # a failed or stopped run too: no worktree left behind in `git worktree list`
    for tree in trees.values():
      subprocess.run(["git", "worktree", "remove", "--force", str(tree)], check=False, capture_output=True,
                     cwd=pathlib.Path(__file__).resolve().parent.parent)


def _runner_rounds(args, tmp: pathlib.Path, trees: dict, run) -> None:
  """`runner`'s SFT policy, its rounds of the variants, and the table."""
  start = time.perf_counter()
  run(tmp / "sft", "--steps=0", f"--sft_steps={args.runner_sft_steps}")
  print(f"runner: SFT policy in {time.perf_counter() - start:.0f} s; flags {' '.join(RUNNER_TASK)}")
  variants = {name: [] for name in trees}
  variants.update({name: flags for i, (name, flags) in enumerate(RUNNER_VARIANTS.items())
                   if not args.runner_variants or str(i) in args.runner_variants.split(",")})
  rows = {name: dict(first=[], steady=[], stage2=[], whole=[], scoring=[], widths=0, length=0.0) for name in variants}
  caches = {name: [] for name in variants}  # name -> the flag of its compilation cache, filled (warm) or none (cold)
  for i, (name, flags) in enumerate(variants.items()):
    if args.runner_cache == "warm":
      cache = [f"--compilation_cache_dir={tmp / f'cache{i}'}"]
      run(tmp / f"v{i}fill", f"--init_checkpoint={tmp / 'sft' / 'sft_policy'}", f"--steps={args.runner_steps}", *flags,
          *cache, cwd=trees.get(name))
      if not ((tmp / f"cache{i}").is_dir() and any((tmp / f"cache{i}").iterdir())):
        sys.exit(f"bench_rollout: {name}: its first run left no programs in {tmp / f'cache{i}'}")
      caches[name] = cache
  for round_ in range(args.runner_rounds):  # rounds in turn: a drift of the machine's load hits every variant
    for i, (name, flags) in enumerate(variants.items()):
      work = tmp / f"v{i}r{round_}"
      start = time.perf_counter()
      run(work, f"--init_checkpoint={tmp / 'sft' / 'sft_policy'}", f"--steps={args.runner_steps}", *flags,
          *caches[name], cwd=trees.get(name))
      rows[name]["whole"].append(time.perf_counter() - start)
      records = [json.loads(l) for l in (work / "metrics.jsonl").read_text().splitlines()]
      train = [r for r in records if "train/time_sampling" in r]
      if len(train) < 2:
        sys.exit(f"bench_rollout: {name}: {len(train)} GRPO step records with train/time_sampling in "
                 f"{work / 'metrics.jsonl'} (at least 2 needed: the first step and a later one)")
      r = rows[name]
      r["first"].append(train[0]["train/time_sampling"])
      r["steady"] += [x["train/time_sampling"] for x in train[1:]]
      r["scoring"] += [x["train/time_scoring"] + x["train/time_update"] for x in train[1:]]
      r["stage2"].append(train[-1]["time"] - next(x["time"] for x in records if x["step"] == 0))
      r["widths"] = len({x["train/completion_width"] for x in train})
      r["length"] = statistics.mean(x["train/response_length"] for x in train)
  compiles = "programs from a warm cache" if args.runner_cache == "warm" else "compiles included"
  print(f"| variant | sampling, first step s | sampling, a later step s | scoring + update, a later step s | "
        f"stage 2 s ({args.runner_steps} steps, {compiles}; {args.runner_rounds} rounds) | the whole run s | "
        f"widths compiled | mean completion |")
  print("|---|---|---|---|---|---|---|---|")
  base = next(iter(rows.values()))
  for name, r in rows.items():
    mean, se = mean_se(r["steady"])
    ratio, ratio_se = mean_se(b / e for b, e in zip(base["steady"], r["steady"]))
    stage2, stage2_se = mean_se(r["stage2"])
    speedup, speedup_se = mean_se(b / e for b, e in zip(base["stage2"], r["stage2"]))
    scoring, scoring_se = mean_se(r["scoring"])
    whole, whole_se = mean_se(r["whole"])
    whole_x, whole_x_se = mean_se(b / e for b, e in zip(base["whole"], r["whole"]))
    print(f"| {name} | {statistics.mean(r['first']):.2f} | {mean:.3f} ± {se:.3f} ({ratio:.2f} ± {ratio_se:.2f}x) | "
          f"{scoring:.3f} ± {scoring_se:.3f} | {stage2:.1f} ± {stage2_se:.1f} ({speedup:.2f} ± {speedup_se:.2f}x) | "
          f"{whole:.1f} ± {whole_se:.1f} ({whole_x:.2f} ± {whole_x_se:.2f}x) | {r['widths']} | {r['length']:.1f} |")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--part", choices=("samplers", "runner"), default="samplers")
  parser.add_argument("--runner_steps", type=int, default=12)
  parser.add_argument("--runner_sft_steps", type=int, default=600)
  parser.add_argument("--runner_variants", default="", help="indices into RUNNER_VARIANTS, comma-separated (all)")
  parser.add_argument("--runner_rounds", type=int, default=1, help="runs of each variant, in turn")
  parser.add_argument("--runner_issue_commit", default="",
                      help="also run the task at this commit with its defaults (git worktree), as the baseline")
  parser.add_argument("--runner_cache", choices=("cold", "warm"), default="cold",
                      help="cold: every run compiles its programs; warm: each variant's second run (own cache)")
  parser.add_argument("--model", choices=sorted(SHAPES), default="tiny")
  parser.add_argument("--dtype", default=None, help="float32 (tiny's default) or bfloat16 (0.5b's default)")
  parser.add_argument("--workloads", default="tail,equal")
  parser.add_argument("--prompts", type=int, default=64)
  parser.add_argument("--samples", type=int, default=8)
  parser.add_argument("--prompt_len", type=int, default=12)
  parser.add_argument("--max_new_tokens", type=int, default=512)
  parser.add_argument("--median", type=float, default=100)
  parser.add_argument("--at_cap", type=float, default=0.05)
  parser.add_argument("--slots", default="0", help="engine slot counts, comma-separated (0: its default)")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--jax_devices", type=int, default=_DEVICES)
  parser.add_argument("--peers", default="", help="hf,vllm: run scripts/bench_rollout_peers.py for them (tiny only)")
  parser.add_argument("--vllm_python", default="", help="vLLM venv's python (scripts/setup_vllm_cpu.sh)")
  parser.add_argument("--json", default="", help="also write the figures here")
  args = parser.parse_args()
  args.slots = [int(s) for s in args.slots.split(",")]
  if args.part == "runner":
    if args.runner_steps < 2 or args.runner_rounds < 1 or args.runner_sft_steps < 1:
      sys.exit("bench_rollout: --runner_steps must be >= 2 (a later step is measured), --runner_rounds and "
               "--runner_sft_steps >= 1")
    runner(args)
    return
  dtype = args.dtype or ("bfloat16" if args.model == "0.5b" else "float32")
  tmp = pathlib.Path(tempfile.mkdtemp())
  ckpt = tmp / "ckpt"
  tiny.build_default_checkpoint(ckpt, seed=0, param_dtype=dtype, **SHAPES[args.model])
  params, config = models.load_hf(ckpt, dtype=dtype)
  rng = np.random.default_rng(1)
  tokens = rng.integers(3, min(config.vocab_size, 90), (args.prompts, args.prompt_len)).astype(np.int32)
  n = args.prompts * args.samples
  mesh = partitioning.make_mesh(f"data:{args.jax_devices}") if args.jax_devices > 1 else None
  peak = matmul_gflops()
  print(f"machine: {os.cpu_count()} cores, float32 matmul {peak:.1f} GFLOP/s; {args.model} ({dtype}), "
        f"{args.prompts} prompts x {args.samples} samples, prompt {args.prompt_len}, cap {args.max_new_tokens}; "
        f"jax {jax.__version__} on {args.jax_devices} CPU device(s); load {os.getloadavg()[0]:.1f}")
  results = {}
  for kind in args.workloads.split(","):
    lengths = schedule(kind, n, args.max_new_tokens, args.median, args.at_cap)
    useful = int(lengths.sum())
    flops = useful_flops(config, args.prompt_len, lengths)
    print(f"\n{kind}: {useful} useful tokens (mean {lengths.mean():.1f}, longest {lengths.max()}, "
          f"{(lengths == args.max_new_tokens).mean():.1%} at the cap); padded to the longest: {n * lengths.max()}")
    fns = ours(params, config, tokens, lengths, args, mesh)
    first = {}
    for name, fn in fns.items():  # warm-up (compiles) and a check of the schedule
      start = time.perf_counter()
      np.testing.assert_array_equal(np.asarray(fn().lengths), lengths)
      first[name] = time.perf_counter() - start
    times = {name: [] for name in fns}
    for _ in range(args.repeats):  # interleaved, so that a drift of the machine hits every engine alike
      for name, fn in fns.items():
        times[name].append(_seconds(fn))
    rows = {}
    for name, ts in times.items():
      rate, se = mean_se(useful / t for t in ts)
      ratio, ratio_se = mean_se(s / t for s, t in zip(times["static"], ts))
      rows[name] = dict(tok_s=rate, se=se, vs_static=ratio, vs_static_se=ratio_se,
                        roofline=flops / statistics.mean(ts) / (peak * 1e9), first_call_s=first[name])
    if args.peers and args.model == "tiny":
      workload = tmp / f"{kind}.json"
      workload.write_text(json.dumps({"prompts": tokens.tolist(), "samples_per_prompt": args.samples,
                                      "lengths": lengths.tolist(), "eos_token_id": int(config.eos_token_ids[0])}))
      for name in args.peers.split(","):
        got = peer(name, args, ckpt, workload)
        if "error" in got:
          print(f"  {name}: {got['error']}")
          continue
        rows[name] = dict(tok_s=got["tok_per_s_mean"], se=got.get("tok_per_s_se", float("nan")),
                          roofline=flops * got["tok_per_s_mean"] / useful / (peak * 1e9), version=got.get("version"))
    ours_best = max(rows[k]["tok_s"] for k in rows if k.startswith("engine"))
    print("| engine | useful tok/s | vs static (paired) | roofline | engine's lead | first call s (compiles) |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
      paired = f"{r['vs_static']:.2f} ± {r['vs_static_se']:.2f}x" if "vs_static" in r else ""
      print(f"| {name}{' ' + r['version'] if r.get('version') else ''} | {r['tok_s']:,.0f} ± {r['se']:,.0f} | "
            f"{paired} | {r['roofline']:.1%} | {ours_best / r['tok_s']:.2f}x | "
            + (f"{r['first_call_s']:.1f} |" if "first_call_s" in r else " |"))
    results[kind] = dict(useful_tokens=useful, rows=rows)
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(dict(peak_gflops=peak, args=vars(args), results=results), indent=1))


if __name__ == "__main__":
  main()
