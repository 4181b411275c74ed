"""The GRPO objective: a policy surrogate (PPO's clip, CISPO or SAPO) plus a KL penalty to the reference, in the
loss; optionally an entropy bonus and the policy gradient on the highest-entropy tokens only."""

from typing import Literal

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import aggregation as aggregation_lib
from grpo_jax.losses import cispo
from grpo_jax.losses import entropy as entropy_lib
from grpo_jax.losses import entropy_mask
from grpo_jax.losses import kl as kl_lib
from grpo_jax.losses import sapo
from grpo_jax.losses import surrogate

PolicyLoss = Literal["clip", "cispo", "sapo"]
POLICY_LOSSES = ("clip", "cispo", "sapo")


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
    policy_loss: PolicyLoss = "clip",
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    entropy: chex.Array | None = None,
    entropy_coef: float = 0.0,
    top_entropy_quantile: float = 1.0,
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
  policy term of token t, not the KL).

  `policy_loss` swaps the clipped surrogate for CISPO's (`cispo_surrogate`: the weight clipped to at most
  1 + `epsilon_high`, no lower bound, as MiniMax-M1) or SAPO's soft gate (`sapo_surrogate`); the KL term and
  the aggregation stay. With the policy's per-token `entropy`: `entropy_coef` c adds `entropy_bonus` (−c
  times the token-mean entropy) and `top_entropy_quantile` ρ < 1 multiplies the policy term by
  `top_entropy_mask` (the normaliser and the KL term keep every token), as TRL's GRPOTrainer does. With both,
  the bonus still averages over every token (TRL's over the kept ones), so micro-batches sum to the batch
  exactly; the entropy quantile, though, is each micro-batch's.

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
    policy_loss: "clip" (PPO's, above), "cispo" or "sapo".
    sapo_tau_pos: SAPO's τ for Â > 0.
    sapo_tau_neg: SAPO's τ for Â ≤ 0.
    entropy: `[B, T]` per-token entropy of π_θ (differentiated); needed by the two options below.
    entropy_coef: c of the entropy bonus (0: none).
    top_entropy_quantile: ρ, the share of tokens (by entropy) that keep their policy gradient (1: all).
    rollout_weights: optional `[B, T]` importance weights (stop-gradient) of the policy term.

  Returns:
    `(loss, metrics)`: the scalar loss to minimise, and float32 scalars "loss",
    "pg_loss", "kl" (token mean of the estimator), "kl_loss" (β-weighted and aggregated),
    "ratio_mean", "ratio_min", "ratio_max"; "clip_frac_low", "clip_frac_high", "clip_frac" (clip: the tokens
    whose gradient the clip removes; CISPO: those whose weight it truncates); SAPO's "sapo_gradient_scale"
    (the token mean of the share of the unclipped gradient kept); with an entropy bonus "entropy_loss"; with
    ρ < 1 "entropy_mask_frac" (the share of tokens kept).
  """
  weights = aggregation_lib.aggregation_weights(
      mask, aggregation, max_len=max_len, num_sequences=num_sequences, num_tokens=num_tokens)
  metrics = surrogate.clip_fractions(logp, old_logp, advantages, mask, epsilon, epsilon_high, importance)
  if policy_loss == "clip":
    pg = surrogate.clipped_surrogate(logp, old_logp, advantages, mask, epsilon, epsilon_high, dual_clip, importance)
  elif policy_loss == "cispo":
    eps_high = epsilon if epsilon_high is None else epsilon_high
    pg = cispo.cispo_surrogate(logp, old_logp, advantages, mask, eps_high, None, importance)
    metrics.update(cispo.cispo_truncation(logp, old_logp, mask, eps_high, None, importance))
  elif policy_loss == "sapo":
    pg = sapo.sapo_surrogate(logp, old_logp, advantages, mask, sapo_tau_pos, sapo_tau_neg, importance)
    for name in ("clip_frac_low", "clip_frac_high", "clip_frac"):
      del metrics[name]
    metrics["sapo_gradient_scale"] = aggregation_lib.masked_mean(
        sapo.sapo_gradient_scale(logp, old_logp, advantages, mask, sapo_tau_pos, sapo_tau_neg, importance), mask)
  else:
    raise ValueError(f"policy loss {policy_loss!r} is unknown; expected one of {', '.join(POLICY_LOSSES)}")
  if rollout_weights is not None:
    chex.assert_equal_shape([rollout_weights, mask])
    pg = pg * jax.lax.stop_gradient(rollout_weights.astype(jnp.float32))
  if (entropy_coef or top_entropy_quantile < 1.0) and entropy is None:
    raise ValueError("grpo_loss: entropy_coef and top_entropy_quantile need the per-token `entropy`")
  if top_entropy_quantile < 1.0:
    keep = entropy_mask.top_entropy_mask(entropy, mask, top_entropy_quantile)
    pg = jnp.where(keep, pg, 0.0)
    metrics["entropy_mask_frac"] = aggregation_lib.masked_mean(keep, mask)
  valid = weights > 0
  pg_loss = jnp.sum(jnp.where(valid, weights * pg, 0.0))
  if ref_logp is None:
    kl_loss = jnp.zeros((), jnp.float32)
    metrics["kl"] = jnp.zeros((), jnp.float32)
  else:
    kl_t = kl_lib.kl_divergence(logp, ref_logp, kl, mask)
    kl_loss = beta * jnp.sum(jnp.where(valid, weights * kl_t, 0.0))
    metrics["kl"] = jax.lax.stop_gradient(aggregation_lib.masked_mean(kl_t, mask))
  loss = pg_loss + kl_loss
  if entropy_coef:
    entropy_loss = entropy_lib.entropy_bonus(entropy, mask, entropy_coef, num_tokens=num_tokens)
    loss = loss + entropy_loss
    metrics["entropy_loss"] = jax.lax.stop_gradient(entropy_loss)
  metrics.update(loss=jax.lax.stop_gradient(loss), pg_loss=jax.lax.stop_gradient(pg_loss),
                 kl_loss=jax.lax.stop_gradient(kl_loss))
  return loss, metrics
