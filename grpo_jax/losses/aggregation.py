"""Reducing per-token values: the loss-aggregation modes of GRPO, DAPO and Dr. GRPO, and the masked mean."""

from typing import Literal

import chex
import jax.numpy as jnp

from grpo_jax.losses import _checks

Aggregation = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
MODES = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def aggregation_weights(
    mask: chex.Array,
    mode: Aggregation = "seq-mean-token-mean",
    *,
    max_len: int | None = None,
    num_sequences: chex.Numeric | None = None,
    num_tokens: chex.Numeric | None = None,
) -> chex.Array:
  """Weights w_{i,t} with aggregate(ℓ) = Σ_{i,t} w_{i,t} ℓ_{i,t}, `[B, T]` float32.

    seq-mean-token-mean      (1/N) Σ_i (1/|o_i|) Σ_t ℓ     GRPO (DeepSeekMath eq. 3)
    token-mean               (1/Σ_i |o_i|) Σ_i Σ_t ℓ        DAPO (arXiv 2503.14476)
    seq-mean-token-sum       (1/N) Σ_i Σ_t ℓ
    seq-mean-token-sum-norm  (1/N) Σ_i (1/L) Σ_t ℓ          Dr. GRPO (arXiv 2503.20783)

  N counts the sequences with at least one token, L is the constant `max_len`
  (default: T). `num_sequences` / `num_tokens` override N and Σ|o_i|: pass the
  global counts when a batch is split into micro-batches, so the accumulated
  gradient equals the full batch's.
  """
  chex.assert_rank(mask, 2)
  m = _checks.as_mask(mask)
  lengths = jnp.sum(m, axis=-1, keepdims=True)
  if num_sequences is None:
    num_sequences = jnp.maximum(jnp.sum(lengths > 0), 1)
  if mode == "seq-mean-token-mean":
    return m / jnp.maximum(lengths, 1.0) / num_sequences
  if mode == "token-mean":
    if num_tokens is None:
      num_tokens = jnp.maximum(jnp.sum(m), 1.0)
    return m / num_tokens
  if mode == "seq-mean-token-sum":
    return m / num_sequences
  if mode == "seq-mean-token-sum-norm":
    max_len = mask.shape[-1] if max_len is None else max_len
    return m / max_len / num_sequences
  raise ValueError(f"aggregation mode {mode!r} is unknown; expected one of {', '.join(MODES)}")


def aggregate(
    per_token: chex.Array,
    mask: chex.Array,
    mode: Aggregation = "seq-mean-token-mean",
    *,
    max_len: int | None = None,
    num_sequences: chex.Numeric | None = None,
    num_tokens: chex.Numeric | None = None,
) -> chex.Array:
  """Reduces `[B, T]` per-token values to a scalar; see `aggregation_weights` for the modes."""
  chex.assert_equal_shape([per_token, mask])
  weights = aggregation_weights(mask, mode, max_len=max_len, num_sequences=num_sequences, num_tokens=num_tokens)
  # `where`, not a product, so a non-finite value at a padded position cannot leak in.
  return jnp.sum(jnp.where(weights > 0, weights * _checks.f32(per_token), 0.0))


def masked_mean(
    x: chex.Array,
    mask: chex.Array,
    *,
    axis: int | None = None,
    keepdims: bool = False,
) -> chex.Array:
  """The mean of `x` over the positions where `mask` is nonzero, float32:

    masked_mean(x, m) = Σ_{m ≠ 0} x / max(Σ [m ≠ 0], 1)

  A masked position contributes exactly 0 even when `x` is NaN or ±inf there (a `where`,
  not a product, which would give NaN · 0 = NaN); with no unmasked position the mean is 0.

  Args:
    x: values, any shape.
    mask: boolean or 0/1 mask of `x`'s shape.
    axis: the axis to reduce (default: all).
    keepdims: keep the reduced axis with size 1.
  """
  chex.assert_equal_shape([x, mask])
  valid = _checks.as_mask(mask) > 0
  total = jnp.sum(jnp.where(valid, _checks.f32(x), 0.0), axis=axis, keepdims=keepdims)
  return total / jnp.maximum(jnp.sum(valid, axis=axis, keepdims=keepdims), 1).astype(jnp.float32)
