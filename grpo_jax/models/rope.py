"""Rotary position embeddings (Su et al. 2021, "RoFormer"), rotate-half layout, Llama 3 frequency scaling optional.

  x' = x · cos(p·θ) + rotate_half(x) · sin(p·θ),  rotate_half([a, b]) = [−b, a],  θ_i = theta^(−2i / D)

for a head vector x [D] at integer position p, the D / 2 frequencies θ each used for two dimensions D / 2 apart (the
layout of Hugging Face's Qwen and Llama checkpoints).
"""

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models.config import ModelConfig


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
  """RoPE inverse frequencies [head_dim // 2] (float32, as transformers computes them)."""
  dim = config.head_dim
  inv_freq = (1.0 / (np.float32(config.rope_theta) ** (np.arange(0, dim, 2).astype(np.float32) / dim))).astype(
      np.float32)
  s = config.rope_scaling
  if s is None:
    return inv_freq
  low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
  high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
  wavelen = 2 * np.pi / inv_freq
  scaled = np.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
  smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
      s.high_freq_factor - s.low_freq_factor)
  smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
  is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
  return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rope_tables(config: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
  """cos, sin [B, L, head_dim] for integer positions [B, L] (rotate-half layout).

  XLA counts cos and sin as cheap and recomputes them inside every fusion that reads them (each layer's queries
  and keys, per head). A decode loop therefore computes its steps' tables once, before the loop, and passes each
  step's in (`transformer.hidden_states(..., rope=...)`), so a step reads them instead of recomputing them in
  every layer.
  """
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(rope_inv_freq(config))
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles), jnp.sin(angles)


def apply(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates x [B, L, N, D] (N heads) by the tables [B, L, D], in x's dtype."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos, sin = cos[:, :, None].astype(x.dtype), sin[:, :, None].astype(x.dtype)
  return x * cos + rotated * sin
