"""DeepSeekMath's unified paradigm: every method is a data source, a reward and a gradient coefficient.

  ∇J = E_{(q,o)~D} (1/|o|) Σ_t GC(q, o, t) ∇ log π_θ(o_t | q, o_<t)      (§5.2.1, Table 10)

A coefficient function returns GC per token; `paradigm_loss` turns any coefficient into a
loss whose gradient is exactly −∇J, so SFT, RFT, Online RFT, DPO, PPO and GRPO can share one
update path that differs only in where the data comes from and which coefficient is used.
"""

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks
from grpo_jax.losses import aggregation as aggregation_lib


def sft_coefficient(mask: chex.Array) -> chex.Array:
  """SFT: GC = 1 on every token of a human-written o. `[B, T]` float32."""
  return _checks.as_mask(mask)


def rft_coefficient(correct: chex.Array, mask: chex.Array) -> chex.Array:
  """RFT and Online RFT: GC = 1 if o is correct else 0 (they differ in the data source:
  o ~ π_sft offline for RFT, o ~ π_θ online for Online RFT). `correct`: `[B]`."""
  chex.assert_rank(correct, 1)
  return _checks.per_token(jnp.asarray(correct).astype(jnp.float32), _checks.as_mask(mask)) * _checks.as_mask(mask)


online_rft_coefficient = rft_coefficient


def dpo_coefficient(
    chosen_log_ratio: chex.Array,
    rejected_log_ratio: chex.Array,
    beta: float,
) -> tuple[chex.Array, chex.Array]:
  """DPO: GC = σ(β log(π_θ/π_ref)(o⁻) − β log(π_θ/π_ref)(o⁺)), + on o⁺ and − on o⁻.

  Args:
    chosen_log_ratio: `[B]` Σ_t log π_θ/π_ref over the preferred output o⁺.
    rejected_log_ratio: `[B]` the same over the dispreferred output o⁻.
    beta: DPO's β.

  Returns:
    `(gc_chosen, gc_rejected)`, each `[B]`: the coefficients of o⁺'s and o⁻'s tokens.
    Table 10 leaves out a constant: DPO's own gradient (`dpo_loss`) is β·GC per token of
    the summed log-likelihood, not the 1/|o| mean.
  """
  chex.assert_equal_shape([chosen_log_ratio, rejected_log_ratio])
  margin = beta * (_checks.f32(rejected_log_ratio) - _checks.f32(chosen_log_ratio))
  gc = jax.nn.sigmoid(margin)
  return gc, -gc


def ppo_coefficient(advantages: chex.Array) -> chex.Array:
  """PPO: GC = A_t, the GAE advantage (the gradient of eq. 1 at ρ = 1)."""
  return _checks.f32(advantages)


def grpo_coefficient(
    advantages: chex.Array,
    logp: chex.Array,
    ref_logp: chex.Array,
    beta: float,
) -> chex.Array:
  """GRPO: GC = Â_{i,t} + β (π_ref(o_t)/π_θ(o_t) − 1) (the gradient of eq. 3 at ρ = 1, k3 KL).

  `advantages` is `[B]` or `[B, T]`; returns `[B, T]`.
  """
  chex.assert_equal_shape([logp, ref_logp])
  adv = _checks.per_token(advantages, logp)
  return adv + beta * jnp.expm1(_checks.f32(ref_logp) - _checks.f32(logp))


def paradigm_loss(
    logp: chex.Array,
    coefficient: chex.Array,
    mask: chex.Array,
    aggregation: aggregation_lib.Aggregation = "seq-mean-token-mean",
    *,
    max_len: int | None = None,
    num_sequences: chex.Numeric | None = None,
    num_tokens: chex.Numeric | None = None,
) -> chex.Array:
  """−aggregate(sg[GC] · log π_θ): a loss whose gradient is −(1/|o|) Σ_t GC ∇log π_θ(o_t).

  With the default aggregation this is the paradigm's E(q,o) (1/|o|) Σ_t; the coefficient is
  held constant (stop-gradient), as the paradigm treats it. `max_len`, `num_sequences` and
  `num_tokens` are passed to `aggregate` (global normalisers for micro-batching).
  """
  chex.assert_equal_shape([logp, coefficient, mask])
  valid = _checks.as_mask(mask) > 0
  # Zero both factors at padded positions: a non-finite value there would give a NaN gradient.
  gc = jnp.where(valid, jax.lax.stop_gradient(_checks.f32(coefficient)), 0.0)
  return -aggregation_lib.aggregate(gc * jnp.where(valid, _checks.f32(logp), 0.0), mask, aggregation,
                                   max_len=max_len, num_sequences=num_sequences, num_tokens=num_tokens)
