"""CISPO (MiniMax-M1): clip the importance weight, not the update, so every token keeps its gradient."""

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks
from grpo_jax.losses import aggregation
from grpo_jax.losses import surrogate


def cispo_surrogate(
    logp: chex.Array,
    old_logp: chex.Array,
    advantages: chex.Array,
    mask: chex.Array,
    eps_high: float,
    eps_low: float | None = None,
    importance: surrogate.Importance = "token",
) -> chex.Array:
  """Per-token CISPO loss (to minimise), MiniMax-M1 (arXiv 2506.13585), with token-mean aggregation there.

    ℓ_t = −sg(r̂_t) Â_t log π_θ(o_t),   r̂_t = clip(ρ_t, 1 − ε_low, 1 + ε_high),

  sg the stop-gradient. ∂ℓ_t/∂log π_θ(o_t) = −r̂_t Â_t: the clip bounds a token's weight but, unlike PPO's
  clip, never zeroes its gradient (at ρ = 1 the gradient is that of the unclipped surrogate −ρÂ). The loss
  value itself is not a surrogate of the return; only its gradient is meaningful. The paper sets no lower
  bound (`eps_low=None`) and tunes ε_high; `importance="sequence"` weights every token of o_i by GSPO's
  sequence ratio s_i (see `log_importance_ratios`).

  Args:
    logp: `[B, T]` log π_θ(o_t), differentiated.
    old_logp: `[B, T]` log π_old(o_t) of the sampling policy.
    advantages: `[B]` per-sequence or `[B, T]` per-token advantages.
    mask: `[B, T]` completion mask.
    eps_high: the weight's upper bound is 1 + ε_high.
    eps_low: the weight's lower bound is 1 − ε_low; None: no lower bound.
    importance: "token" or "sequence".

  Returns:
    `[B, T]` float32 per-token losses, 0 where masked out. Aggregate with `aggregate`.
  """
  log_ratio = jax.lax.stop_gradient(surrogate.log_importance_ratios(logp, old_logp, mask, importance))
  adv = jax.lax.stop_gradient(_checks.per_token(advantages, log_ratio))
  m = _checks.as_mask(mask)
  weight = jnp.minimum(jnp.exp(log_ratio), 1.0 + eps_high)
  if eps_low is not None:
    weight = jnp.maximum(weight, 1.0 - eps_low)
  logp = jnp.where(m > 0, _checks.f32(logp), 0.0)  # a -inf log-prob at a padded position stays out
  return jnp.where(m > 0, -weight * adv * logp, 0.0)


def cispo_truncation(
    logp: chex.Array,
    old_logp: chex.Array,
    mask: chex.Array,
    eps_high: float,
    eps_low: float | None = None,
    importance: surrogate.Importance = "token",
) -> dict[str, chex.Array]:
  """Fractions of masked-in tokens whose CISPO weight the clip truncates (their gradient is scaled down, not
  dropped): "clip_frac_high" (ρ > 1 + ε_high), "clip_frac_low" (ρ < 1 − ε_low; 0 without a lower bound) and
  "clip_frac" (either), whatever the advantage's sign."""
  log_ratio = jax.lax.stop_gradient(surrogate.log_importance_ratios(logp, old_logp, mask, importance))
  valid = _checks.as_mask(mask) > 0
  ratio = jnp.exp(log_ratio)
  high = valid & (ratio > 1.0 + eps_high)
  low = valid & (ratio < 1.0 - eps_low) if eps_low is not None else jnp.zeros_like(valid)
  return {"clip_frac_high": aggregation.masked_mean(high, valid), "clip_frac_low": aggregation.masked_mean(low, valid),
          "clip_frac": aggregation.masked_mean(high | low, valid)}
