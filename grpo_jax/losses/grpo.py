"""The GRPO objective: clipped surrogate plus a KL penalty to the reference, in the loss."""

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import aggregation as aggregation_lib
from grpo_jax.losses import kl as kl_lib
from grpo_jax.losses import surrogate


def grpo_loss(
    logp: chex.Array,
    old_logp: chex.Array,
    ref_logp: chex.Array | None,
    advantages: chex.Array,
    mask: chex.Array,
    *,
    epsilon: float,
    epsilon_high: float | None = None,
    beta: float,
    kl: kl_lib.Estimator = "k3",
    aggregation: aggregation_lib.Aggregation = "seq-mean-token-mean",
    importance: surrogate.Importance = "token",
    dual_clip: float | None = None,
    max_len: int | None = None,
    num_sequences: chex.Numeric | None = None,
    num_tokens: chex.Numeric | None = None,
    rollout_weights: chex.Array | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
  """GRPO loss, the negated objective of DeepSeekMath eq. 3 (arXiv 2402.03300).

    J = (1/G) Σ_i (1/|o_i|) Σ_t { min(ρ_{i,t} Â_{i,t}, clip(ρ_{i,t}, 1−ε, 1+ε) Â_{i,t}) − β D_KL[π_θ‖π_ref] },

  with the k3 estimator of eq. 4 for D_KL by default. At ρ = 1 the gradient with respect to
  log π_θ(o_t) is −w_t (Â_t + β(π_ref/π_θ − 1)): the GRPO gradient coefficient of §5.2.1,
  w the aggregation weights. The variants are arguments: `epsilon_high` (DAPO clip-higher),
  `aggregation` ("token-mean": DAPO; "seq-mean-token-sum-norm": Dr. GRPO), `importance=
  "sequence"` (GSPO), `dual_clip`, `beta=0` or `ref_logp=None` (no KL term), `rollout_weights`
  (the rollout-trainer mismatch's correction, `rollout_correction_weights`: w_t multiplies the
  clipped term of token t, not the KL).

  Args:
    logp: `[B, T]` log π_θ of the sampled tokens (differentiated).
    old_logp: `[B, T]` log π_old, the sampling policy.
    ref_logp: `[B, T]` log π_ref, or None when β = 0.
    advantages: `[B]` (outcome supervision) or `[B, T]` (process supervision).
    mask: `[B, T]` completion mask.
    epsilon: ε, the clip range (lower side).
    epsilon_high: upper clip range, default ε.
    beta: KL coefficient β.
    kl: the KL estimator, "k3" (the paper), "k2" or "k1".
    aggregation: see `aggregation_weights`.
    importance: "token" or "sequence" ratios.
    dual_clip: c of dual-clip PPO, or None.
    max_len: L of "seq-mean-token-sum-norm".
    num_sequences: global sequence count for micro-batching (see `aggregation_weights`).
    num_tokens: global token count for micro-batching.
    rollout_weights: optional `[B, T]` importance weights (stop-gradient) of the policy-gradient term.

  Returns:
    `(loss, metrics)`: the scalar loss to minimise, and float32 scalars "loss",
    "pg_loss", "kl" (token mean of the estimator), "kl_loss" (β-weighted and aggregated),
    "clip_frac_low", "clip_frac_high", "clip_frac", "ratio_mean", "ratio_min", "ratio_max".
  """
  weights = aggregation_lib.aggregation_weights(
      mask, aggregation, max_len=max_len, num_sequences=num_sequences, num_tokens=num_tokens)
  pg = surrogate.clipped_surrogate(logp, old_logp, advantages, mask, epsilon, epsilon_high, dual_clip, importance)
  if rollout_weights is not None:
    chex.assert_equal_shape([rollout_weights, mask])
    pg = pg * jax.lax.stop_gradient(rollout_weights.astype(jnp.float32))
  valid = weights > 0
  pg_loss = jnp.sum(jnp.where(valid, weights * pg, 0.0))
  metrics = surrogate.clip_fractions(logp, old_logp, advantages, mask, epsilon, epsilon_high, importance)
  if ref_logp is None:
    kl_loss = jnp.zeros((), jnp.float32)
    metrics["kl"] = jnp.zeros((), jnp.float32)
  else:
    kl_t = kl_lib.kl_divergence(logp, ref_logp, kl, mask)
    kl_loss = beta * jnp.sum(jnp.where(valid, weights * kl_t, 0.0))
    metrics["kl"] = jax.lax.stop_gradient(aggregation_lib.masked_mean(kl_t, mask))
  loss = pg_loss + kl_loss
  metrics.update(loss=jax.lax.stop_gradient(loss), pg_loss=jax.lax.stop_gradient(pg_loss),
                 kl_loss=jax.lax.stop_gradient(kl_loss))
  return loss, metrics
