"""PPO's clipped surrogate, per token or per sequence (GSPO), with clip-higher and dual clip."""

from typing import Literal

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks
from grpo_jax.losses import aggregation

Importance = Literal["token", "sequence"]


def log_importance_ratios(
    logp: chex.Array,
    old_logp: chex.Array,
    mask: chex.Array,
    importance: Importance = "token",
) -> chex.Array:
  """log ρ per token, `[B, T]`, 0 where masked out.

  "token": log ρ_t = log π_θ(o_t) − log π_old(o_t) (PPO, GRPO).
  "sequence": GSPO (arXiv 2507.18071), s_i = exp((1/|o_i|) Σ_t log ρ_{i,t}), in its
  GSPO-token form sg[log s_i] + log π_θ(o_t) − sg[log π_θ(o_t)]: every token carries
  the value of s_i, and the gradient of a token-mean over o_i is the gradient of s_i.
  """
  chex.assert_rank([logp, old_logp, mask], 2)
  chex.assert_equal_shape([logp, old_logp, mask])
  logp, m = _checks.f32(logp), _checks.as_mask(mask)
  # `where`, not a product: a non-finite log-prob at a padded position must not reach the loss or its gradient.
  logp = jnp.where(m > 0, logp, 0.0)
  log_ratio = jnp.where(m > 0, logp - _checks.f32(old_logp), 0.0)
  if importance == "token":
    return log_ratio
  if importance == "sequence":
    seq = aggregation.masked_mean(log_ratio, m, axis=-1, keepdims=True)
    return jnp.where(m > 0, jax.lax.stop_gradient(seq) + logp - jax.lax.stop_gradient(logp), 0.0)
  raise ValueError(f"importance level {importance!r} is unknown; expected 'token' or 'sequence'")


def clipped_surrogate(
    logp: chex.Array,
    old_logp: chex.Array,
    advantages: chex.Array,
    mask: chex.Array,
    eps_low: float,
    eps_high: float | None = None,
    dual_clip: float | None = None,
    importance: Importance = "token",
) -> chex.Array:
  """Per-token clipped surrogate loss (to minimise), PPO (arXiv 1707.06347) as in DeepSeekMath eq. 1/3.

    ℓ_t = −min(ρ_t A_t, clip(ρ_t, 1 − ε_low, 1 + ε_high) A_t).

  `eps_high` > `eps_low` is DAPO's clip-higher (arXiv 2503.14476); None means ε_high = ε_low.
  `dual_clip` = c > 1 is dual-clip PPO (arXiv 1912.09729): for A_t < 0 the objective is
  max(min(ρA, clip(ρ)A), cA), so ℓ_t ≤ −c A_t. `importance="sequence"` uses GSPO's
  sequence ratio (see `log_importance_ratios`). Where a clip is active the gradient is 0.

  Args:
    logp: `[B, T]` log π_θ(o_t), differentiated.
    old_logp: `[B, T]` log π_old(o_t) of the sampling policy.
    advantages: `[B]` per-sequence or `[B, T]` per-token advantages.
    mask: `[B, T]` completion mask.
    eps_low: ε (lower clip range 1 − ε_low).
    eps_high: upper clip range 1 + ε_high.
    dual_clip: c for dual-clip PPO, or None.
    importance: "token" or "sequence".

  Returns:
    `[B, T]` float32 per-token losses, 0 where masked out. Aggregate with `aggregate`.
  """
  eps_high = eps_low if eps_high is None else eps_high
  log_ratio = log_importance_ratios(logp, old_logp, mask, importance)
  adv = jax.lax.stop_gradient(_checks.per_token(advantages, log_ratio))
  ratio = jnp.exp(log_ratio)
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss = jnp.maximum(unclipped, clipped)
  if dual_clip is not None:
    loss = jnp.where(adv < 0, jnp.minimum(loss, -dual_clip * adv), loss)
  return jnp.where(_checks.as_mask(mask) > 0, loss, 0.0)


def clip_fractions(
    logp: chex.Array,
    old_logp: chex.Array,
    advantages: chex.Array,
    mask: chex.Array,
    eps_low: float,
    eps_high: float | None = None,
    importance: Importance = "token",
) -> dict[str, chex.Array]:
  """Fractions of masked-in tokens whose gradient the clip removes.

  "clip_frac_low": ρ < 1 − ε_low with A < 0; "clip_frac_high": ρ > 1 + ε_high with A > 0;
  "clip_frac": either. Also the mean, min and max of ρ over masked-in tokens (1 when there are none).
  """
  eps_high = eps_low if eps_high is None else eps_high
  log_ratio = jax.lax.stop_gradient(log_importance_ratios(logp, old_logp, mask, importance))
  adv = jax.lax.stop_gradient(_checks.per_token(advantages, log_ratio))
  m = _checks.as_mask(mask)
  count = jnp.maximum(jnp.sum(m), 1.0)
  ratio = jnp.exp(log_ratio)
  low = ((ratio < 1.0 - eps_low) & (adv < 0)).astype(jnp.float32) * m
  high = ((ratio > 1.0 + eps_high) & (adv > 0)).astype(jnp.float32) * m
  valid = m > 0
  any_valid = jnp.any(valid)  # an all-padding minibatch reports ratio 1, not ±inf
  return {
      "clip_frac_low": jnp.sum(low) / count,
      "clip_frac_high": jnp.sum(high) / count,
      "clip_frac": jnp.sum(low + high) / count,
      "ratio_mean": aggregation.masked_mean(ratio, m),
      "ratio_min": jnp.where(any_valid, jnp.min(jnp.where(valid, ratio, jnp.inf)), 1.0),
      "ratio_max": jnp.where(any_valid, jnp.max(jnp.where(valid, ratio, -jnp.inf)), 1.0),
  }
