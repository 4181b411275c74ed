r"""grpo_jax against its PyTorch peers at equal work, side by side in one run (issue #16).

  pip install -e '.[bench]'           # torch, transformers, trl (nothing is installed at import time)
  JAX_PLATFORMS=cpu python scripts/bench_vs_torch.py                  # both parts
  JAX_PLATFORMS=cpu python scripts/bench_vs_torch.py --part sampler --repeats 7
  JAX_PLATFORMS=cpu python scripts/bench_vs_torch.py --part grpo --steps 12
  python scripts/bench_vs_torch.py --part sampler --torch_device=cuda    # on a GPU: JAX's and torch's both

The reference work is one tiny Qwen2 checkpoint (hidden 128, 4 layers, GQA 4:2, character vocabulary of
101, ~0.8M parameters), written once with `grpo_jax.models.save_hf` and loaded in torch with
`transformers.AutoModelForCausalLM`, so both sides run the same weights.

* sampler: `grpo_jax.sampling.sample` against Hugging Face `generate` (KV cache, multinomial sampling at
  temperature 1, no top-k/top-p, no stop tokens: every row makes exactly T tokens), for each size in
  `--sizes` (rows x new tokens; `--prompt_len` prompt tokens, default 16; G = 8 rows per prompt); on one
  device, and with the rows split over a data mesh of `--jax_devices` CPU devices (default: one per core; XLA's
  CPU backend runs each device's program on its own thread, which beats one device's intra-op threading on
  these small ops).
* grpo: one GRPO step (8 prompts x G 8, 16 new tokens, temperature 1, β 0.04, one AdamW step, the loss
  GRPO's seq-mean-token-mean with k3 KL) built from the library's pieces (sample, decode + rule reward on
  the host, group advantages, π_ref forward, update), over every row's prompt + completion as TRL computes it
  ("full"), and with the speed options that `experiments.grpo_math` takes by default ("fast": shared-prompt
  forwards, π_old = stop_gradient(π_θ) on one epoch of one minibatch, and with `--jax_devices` > 1 the
  sampler's rows split over the CPU devices, the samples then moved to the first, as the runner's
  `--cpu_devices` does), against
  `trl.GRPOTrainer` (loss_type="grpo", its π_old likewise the detached current policy) on the same prompts
  and reward, at the best of the torch thread counts tried.

The process runs with the runners' settings on a CPU (`--host_memory=runner`, `grpo_jax.host_memory`: synchronous
CPU dispatch, freed host memory kept); they are the process's, so the peers run with them too (`--host_memory=default`:
JAX's and glibc's defaults for both). Both report medians over repeats after warm-up (compilation excluded), the
machine's float32 matmul GFLOP/s measured in this run by each framework (the fastest of 15 [1024, 1024] products), FLOPs counted from the shapes (matmuls and attention:
2 per multiply-add; the backward as twice the forward), and the fraction of the roofline = FLOPs / time /
the JAX matmul peak. The load average is printed: this benchmark is meant to be read as ratios measured
in one run.
"""

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import host_memory
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import losses, models, partitioning, sampling, training
from grpo_jax.evaluation import decode
from grpo_jax.training import update as update_lib

PROMPT_LEN, GROUP, PROMPTS, NEW_TOKENS, BETA, TEMPERATURE, LR = 16, 8, 8, 16, 0.04, 1.0, 3e-4
ALPHABET = "0123456789+-*= abcdefghij"


def _peers():
  try:
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    sys.exit(f"bench_vs_torch needs the peers: pip install -e '.[bench]' ({err})")
  return torch, transformers


# ---------------------------------------------------------------- machine and FLOPs


