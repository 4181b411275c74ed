"""Decode throughput of the KV-cache sampler against a naive no-cache loop, measured in the same run.

The naive loop runs one jitted full forward over the whole [N, P + T] buffer per
new token (compiled once) and samples from the last real position; the sampler
prefills once and decodes inside a jitted `lax.while_loop`. Stop tokens are
disabled so both produce exactly N * T tokens. Figures are medians over repeats,
after one warm-up (compile) call each.

  python scripts/bench_sampler.py --model tiny --batch 8 --prompt_len 32 --new_tokens 64 --repeats 5
  python scripts/bench_sampler.py --model qwen2.5-0.5b --batch 2 --prompt_len 16 --new_tokens 8 --repeats 3
"""

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp

from grpo_jax import models, sampling
from grpo_jax.models import presets


@functools.partial(jax.jit, static_argnums=1)
def _naive_step(params, config, tokens, mask, t, prompt_len, key):
  """One full forward over the buffer; writes token `t` at column prompt_len + t."""
  logits, _ = models.apply(params, config, tokens, attention_mask=mask)
  last = jax.lax.dynamic_index_in_dim(logits, prompt_len + t - 1, axis=1, keepdims=False)
  tok = jax.random.categorical(jax.random.fold_in(key, t), last, axis=-1).astype(jnp.int32)
  tokens = jax.lax.dynamic_update_slice(tokens, tok[:, None], (0, prompt_len + t))
  mask = jax.lax.dynamic_update_slice(mask, jnp.ones((tokens.shape[0], 1), bool), (0, prompt_len + t))
  return tokens, mask


def naive_generate(params, config, prompt, prompt_mask, key, new_tokens):
  n, p = prompt.shape
  tokens = jnp.concatenate([prompt, jnp.zeros((n, new_tokens), jnp.int32)], axis=1)
  mask = jnp.concatenate([prompt_mask, jnp.zeros((n, new_tokens), bool)], axis=1)
  for t in range(new_tokens):
    tokens, mask = _naive_step(params, config, tokens, mask, t, p, key)
  return jax.block_until_ready(tokens)


def timed(fn, repeats):
  start = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return first, statistics.median(times)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", choices=["tiny", "qwen2.5-0.5b"], default="tiny")
  parser.add_argument("--batch", type=int, default=8, help="rows N (prompts x samples)")
  parser.add_argument("--num_samples", type=int, default=1, help="G samples per prompt (N = batch)")
  parser.add_argument("--prompt_len", type=int, default=32)
  parser.add_argument("--new_tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--cache_segments", type=int, default=1,
                      help="also time sampling.sample(..., cache_segments=k) when k > 1 (decode in k segments)")
  args = parser.parse_args()

  config = models.tiny_config() if args.model == "tiny" else presets.config("qwen2.5-0.5b")  # random weights
  params = jax.block_until_ready(models.init_params(config, jax.random.key(0)))
  n_params = sum(x.size for x in jax.tree.leaves(params))
  n_prompts = args.batch // args.num_samples
  prompt = jax.random.randint(jax.random.key(1), (n_prompts, args.prompt_len), 5, config.vocab_size)
  prompt_mask = jnp.ones_like(prompt, bool).at[0, : args.prompt_len // 2].set(False)  # Some left padding.
  key = jax.random.key(2)
  n_tokens = args.batch * args.new_tokens

  sampler = lambda: sampling.sample(params, config, prompt, prompt_mask, key, num_samples=args.num_samples,
                                    max_new_tokens=args.new_tokens, eos_token_ids=()).tokens
  rows = jnp.repeat(prompt, args.num_samples, axis=0), jnp.repeat(prompt_mask, args.num_samples, axis=0)
  naive = lambda: naive_generate(params, config, *rows, key, args.new_tokens)

  naive_first, naive_time = timed(naive, args.repeats)
  cache_first, cache_time = timed(sampler, args.repeats)
  if args.cache_segments > 1:
    segmented = lambda: sampling.sample(params, config, prompt, prompt_mask, key, num_samples=args.num_samples,
                                        max_new_tokens=args.new_tokens, eos_token_ids=(),
                                        cache_segments=args.cache_segments).tokens
    seg_first, seg_time = timed(segmented, args.repeats)
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, {jax.local_devices()[0].device_kind}; "
        f"model {args.model} ({n_params / 1e6:.1f}M params, float32); N={args.batch} rows "
        f"(G={args.num_samples}), P={args.prompt_len}, T={args.new_tokens}; median of {args.repeats}")
  print("| method | first call s (incl. compile) | median s | tokens/s | speed-up |")
  print("|---|---|---|---|---|")
  print(f"| naive no-cache loop (baseline) | {naive_first:.2f} | {naive_time:.3f} | "
        f"{n_tokens / naive_time:.1f} | 1.00x |")
  print(f"| KV-cache sampler | {cache_first:.2f} | {cache_time:.3f} | {n_tokens / cache_time:.1f} | "
        f"{naive_time / cache_time:.2f}x |")
  if args.cache_segments > 1:
    print(f"| KV-cache sampler, {args.cache_segments} cache segments | {seg_first:.2f} | {seg_time:.3f} | "
          f"{n_tokens / seg_time:.1f} | {naive_time / seg_time:.2f}x |")


if __name__ == "__main__":
  main()
