"""SAPO (soft adaptive policy optimisation): a smooth, temperature-controlled gate on the ratio in place of the clip."""

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks
from grpo_jax.losses import surrogate


def sapo_gate(ratio: chex.Array, advantages: chex.Array, tau_pos: float, tau_neg: float) -> chex.Array:
  """f(ρ) = (4/τ) σ(τ(ρ − 1)), τ = τ_pos where Â > 0 and τ_neg elsewhere; f(1) = 2/τ and f'(1) = 1."""
  tau = jnp.where(advantages > 0, tau_pos, tau_neg)
  return 4.0 / tau * jax.nn.sigmoid(tau * (ratio - 1.0))


def sapo_surrogate(
    logp: chex.Array,
    old_logp: chex.Array,
    advantages: chex.Array,
    mask: chex.Array,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    importance: surrogate.Importance = "token",
) -> chex.Array:
  """Per-token SAPO loss (to minimise), Gao et al. 2025 (arXiv 2511.20347), seq-mean-token-mean there.

    ℓ_t = −f(ρ_t) Â_t,   f(ρ) = (4/τ) σ(τ(ρ − 1)),   τ = τ_pos if Â_t > 0 else τ_neg.

  ∂ℓ_t/∂log π_θ(o_t) = −w_t ρ_t Â_t with w_t = 4 σ(τ(ρ_t − 1)) (1 − σ(τ(ρ_t − 1))): at ρ = 1, w = 1 and the
  gradient is the unclipped surrogate's −Â; as ρ leaves 1 the gate fades the token's gradient smoothly
  (faster for larger τ) where PPO's clip cuts it to 0. The paper takes τ_neg > τ_pos (1.05 and 1.0), since
  negative advantages spread probability mass over many unsampled tokens and destabilise training sooner.

  Args:
    logp: `[B, T]` log π_θ(o_t), differentiated.
    old_logp: `[B, T]` log π_old(o_t) of the sampling policy.
    advantages: `[B]` per-sequence or `[B, T]` per-token advantages.
    mask: `[B, T]` completion mask.
    tau_pos: τ of tokens with Â > 0.
    tau_neg: τ of tokens with Â ≤ 0.
    importance: "token" or "sequence" (GSPO's ratio, see `log_importance_ratios`).

  Returns:
    `[B, T]` float32 per-token losses, 0 where masked out. Aggregate with `aggregate`.
  """
  log_ratio = surrogate.log_importance_ratios(logp, old_logp, mask, importance)
  adv = jax.lax.stop_gradient(_checks.per_token(advantages, log_ratio))
  loss = -sapo_gate(jnp.exp(log_ratio), adv, tau_pos, tau_neg) * adv
  return jnp.where(_checks.as_mask(mask) > 0, loss, 0.0)


def sapo_gradient_scale(
    logp: chex.Array,
    old_logp: chex.Array,
    advantages: chex.Array,
    mask: chex.Array,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    importance: surrogate.Importance = "token",
) -> chex.Array:
  """w_t = 4 σ(τ(ρ_t − 1)) (1 − σ(τ(ρ_t − 1))) per token, `[B, T]` (0 where masked out): the share of the
  unclipped surrogate's gradient ρ_t Â_t that SAPO keeps (1 at ρ = 1)."""
  log_ratio = jax.lax.stop_gradient(surrogate.log_importance_ratios(logp, old_logp, mask, importance))
  adv = _checks.per_token(advantages, log_ratio)
  tau = jnp.where(adv > 0, tau_pos, tau_neg)
  s = jax.nn.sigmoid(tau * (jnp.exp(log_ratio) - 1.0))
  return jnp.where(_checks.as_mask(mask) > 0, 4.0 * s * (1.0 - s), 0.0)
