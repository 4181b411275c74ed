"""The rollout-trainer mismatch: measured, and corrected with truncated or masked importance sampling.

The sampler (a KV-cache decode) and the trainer (a full forward) give the same tokens different log-probs: they
round differently, more so in bfloat16 and under a mesh. The samples then come from π_sampler while the loss treats
them as draws from π_old, the trainer's policy, and the policy gradient is biased (Yao et al. 2025, "Your efficient
RL framework secretly brings you off-policy RL training"). With ρ_t = π_trainer(o_t) / π_sampler(o_t) of the same
sampled tokens, this module measures the gap and gives stop-gradient weights w that multiply the per-token
policy-gradient loss:

  token_tis   w_t = min(ρ_t, C)                                   truncated IS (TIS, Yao et al. 2025)
  seq_tis     w_t = min(ρ(o), C),  ρ(o) = Π_t ρ_t                 the same on the sequence's ratio
  token_mis   w_t = ρ_t · 1[L ≤ ρ_t ≤ U]                          masked IS (MIS): outliers dropped
  seq_mis     w_t = ρ(o) · 1[L ≤ ρ(o) ≤ U]                        whole sequences dropped

These are TRL's `vllm_importance_sampling_mode` token_truncate, sequence_truncate, token_mask and sequence_mask
(`GRPOTrainer`: the sequence ratio exp(Σ_t Δ_t), truncation from above at C, ratios outside [C_min, C_max] set to
0), and verl's rollout correction: `rollout_is` token/sequence, truncated at `rollout_is_threshold`, and
`rollout_rs` token/sequence, which rejects ratios outside [lower, upper] (lower defaulting to 1/upper) but weighs
the kept tokens 1 unless combined with `rollout_is`. Token-level weights are biased but of low variance; the
sequence ratio is the unbiased one, of high variance on long completions.
"""

from typing import Literal

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks
from grpo_jax.losses import aggregation

Correction = Literal["token_tis", "seq_tis", "token_mis", "seq_mis"]
CORRECTIONS = ("token_tis", "seq_tis", "token_mis", "seq_mis")


def _log_ratios(sampler_logp: chex.Array, trainer_logp: chex.Array, mask: chex.Array) -> chex.Array:
  """Δ_t = log π_trainer(o_t) − log π_sampler(o_t), 0 where masked out (non-finite padding included)."""
  chex.assert_rank([sampler_logp, trainer_logp, mask], 2)
  chex.assert_equal_shape([sampler_logp, trainer_logp, mask])
  m = _checks.as_mask(mask) > 0
  return jnp.where(m, _checks.f32(trainer_logp) - jnp.where(m, _checks.f32(sampler_logp), 0.0), 0.0)


def mismatch_metrics(
    sampler_logp: chex.Array,
    trainer_logp: chex.Array,
    mask: chex.Array,
    *,
    ratio_low: float = 0.5,
    ratio_high: float = 2.0,
) -> dict[str, chex.Array]:
  """How far the sampler's log-probs are from the trainer's, over the masked tokens of `[B, T]` arrays.

  With Δ_t = log π_trainer(o_t) − log π_sampler(o_t) and the tokens o_t drawn from π_sampler:

    mismatch_logp_diff_mean   mean_t |Δ_t|
    mismatch_logp_diff_max    max_t |Δ_t|
    mismatch_kl               mean_t (e^{Δ_t} − Δ_t − 1), the k3 estimate of D_KL[π_sampler ‖ π_trainer]
                              (`kl_divergence(sampler_logp, trainer_logp, "k3")`, Schulman's k3, ≥ 0)
    mismatch_ratio_outside    the fraction of tokens whose ratio ρ_t = e^{Δ_t} lies outside [ratio_low, ratio_high]

  All are 0 for identical log-probs, and 0 when no token is masked in. TRL logs the first two as
  "sampling/sampling_logp_difference/{mean,max}".

  Returns:
    float32 scalars, stop-gradient.
  """
  d = jax.lax.stop_gradient(_log_ratios(sampler_logp, trainer_logp, mask))
  m = _checks.as_mask(mask) > 0
  k3 = jnp.expm1(d) - d  # `kl_divergence`'s k3 with logp = the sampler's, ref_logp = the trainer's
  outside = (d < jnp.log(ratio_low)) | (d > jnp.log(ratio_high))
  return {"mismatch_logp_diff_mean": aggregation.masked_mean(jnp.abs(d), m),
          "mismatch_logp_diff_max": jnp.max(jnp.where(m, jnp.abs(d), 0.0), initial=0.0),
          "mismatch_kl": aggregation.masked_mean(k3, m),
          "mismatch_ratio_outside": aggregation.masked_mean(outside.astype(jnp.float32), m)}


def _level_log_ratios(d: chex.Array, mask: chex.Array, level: str) -> chex.Array:
  """log ρ per token: Δ_t ("token"), or Σ_t Δ_t of the row on every token ("sequence")."""
  if level == "token":
    return d
  if level == "sequence":
    return jnp.where(_checks.as_mask(mask) > 0, jnp.sum(d, axis=-1, keepdims=True), 0.0)
  raise ValueError(f"importance level {level!r} is unknown; expected 'token' or 'sequence'")


