"""Peak compiled memory of chunked vs naive per-token log-probs at a real vocabulary size.

Compiles (does not run) both versions and reads XLA's memory analysis, so the
naive [B, T, V] float32 log-softmax never has to fit in this machine's RAM.

  python scripts/bench_logprobs.py --batch 8 --length 1024 --vocab 151936 --hidden 64
"""

import argparse
import functools

import jax
import jax.numpy as jnp

from grpo_jax import logprobs, models


def naive_logprobs(params, config, tokens, mask):
  """Full-vocabulary log-softmax, then gather: the baseline."""
  logits, _ = models.apply(params, config, tokens, attention_mask=mask)
  logp_all = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  logp = jnp.take_along_axis(logp_all, tokens[:, 1:, None], axis=-1)[..., 0]
  return jnp.pad(jnp.where(mask[:, 1:] & mask[:, :-1], logp, 0.0), ((0, 0), (1, 0)))


def temp_bytes(fn, *args) -> int:
  stats = jax.jit(fn).lower(*args).compile().memory_analysis()
  return int(stats.temp_size_in_bytes)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--length", type=int, default=1024)
  parser.add_argument("--vocab", type=int, default=151_936)
  parser.add_argument("--hidden", type=int, default=64)
  parser.add_argument("--layers", type=int, default=1)
  parser.add_argument("--chunk_sizes", type=int, nargs="+", default=[64, 128, 256])
  args = parser.parse_args()

  config = models.ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                              num_hidden_layers=args.layers, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=args.hidden // 2, qkv_bias=True, tie_word_embeddings=True)
  params = jax.eval_shape(models.init_params, config, jax.random.key(0))
  tokens = jax.ShapeDtypeStruct((args.batch, args.length), jnp.int32)
  mask = jax.ShapeDtypeStruct((args.batch, args.length), jnp.bool_)
  weights = jax.ShapeDtypeStruct((args.batch, args.length), jnp.float32)

  def forward(fn):
    return lambda p, t, m: fn(p, config, t, m)

  def backward(fn):
    return lambda p, t, m, w: jax.grad(lambda q: jnp.sum(w * fn(q, config, t, m)))(p)

  gib = lambda n: n / 2**30
  full = args.batch * args.length * args.vocab * 4
  print(f"jax {jax.__version__}, backend {jax.default_backend()}; B={args.batch} T={args.length} V={args.vocab} "
        f"hidden={args.hidden} layers={args.layers}; one [B,T,V] float32 array = {gib(full):.2f} GiB")
  base_f = temp_bytes(forward(naive_logprobs), params, tokens, mask)
  base_b = temp_bytes(backward(naive_logprobs), params, tokens, mask, weights)
  print("| method | forward temp GiB | fwd ratio | fwd+bwd temp GiB | fwd+bwd ratio |")
  print("|---|---|---|---|---|")
  print(f"| naive (baseline) | {gib(base_f):.3f} | 1.000 | {gib(base_b):.3f} | 1.000 |")
  for chunk in args.chunk_sizes:
    fn = functools.partial(logprobs.token_logprobs, chunk_size=chunk)
    f = temp_bytes(forward(fn), params, tokens, mask)
    b = temp_bytes(backward(fn), params, tokens, mask, weights)
    print(f"| chunked, chunk_size={chunk} | {gib(f):.3f} | {f / base_f:.3f} | {gib(b):.3f} | {b / base_b:.3f} |")


if __name__ == "__main__":
  main()