def matmul_gflops(torch, n: int = 1024, repeats: int = 15, torch_device: str = "cpu") -> tuple[float, float]:
  """Float32 [n, n] @ [n, n] GFLOP/s, (jax, torch): the fastest of `repeats` after a warm-up (the machine's
  peak; on a shared machine a median measures the neighbours)."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  jax_s = _median(lambda: f(a), repeats, best=True)
  torch.set_num_threads(os.cpu_count())
  t = torch.randn(n, n, device=torch_device)
  torch_s = _median(lambda: _synced(torch, t @ t), repeats, sync=False, best=True)
  return 2 * n ** 3 / jax_s / 1e9, 2 * n ** 3 / torch_s / 1e9


def forward_flops(config, tokens: int, context: float) -> float:
  """Matmul + attention FLOPs of a forward over `tokens` tokens attending to `context` keys on average."""
  e, h, k, d, m, v = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                      config.head_dim, config.intermediate_size, config.vocab_size)
  per_layer = 2 * e * (h * d + 2 * k * d) + 2 * h * d * e + 2 * 3 * e * m + 2 * 2 * h * d * context
  return tokens * (config.num_hidden_layers * per_layer + 2 * e * v)


def step_flops(config, n_rows: int, prompt_len: int, new_tokens: int, n_prompts: int, grouped: bool) -> dict:
  """FLOPs per phase of one GRPO step at full length (no early stops); `grouped`: each prompt runs once in the
  reference forward and the update (`group_size`), else every row runs prompt + completion."""
  l = prompt_len + new_tokens
  prefill = forward_flops(config, n_prompts * prompt_len, (prompt_len + 1) / 2)
  decode_ = forward_flops(config, n_rows * (new_tokens - 1), prompt_len + new_tokens / 2)
  if grouped:
    full = prefill + forward_flops(config, n_rows * new_tokens, prompt_len + (new_tokens + 1) / 2)
  else:
    full = forward_flops(config, n_rows * l, (l + 1) / 2)  # (l + 1) / 2 keys per position on average
  return {"sampling": prefill + decode_, "reference": full, "update": 3 * full}


def load_average() -> str:
  return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _seconds(fn, sync=True) -> float:
  """Wall-clock seconds of one call (waiting for JAX's asynchronous result with `sync`)."""
  start = time.perf_counter()
  out = fn()
  if sync:
    jax.block_until_ready(out)
  return time.perf_counter() - start


def _synced(torch, out):
  """`out`, once the GPU's queued torch work is done (torch's CUDA calls return before it is)."""
  if torch.cuda.is_available():
    torch.cuda.synchronize()
  return out


def _median(fn, repeats, sync=True, best=False):
  out = fn()
  if sync:
    jax.block_until_ready(out)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    if sync:
      jax.block_until_ready(out)
    times.append(time.perf_counter() - start)
  return min(times) if best else statistics.median(times)


# ---------------------------------------------------------------- the shared checkpoint and prompts


def make_checkpoint(path: pathlib.Path):
  models.build_default_checkpoint(path, seed=0, num_hidden_layers=4, hidden_size=128, intermediate_size=384)
  params, config = models.load_hf(path)
  return params, config, models.load_tokenizer(path)


def prompt_texts(n: int, seed: int = 0) -> list[str]:
  rng = np.random.default_rng(seed)
  return ["".join(rng.choice(list(ALPHABET), PROMPT_LEN)) for _ in range(n)]


def reward_fn(completions: list[str]) -> list[float]:
  """A rule reward on text (the fraction of digits), the same on both sides."""
  return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


# ---------------------------------------------------------------- sampler vs generate


def segments_for(new_tokens: int, cache_segments: str) -> int:
  """`--cache_segments`: an int, or "auto": one segment per 8 new tokens, at most 8."""
  return min(8, max(1, new_tokens // 8)) if cache_segments == "auto" else int(cache_segments)


def bench_sampler(params, config, torch_model, torch, sizes, repeats, peak, threads, cache_segments="1",
                  prompt_len=PROMPT_LEN, torch_device="cpu"):
  """HF `generate` against `sampling.sample` on one device and, with several CPU devices, on a data mesh of all."""
  n_dev = len(jax.devices())
  sides = {"1 device": {}}
  if n_dev > 1:
    sides[f"{n_dev} devices"] = dict(mesh=partitioning.make_mesh(f"data:{n_dev}"), rules=partitioning.get_rules("dp"))
  print(f"\n## Sampler vs HF generate ({prompt_len}-token prompts, G = {GROUP}, temperature 1, no stop tokens; "
        f"medians of {repeats} calls each, alternating; HF at the best of torch threads {threads}; speed-up: the median "
        f"of the paired ratios; cache_segments {cache_segments}; grpo_jax on {' and on '.join(sides)} (the rows "
        f"split over a data mesh, the same tokens); load {load_average()})\n")
  print("| rows x new tokens | HF generate s | HF tokens/s | " + " | ".join(
      f"grpo_jax {name} s | tokens/s | speed-up | fraction of decode roofline" for name in sides) + " |")
  print("|---|---|---|" + "---|---|---|---|" * len(sides))
  results = []
  for rows, new in sizes:
    n_prompts = rows // GROUP
    prompt = jax.random.randint(jax.random.key(1), (n_prompts, prompt_len), 5, config.vocab_size)
    mask = jnp.ones_like(prompt, bool)
    key = jax.random.key(2)
    def run_on(kw):
      """One side's call, its arguments placed once as a run holds them (params by the rules, rows split)."""
      p, pr, m = params, prompt, mask
      if kw:
        rows_sharding = partitioning.batch_sharding(kw["mesh"], kw["rules"])
        p, pr, m = partitioning.put((p, pr, m), (partitioning.param_shardings(kw["mesh"], kw["rules"], p),
                                                 rows_sharding, rows_sharding))
      return lambda: sampling.sample(p, config, pr, m, key, num_samples=GROUP, max_new_tokens=new, temperature=1.0,
                                     eos_token_ids=(), cache_segments=segments_for(new, cache_segments), **kw).tokens
    runs = {name: run_on(kw) for name, kw in sides.items()}
    ids = torch.as_tensor(np.repeat(np.asarray(prompt), GROUP, axis=0), dtype=torch.long, device=torch_device)
    attn = torch.ones_like(ids)

    def generate():
      with torch.no_grad():
        return _synced(torch, torch_model.generate(
            input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            max_new_tokens=new, min_new_tokens=new, eos_token_id=None, pad_token_id=config.pad_token_id))
    # HF's best thread count first, then every side timed in alternation (one call each per repeat), so that a
    # change of the machine's speed during the run reaches all: a speed-up is the median of the paired ratios.
    best = min(threads, key=lambda n: (torch.set_num_threads(n), _median(generate, repeats, sync=False))[1])
    torch.set_num_threads(best)
    tokens = {name: np.asarray(jax.block_until_ready(run())) for name, run in runs.items()}  # compiles
    if any((t != tokens["1 device"]).any() for t in tokens.values()):
      sys.exit("bench_vs_torch: the sharded sampler's tokens differ from one device's")
    times = {name: [] for name in (*runs, "hf")}
    for _ in range(repeats):
      for name, run in runs.items():
        times[name].append(_seconds(run))
      times["hf"].append(_seconds(generate, sync=False))
    hf_s, n_tokens = statistics.median(times["hf"]), rows * new
    flops = forward_flops(config, rows, prompt_len + new / 2)  # one decode step, per row
    roofline_tps = peak * 1e9 / (flops / rows)
    cells, ratios = [], {}
    for name in runs:
      jax_s = statistics.median(times[name])
      ratios[name] = statistics.median(h / j for h, j in zip(times["hf"], times[name]))
      cells.append(f"{jax_s:.3f} | {n_tokens / jax_s:,.0f} | {ratios[name]:.2f}x | {n_tokens / jax_s / roofline_tps:.2f}")
    print(f"| {rows} x {new} | {hf_s:.3f} | {n_tokens / hf_s:,.0f} | " + " | ".join(cells) + " |")
    results.append(ratios)
  return results


# ---------------------------------------------------------------- GRPO step: grpo_jax


def jax_grpo(params, config, tokenizer, prompts, steps, fast: bool):
  """Times one GRPO step composed from the library: returns per-phase medians (s).

  fast=False: the work as TRL does it (T = 1: the sampler's log-probs are π_old; π_ref and the update over
  every row's prompt + completion). fast=True: the speed options of issue #16, the runner's defaults, each
  the same step up to float rounding: log-probs at the sampling temperature from the sampler, each
  prompt once in the π_ref forward and the update (`group_size`, `prompt_len`), π_old = stop_gradient(π_θ)
  in the loss (`on_policy`: one epoch, one minibatch), and on several CPU devices the runner's sampler
  placement (the rows over a data mesh of them, the samples back on the first device; the same tokens).
  """
  optimizer = training.make_optimizer(LR, max_grad_norm=1.0)
  loss_kwargs = dict(epsilon=0.2, beta=BETA, kl="k3", aggregation="seq-mean-token-mean")
  speed = dict(group_size=GROUP, prompt_len=PROMPT_LEN) if fast else {}
  objective = update_lib.bind(training.grpo_objective, config=config, loss_kwargs=loss_kwargs, use_reference=True,
                              temperature=TEMPERATURE, **speed, **({"on_policy": True} if fast else {}))
  state = training.init_train_state(jax.tree.map(jnp.copy, params), optimizer)
  step_fn = training.make_train_step(objective, optimizer)
  reference = params  # the train state holds a copy: its params are donated
  ref_logprobs = logprobs_lib.jit_token_logprobs(config, temperature=TEMPERATURE, **speed)
  devices = jax.local_devices()
  split = dict(mesh=partitioning.make_mesh(f"data:{len(devices)}", devices),
               rules=partitioning.get_rules("dp")) if fast and len(devices) > 1 else {}
  times = {k: [] for k in ("sampling", "scoring", "reference", "update", "step")}
  for i in range(steps):
    t0 = time.perf_counter()
    batch_prompts = [prompts[(i * PROMPTS + j) % len(prompts)] for j in range(PROMPTS)]
    tokens, mask, _ = training.encode_prompts(tokenizer, batch_prompts, PROMPT_LEN)
    samples = sampling.sample(state.params, config, tokens, mask, jax.random.key(i), num_samples=GROUP,
                              max_new_tokens=NEW_TOKENS, temperature=TEMPERATURE, eos_token_ids=(),
                              **({"logprobs_at_temperature": True} if fast else {}), **split)
    samples = jax.device_get(samples)  # from here on on the first device, as the runner's `Placement.sampled`
    t1 = time.perf_counter()
    rewards = np.asarray(reward_fn(decode(tokenizer, samples)), np.float32)
    advantages = losses.group_advantages(rewards.reshape(PROMPTS, GROUP)).reshape(-1)
    t2 = time.perf_counter()
    old_logp = jnp.asarray(samples.logprobs)  # T = 1: the sampler's log-probs are π_old
    sequences = logprobs_lib.sequences_from_samples(samples)
    ref_logp = ref_logprobs(reference, *sequences)[:, PROMPT_LEN:]
    batch = training.batch_from_samples(samples, jnp.asarray(samples.mask), old_logp, ref_logp, advantages)
    jax.block_until_ready(batch)
    t3 = time.perf_counter()
    state, metrics = step_fn(state, batch)
    jax.block_until_ready(metrics)
    t4 = time.perf_counter()
    for k, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
      times[k].append(dt)
  return {k: statistics.median(v[2:]) for k, v in times.items()}


# ---------------------------------------------------------------- GRPO step: TRL


def trl_grpo(path, tokenizer, prompts, steps, torch, threads):
  import datasets  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  import trl  # pylint: disable=import-outside-toplevel

  class Timer(transformers.TrainerCallback):
    def __init__(self):
      self.times, self.start = [], None

    def on_step_begin(self, args, state, control, **kwargs):
      self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
      self.times.append(time.perf_counter() - self.start)

  def reward(completions, **kwargs):
    return reward_fn(completions)

  model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  model.generation_config.eos_token_id = None
  out = tempfile.mkdtemp(prefix="bench_trl_")
  args = trl.GRPOConfig(
      output_dir=out, per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
      max_completion_length=NEW_TOKENS, temperature=TEMPERATURE, top_k=0, top_p=1.0, beta=BETA, loss_type="grpo",
      num_iterations=1, steps_per_generation=1, gradient_accumulation_steps=1, learning_rate=LR, max_grad_norm=1.0,
      adam_beta2=0.95, max_steps=steps, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
      bf16=False, fp16=False, disable_dropout=True, shuffle_dataset=False, dataloader_num_workers=0, seed=0,
      generation_kwargs={"min_new_tokens": NEW_TOKENS, "eos_token_id": None})
  data = datasets.Dataset.from_dict({"prompt": [prompts[i % len(prompts)] for i in range(steps * PROMPTS)]})
  timer = Timer()
  trainer = trl.GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                            processing_class=tokenizer, callbacks=[timer])
  torch.set_num_threads(threads)
  trainer.train()
  lengths = [r["completions/mean_length"] for r in trainer.state.log_history if "completions/mean_length" in r]
  if lengths and min(lengths) != NEW_TOKENS:  # equal work: every completion is NEW_TOKENS long
    print(f"warning: TRL completions averaged {min(lengths)} tokens, not {NEW_TOKENS}")
  return statistics.median(timer.times[2:])


def bench_grpo(params, config, tokenizer, path, torch, steps, peak, threads, variants):
  prompts = prompt_texts(PROMPTS * steps)
  variants = {name: name == "fast" for name in variants}
  jax_times = {name: jax_grpo(params, config, tokenizer, prompts, steps, fast) for name, fast in variants.items()}
  trl_by_threads = {n: trl_grpo(path, tokenizer, prompts, steps, torch, n) for n in threads}
  trl_s = min(trl_by_threads.values())
  flops = {name: step_flops(config, PROMPTS * GROUP, PROMPT_LEN, NEW_TOKENS, PROMPTS, fast)
           for name, fast in variants.items()}
  # The step's work as TRL does it (every row runs its prompt), whichever variants run.
  work = sum(step_flops(config, PROMPTS * GROUP, PROMPT_LEN, NEW_TOKENS, PROMPTS, False).values())
  print(f"\n## GRPO step at equal work ({PROMPTS} prompts x G {GROUP}, {NEW_TOKENS} new tokens, temperature "
        f"{TEMPERATURE}, β {BETA}; median of {steps - 2} steps after 2 warm-up; load {load_average()})\n")
  print("TRL seconds per step by torch threads: " + ", ".join(f"{n}: {s:.3f}" for n, s in trl_by_threads.items()))
  print("\n| phase | " + " | ".join(f"{n} GFLOP | {n} s | {n} fraction of roofline" for n in variants) + " |")
  print("|---|" + "---|---|---|" * len(variants))
  for phase in ("sampling", "scoring", "reference", "update", "step"):
    cells = []
    for name in variants:
      f = sum(flops[name].values()) if phase == "step" else flops[name].get(phase, 0.0)
      s = jax_times[name][phase]
      cells.append(f"{f / 1e9:.2f} | {s:.3f} | {f / s / 1e9 / peak:.2f}")
    print(f"| {phase} | " + " | ".join(cells) + " |")
  print(f"\n| | seconds per GRPO step | steps/s | vs TRL | step GFLOP (as run) | fraction of roofline |")
  print("|---|---|---|---|---|---|")
  print(f"| TRL GRPOTrainer (best of torch threads) | {trl_s:.3f} | {1 / trl_s:.2f} | 1.00x | {work / 1e9:.2f} | "
        f"{work / trl_s / 1e9 / peak:.2f} |")
  for name in variants:
    s, f = jax_times[name]["step"], sum(flops[name].values())
    print(f"| grpo_jax, {name} | {s:.3f} | {1 / s:.2f} | {trl_s / s:.2f}x | {f / 1e9:.2f} | "
          f"{f / s / 1e9 / peak:.2f} |")
  return {name: trl_s / jax_times[name]["step"] for name in variants}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--part", choices=["all", "sampler", "grpo"], default="all")
  parser.add_argument("--repeats", type=int, default=5, help="sampler: timed calls per size")
  parser.add_argument("--steps", type=int, default=10, help="GRPO: steps per framework (the first 2 warm up)")
  parser.add_argument("--variants", default="full,fast", help="GRPO: grpo_jax compositions to time")
  parser.add_argument("--sizes", default="64x16,64x64,256x16,256x64", help="sampler: rows x new tokens")
  parser.add_argument("--prompt_len", type=int, default=PROMPT_LEN, help="sampler: prompt tokens per row")
  parser.add_argument("--cache_segments", default="auto",
                      help="sampler: sampling.sample's cache_segments, an int or auto (T // 8, at most 8)")
  parser.add_argument("--torch_threads", default=f"1,{os.cpu_count()}",
                      help="torch intra-op thread counts to try; the peers' best is reported")
  parser.add_argument("--jax_devices", type=int, default=os.cpu_count(),
                      help="sampler: also time the sampler with its rows split over this many CPU devices (a data "
                           "mesh, jax_num_cpu_devices), beside one device; 1: one device only")
  parser.add_argument("--torch_device", choices=["cpu", "cuda"], default="cpu",
                      help="sampler: where HF generate runs (cuda: on the GPU, beside JAX's default device there)")
  parser.add_argument("--host_memory", choices=["runner", "default"], default="runner",
                      help="runner: the runners' process settings on a CPU (grpo_jax.host_memory: synchronous dispatch, "
                           "freed memory kept), which the peers in this process share; default: JAX's and glibc's")
  args = parser.parse_args()
  if args.jax_devices < 1:
    parser.error(f"--jax_devices must be >= 1, got {args.jax_devices}")
  jax.config.update("jax_num_cpu_devices", args.jax_devices)  # before any JAX computation; CPU backend only
  if args.host_memory == "runner" and host_memory.cpu_only():
    host_memory.retain_freed_memory()  # as the runners' main() does; the process's, so torch's too
  unknown = set(args.variants.split(",")) - {"full", "fast"}
  if unknown:
    parser.error(f"--variants: unknown {', '.join(sorted(unknown))}; expected full and/or fast")
  torch, transformers = _peers()
  if args.torch_device == "cuda" and not torch.cuda.is_available():
    parser.error("--torch_device=cuda: torch sees no CUDA device")
  if args.torch_device == "cuda" and args.part != "sampler":
    parser.error("--torch_device=cuda times the sampler part only (--part=sampler)")
  threads = [int(n) for n in args.torch_threads.split(",")]
  trl = None
  if args.part in ("all", "grpo"):
    import trl  # pylint: disable=import-outside-toplevel
  path = pathlib.Path(tempfile.mkdtemp(prefix="bench_vs_torch_")) / "tiny"
  params, config, tokenizer = make_checkpoint(path)
  n_params = sum(x.size for x in jax.tree.leaves(params))
  jax_peak, torch_peak = matmul_gflops(torch, torch_device=args.torch_device)
  print(f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__}, transformers "
        f"{transformers.__version__}" + (f", trl {trl.__version__}" if trl else "") +
        f"; {os.cpu_count()} cores, load average {load_average()}; devices: jax {jax.devices()[0].device_kind}, "
        f"torch {torch.cuda.get_device_name() if args.torch_device == 'cuda' else 'cpu'}")
  print(f"model: {n_params / 1e6:.2f}M params (hidden {config.hidden_size}, {config.num_hidden_layers} layers, "
        f"GQA {config.num_attention_heads}:{config.num_key_value_heads}, vocab {config.vocab_size}), float32")
  print(f"float32 matmul 1024^3: jax {jax_peak:.1f} GFLOP/s, torch {torch_peak:.1f} GFLOP/s "
        f"(roofline fractions below use jax's)")
  if args.part in ("all", "sampler"):
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch_model = torch_model.to(args.torch_device).eval()
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    bench_sampler(params, config, torch_model, torch, sizes, args.repeats, jax_peak, threads, args.cache_segments,
                  args.prompt_len, args.torch_device)
  if args.part in ("all", "grpo"):
    bench_grpo(params, config, tokenizer, path, torch, args.steps, jax_peak, threads, args.variants.split(","))
  print(f"\nload average at the end: {load_average()}")


if __name__ == "__main__":
  main()
