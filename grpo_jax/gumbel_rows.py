"""Rows of `jax.random.gumbel(key, (total, V))`, computing only those rows, bit for bit.

A sampler whose batch is split over devices draws the whole batch's Gumbel noise on each device and keeps its
own rows, so that the tokens do not depend on the split; that is D times the draws, and on the CPU JAX's
threefry runs as a rolled loop of five passes over the whole array. With JAX's partitionable threefry
(`jax_threefry_partitionable`, the default), element i of a [total, V] draw is threefry-2x32(key, (0, i)) for
its row-major index i < 2^32; this module hashes only the wanted rows' indices, with the 20 rounds unrolled
into one fused pass, and maps the bits to Gumbel noise as `jax.random.gumbel` does (mode "low": float32
uniforms in [tiny, 1) from the 23 high bits, then -log(-log(u))).

Threefry-2x32 (20 rounds): Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011.
Where JAX would draw differently (another PRNG, the non-partitionable stream, another dtype or Gumbel mode, more
than 2^32 elements), `gumbel_rows` draws the whole array with `jax.random.gumbel` and slices it: the same values,
the old cost.
"""

import jax
import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))  # the two alternating groups of four rounds
_PARITY = np.uint32(0x1BD11BDA)  # the key schedule's constant


def threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Threefry-2x32 with 20 rounds of the counter words (x0, x1) under the key (k0, k1); uint32, broadcasting.

  Five groups of four rounds (x0 += x1; x1 = rotl(x1, r) ^ x0), each followed by a key injection
  (x0 += ks[s % 3], x1 += ks[(s + 1) % 3] + s for s = 1 ... 5, ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)).
  """
  rotl = lambda v, r: (v << np.uint32(r)) | (v >> np.uint32(32 - r))
  ks = (k0, k1, k0 ^ k1 ^ _PARITY)
  x0, x1 = x0 + ks[0], x1 + ks[1]
  for s in range(1, 6):
    for r in _ROTATIONS[(s - 1) % 2]:
      x0 = x0 + x1
      x1 = rotl(x1, r) ^ x0
    x0, x1 = x0 + ks[s % 3], x1 + ks[(s + 1) % 3] + np.uint32(s)
  return x0, x1


def _exact(key: jax.Array, total: int, vocab: int, dtype) -> bool:
  """Whether `jax.random.gumbel(key, (total, vocab), dtype)` is the stream `gumbel_rows` reproduces."""
  typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
  impl = str(jax.random.key_impl(key)) if typed else jax.config.jax_default_prng_impl
  return ("threefry2x32" in impl and jax.config.jax_threefry_partitionable and jnp.dtype(dtype) == jnp.float32
          and not jax.config.jax_high_dynamic_range_gumbel and total * vocab < 2 ** 32)


def gumbel_rows(key: jax.Array, first: jax.Array | int, num_rows: int, shape: tuple[int, int],
                dtype=jnp.float32) -> jax.Array:
  """Rows first ... first + num_rows - 1 of `jax.random.gumbel(key, shape, dtype)`, the same bits.

  Args:
    key: a PRNG key (typed, or a raw uint32[2] key of the default implementation).
    first: the first row (may be traced, e.g. a shard's `axis_index` times its rows).
    num_rows: how many rows (static).
    shape: (total rows, V) of the whole draw.
    dtype: a float dtype.

  Returns:
    [num_rows, V] Gumbel(0, 1) noise.
  """
  total, vocab = shape
  if not _exact(key, total, vocab, dtype):
    whole = jax.random.gumbel(key, shape, dtype)
    return jax.lax.dynamic_slice_in_dim(whole, first, num_rows)
  k0, k1 = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
  row = jnp.asarray(first, jnp.uint32) + jnp.arange(num_rows, dtype=jnp.uint32)
  index = row[:, None] * np.uint32(vocab) + jnp.arange(vocab, dtype=jnp.uint32)  # the row-major counter's low word
  b0, b1 = threefry2x32(k0, k1, jnp.zeros_like(index), index)
  mantissa = ((b0 ^ b1) >> np.uint32(9)) | np.uint32(0x3F800000)  # a float in [1, 2)
  tiny = np.float32(np.finfo(np.float32).tiny)
  uniform = jnp.maximum(tiny, (jax.lax.bitcast_convert_type(mantissa, jnp.float32) - np.float32(1)) * (1 - tiny) + tiny)
  return -jnp.log(-jnp.log(uniform))
