"""An entropy bonus: the policy's mean token entropy, subtracted from the loss to keep exploring."""

import chex

from grpo_jax.losses import _checks
from grpo_jax.losses import aggregation


def entropy_bonus(
    entropy: chex.Array,
    mask: chex.Array,
    coef: float,
    *,
    num_tokens: chex.Numeric | None = None,
) -> chex.Array:
  """The loss term −c · H̄, H̄ the token mean of the policy's entropy over the completions (PPO's c₂ S[π_θ],
  arXiv 1707.06347 eq. 9):

    ℓ_H = −c · (1/Σ_i |o_i|) Σ_{i,t} H(π_θ(· | q, o_{i,<t})),   H = −Σ_v π_v log π_v.

  Minimising ℓ_H raises the entropy for c > 0. The mean is over tokens whatever the policy loss's aggregation,
  so c means the same under every `aggregation` mode (TRL's `entropy_coef` convention).

  Args:
    entropy: `[B, T]` per-token entropy of π_θ, differentiated (for example `logprobs.token_logprobs(...,
      return_entropy=True)`).
    mask: `[B, T]` completion mask.
    coef: c.
    num_tokens: global token count Σ|o_i| for micro-batching (see `aggregation_weights`).

  Returns:
    The scalar ℓ_H (float32), to add to the loss.
  """
  chex.assert_rank(entropy, 2)
  return -coef * aggregation.aggregate(_checks.f32(entropy), mask, "token-mean", num_tokens=num_tokens)