def truncated_is_weights(
    sampler_logp: chex.Array,
    trainer_logp: chex.Array,
    mask: chex.Array,
    *,
    cap: float = 2.0,
    level: Literal["token", "sequence"] = "token",
) -> chex.Array:
  """Truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly brings you
  off-policy RL training"):

    "token":     w_t = min(π_trainer(o_t) / π_sampler(o_t), C)
    "sequence":  w_t = min(Π_{t'} π_trainer(o_{t'}) / π_sampler(o_{t'}), C) on every token of the row

  computed in log space (min(Δ, log C), then exp), so no ratio overflows. Multiplies the per-token policy-gradient
  loss; π_trainer is π_old as the trainer computes it.

  Args:
    sampler_logp: `[B, T]` the sampler's log-probs of the sampled tokens.
    trainer_logp: `[B, T]` the trainer's log-probs of the same tokens.
    mask: `[B, T]` completion mask.
    cap: C > 0 (TRL's `vllm_importance_sampling_clip_max`, verl's `rollout_is_threshold`).
    level: "token" or "sequence".

  Returns:
    float32 `[B, T]` in [0, C], stop-gradient, 0 where masked out.
  """
  d = jax.lax.stop_gradient(_log_ratios(sampler_logp, trainer_logp, mask))
  log_w = _level_log_ratios(d, mask, level)
  w = jnp.exp(jnp.minimum(log_w, jnp.log(cap)))
  return jnp.where(_checks.as_mask(mask) > 0, w, 0.0)


def masked_is_weights(
    sampler_logp: chex.Array,
    trainer_logp: chex.Array,
    mask: chex.Array,
    *,
    lower: float = 0.5,
    upper: float = 2.0,
    level: Literal["token", "sequence"] = "token",
) -> chex.Array:
  """Masked importance sampling (MIS): the importance ratio where it lies in [L, U], 0 outside:

    "token":     w_t = ρ_t · 1[L ≤ ρ_t ≤ U],        ρ_t = π_trainer(o_t) / π_sampler(o_t)
    "sequence":  w_t = ρ(o) · 1[L ≤ ρ(o) ≤ U],      ρ(o) = Π_{t'} ρ_{t'}, on every token of the row

  Tokens (or whole sequences) where the two policies disagree too much are dropped from the policy gradient instead
  of being kept at a truncated weight (TRL's token_mask / sequence_mask with C_min = L, C_max = U; verl's token and
  sequence rejection sampling `rollout_rs`, whose lower bound defaults to 1/U). L = 0 bounds the ratio from above
  only, as TRL does without C_min.

  Args:
    sampler_logp: `[B, T]` the sampler's log-probs of the sampled tokens.
    trainer_logp: `[B, T]` the trainer's log-probs of the same tokens.
    mask: `[B, T]` completion mask.
    lower: L ≥ 0.
    upper: U ≥ L.
    level: "token" or "sequence".

  Returns:
    float32 `[B, T]` in {0} ∪ [L, U], stop-gradient, 0 where masked out.
  """
  d = jax.lax.stop_gradient(_log_ratios(sampler_logp, trainer_logp, mask))
  log_w = _level_log_ratios(d, mask, level)
  log_lower = jnp.log(lower) if lower > 0 else -jnp.inf
  keep = (log_w >= log_lower) & (log_w <= jnp.log(upper)) & (_checks.as_mask(mask) > 0)
  return jnp.where(keep, jnp.exp(jnp.minimum(log_w, jnp.log(upper))), 0.0)


def rollout_correction_weights(
    sampler_logp: chex.Array,
    trainer_logp: chex.Array,
    mask: chex.Array,
    correction: Correction,
    *,
    lower: float = 0.5,
    upper: float = 2.0,
) -> chex.Array:
  """The weights of `correction` (see the module docstring): "token_tis" / "seq_tis" truncate at C = `upper`
  (`truncated_is_weights`); "token_mis" / "seq_mis" keep ratios in [`lower`, `upper`] (`masked_is_weights`).

  Returns:
    float32 `[B, T]`, stop-gradient, 0 where masked out; 1 on every masked-in token when the log-probs agree.
  """
  level = "token" if correction.startswith("token_") else "sequence"
  if correction in ("token_tis", "seq_tis"):
    return truncated_is_weights(sampler_logp, trainer_logp, mask, cap=upper, level=level)
  if correction in ("token_mis", "seq_mis"):
    return masked_is_weights(sampler_logp, trainer_logp, mask, lower=lower, upper=upper, level=level)
  raise ValueError(f"rollout correction {correction!r} is unknown; expected one of {', '.join(CORRECTIONS)}")


def weight_metrics(weights: chex.Array, mask: chex.Array) -> dict[str, chex.Array]:
  """Summaries of correction weights over the masked tokens: "rollout_is_weight_mean", "rollout_is_weight_min",
  "rollout_is_weight_max" and "rollout_is_dropped_frac" (the fraction of tokens of weight 0, MIS's drops)."""
  chex.assert_equal_shape([weights, mask])
  m = _checks.as_mask(mask) > 0
  w = jax.lax.stop_gradient(_checks.f32(weights))
  any_token = jnp.any(m)
  return {"rollout_is_weight_mean": aggregation.masked_mean(w, m),
          "rollout_is_weight_min": jnp.where(any_token, jnp.min(jnp.where(m, w, jnp.inf)), 0.0),
          "rollout_is_weight_max": jnp.max(jnp.where(m, w, 0.0), initial=0.0),
          "rollout_is_dropped_frac": aggregation.masked_mean((w == 0).astype(jnp.float32), m)}
