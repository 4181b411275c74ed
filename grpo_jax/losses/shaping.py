"""Reward shaping on completion lengths."""

import chex
import jax.numpy as jnp


def overlong_penalty(lengths: chex.Array, max_len: int, cache_len: int) -> chex.Array:
  """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13), added to the reward:

    0                          if |y| ≤ L_max − L_cache
    ((L_max − L_cache) − |y|) / L_cache   if L_max − L_cache < |y| ≤ L_max
    −1                         if |y| > L_max

  Args:
    lengths: `[B]` completion lengths |y|.
    max_len: L_max.
    cache_len: L_cache, the length of the punishment buffer (> 0).

  Returns:
    `[B]` float32 penalties in [−1, 0].
  """
  if cache_len <= 0 or cache_len > max_len:
    raise ValueError(f"overlong_penalty: need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
  length = jnp.asarray(lengths).astype(jnp.float32)
  start = max_len - cache_len
  inside = (start - length) / cache_len
  return jnp.where(length <= start, 0.0, jnp.where(length <= max_len, inside, -1.0))
