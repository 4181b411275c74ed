"""PPO for language models: the KL-penalised per-token reward and the actor loss."""

import chex
import jax.numpy as jnp

from grpo_jax.losses import _checks
from grpo_jax.losses import aggregation as aggregation_lib
from grpo_jax.losses import grpo
from grpo_jax.losses import kl as kl_lib


def last_token_mask(mask: chex.Array) -> chex.Array:
  """`[B, T]` float32, 1 at the last masked-in token of each row (all 0 for an empty row)."""
  chex.assert_rank(mask, 2)
  m = jnp.asarray(mask, bool)
  num_tokens = m.shape[-1]
  last = num_tokens - 1 - jnp.argmax(jnp.flip(m, -1), axis=-1)
  return (jnp.arange(num_tokens)[None, :] == last[:, None]) & jnp.any(m, axis=-1, keepdims=True)


def kl_penalized_rewards(
    scores: chex.Array,
    logp: chex.Array,
    ref_logp: chex.Array,
    mask: chex.Array,
    beta: float,
    kl: kl_lib.Estimator = "k1",
) -> chex.Array:
  """Per-token rewards of DeepSeekMath eq. 2 (arXiv 2402.03300):

    r_t = r_φ(q, o_≤t) − β log(π_θ(o_t) / π_ref(o_t)),

  where the reward model's score r_φ(q, o) lands on the last completion token only and
  the KL term (k1, the log-ratio, by default) on every token. Inputs are treated as
  constants: compute them from the sampling-time log-probs.

  Args:
    scores: `[B]` sequence scores.
    logp: `[B, T]` log π of the sampled tokens.
    ref_logp: `[B, T]` log π_ref.
    mask: `[B, T]` completion mask.
    beta: β.
    kl: the estimator of the per-token penalty.

  Returns:
    `[B, T]` float32 rewards, 0 where masked out.
  """
  chex.assert_rank(scores, 1)
  chex.assert_equal_shape_prefix([scores, mask], 1)
  penalty = kl_lib.kl_divergence(logp, ref_logp, kl, mask)
  last = last_token_mask(mask).astype(jnp.float32)
  return _checks.f32(scores)[:, None] * last - beta * penalty


def ppo_loss(
    logp: chex.Array,
    old_logp: chex.Array,
    advantages: chex.Array,
    mask: chex.Array,
    *,
    epsilon: float,
    epsilon_high: float | None = None,
    dual_clip: float | None = None,
    aggregation: aggregation_lib.Aggregation = "seq-mean-token-mean",
    max_len: int | None = None,
    num_sequences: chex.Numeric | None = None,
    num_tokens: chex.Numeric | None = None,
    rollout_weights: chex.Array | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
  """PPO actor loss, the negated objective of DeepSeekMath eq. 1:

    J = E[(1/|o|) Σ_t min(ρ_t A_t, clip(ρ_t, 1−ε, 1+ε) A_t)],

  A_t from `gae` over `kl_penalized_rewards`; the KL lives in the reward, not here. The
  critic's loss is `value_loss`. `rollout_weights` (`rollout_correction_weights`) multiply the
  per-token term. Returns `(loss, metrics)` as `grpo_loss` does.
  """
  return grpo.grpo_loss(
      logp, old_logp, None, advantages, mask, epsilon=epsilon, epsilon_high=epsilon_high, beta=0.0,
      aggregation=aggregation, dual_clip=dual_clip, max_len=max_len, num_sequences=num_sequences,
      num_tokens=num_tokens, rollout_weights=rollout_weights)
