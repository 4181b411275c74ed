"""PPO's clipped value loss."""

import chex
import jax.numpy as jnp

from grpo_jax.losses import _checks


def value_loss(
    values: chex.Array,
    old_values: chex.Array,
    returns: chex.Array,
    mask: chex.Array,
    clip: float | None = 0.2,
) -> chex.Array:
  """Per-token clipped value loss of PPO (arXiv 1707.06347; the critic of DeepSeekMath eq. 1).

    ℓ_t = ½ max((V_t − R_t)², (clip(V_t, V_t^old − c, V_t^old + c) − R_t)²),

  or ½ (V_t − R_t)² when `clip` is None.

  Args:
    values: `[B, T]` V_ψ being trained.
    old_values: `[B, T]` values at sampling time.
    returns: `[B, T]` targets R_t (GAE returns).
    mask: `[B, T]` completion mask.
    clip: c, or None for no clipping.

  Returns:
    `[B, T]` float32 per-token losses, 0 where masked out.
  """
  chex.assert_rank([values, old_values, returns, mask], 2)
  chex.assert_equal_shape([values, old_values, returns, mask])
  v, r = _checks.f32(values), _checks.f32(returns)
  loss = jnp.square(v - r)
  if clip is not None:
    v_old = _checks.f32(old_values)
    v_clipped = v_old + jnp.clip(v - v_old, -clip, clip)
    loss = jnp.maximum(loss, jnp.square(v_clipped - r))
  return 0.5 * loss * _checks.as_mask(mask)
