"""On-policy distillation: the student samples, the teacher scores the same tokens, and the per-token reverse KL to
the teacher is the signal."""

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks
from grpo_jax.losses import aggregation as aggregation_lib
from grpo_jax.losses import surrogate


def reverse_kl_rewards(old_logp: chex.Array, teacher_logp: chex.Array, mask: chex.Array) -> chex.Array:
  """r_t = log π_T(o_t) − log π_old(o_t) per token, `[B, T]` (0 where masked out): minus the one-sample estimate
  of the reverse KL D_KL[π_old(· | o_<t) ‖ π_T(· | o_<t)] at the token the student sampled."""
  chex.assert_rank([old_logp, teacher_logp, mask], 2)
  chex.assert_equal_shape([old_logp, teacher_logp, mask])
  valid = _checks.as_mask(mask) > 0
  return jnp.where(valid, _checks.f32(teacher_logp) - _checks.f32(old_logp), 0.0)


def distill_loss(
    logp: chex.Array,
    old_logp: chex.Array,
    teacher_logp: chex.Array,
    mask: chex.Array,
    *,
    epsilon: float,
    epsilon_high: float | None = None,
    aggregation: aggregation_lib.Aggregation = "token-mean",
    max_len: int | None = None,
    num_sequences: chex.Numeric | None = None,
    num_tokens: chex.Numeric | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
  """On-policy distillation's loss: the reverse KL to the teacher on the student's own samples (GKD, arXiv
  2306.13649, with the reverse KL), estimated at the sampled token as in Thinking Machines' "On-Policy
  Distillation" (2025): the clipped surrogate with the per-token reward r_t of `reverse_kl_rewards` as the
  advantage (no discount, no baseline),

    ℓ_t = −min(ρ_t r_t, clip(ρ_t, 1 − ε, 1 + ε_high) r_t),   r_t = sg(log π_T(o_t) − log π_old(o_t)).

  At ρ = 1 (on-policy) the gradient in log π_θ(o_t) is −r_t, and its expectation over o_t ~ π_θ(· | o_<t)
  is exactly ∇ D_KL[π_θ(· | o_<t) ‖ π_T(· | o_<t)] for each context: Σ_v π_v (log π_v − log π_T,v) ∇ log π_v,
  the Σ_v π_v ∇ log π_v = 0 term dropping out. Only the teacher's log-probs of the sampled tokens are needed
  (one forward, like π_ref's), not its logits over the vocabulary. The reverse KL is mode-seeking: the student
  is pushed off what the teacher finds unlikely, on the student's own prefixes.

  Args:
    logp: `[B, T]` log π_θ of the student's sampled tokens (differentiated).
    old_logp: `[B, T]` log π_old, the sampling student.
    teacher_logp: `[B, T]` log π_T of the same tokens, the frozen teacher (same tokenizer).
    mask: `[B, T]` completion mask.
    epsilon: ε, the clip range (lower side).
    epsilon_high: upper clip range, default ε.
    aggregation: see `aggregation_weights`.
    max_len: L of "seq-mean-token-sum-norm".
    num_sequences: global sequence count for micro-batching.
    num_tokens: global token count for micro-batching.

  Returns:
    `(loss, metrics)`: the scalar loss to minimise, and float32 scalars "loss", "reverse_kl" (the token mean of
    log π_old − log π_T), "clip_frac_low", "clip_frac_high", "clip_frac", "ratio_mean", "ratio_min", "ratio_max".
  """
  rewards = jax.lax.stop_gradient(reverse_kl_rewards(old_logp, teacher_logp, mask))
  weights = aggregation_lib.aggregation_weights(
      mask, aggregation, max_len=max_len, num_sequences=num_sequences, num_tokens=num_tokens)
  pg = surrogate.clipped_surrogate(logp, old_logp, rewards, mask, epsilon, epsilon_high)
  loss = jnp.sum(jnp.where(weights > 0, weights * pg, 0.0))
  metrics = surrogate.clip_fractions(logp, old_logp, rewards, mask, epsilon, epsilon_high)
  metrics.update(loss=jax.lax.stop_gradient(loss), reverse_kl=-aggregation_lib.masked_mean(rewards, mask))
  return loss, metrics
