"""Shared input handling for the loss functions: shape checks and float32 casts."""

import chex
import jax.numpy as jnp


def f32(x: chex.Array) -> chex.Array:
  """Casts an array (for example bfloat16 log-probs) to float32 for the math."""
  return jnp.asarray(x).astype(jnp.float32)


def as_mask(mask: chex.Array) -> chex.Array:
  """Returns a boolean or 0/1 mask as float32."""
  return jnp.asarray(mask).astype(jnp.float32)


def per_token(advantages: chex.Array, like: chex.Array) -> chex.Array:
  """Broadcasts per-sequence values `[B]` to per-token `[B, T]` (per-token pass through)."""
  advantages = f32(advantages)
  if advantages.ndim == like.ndim - 1:
    advantages = advantages[..., None]
  chex.assert_rank(advantages, like.ndim)
  return jnp.broadcast_to(advantages, like.shape)
