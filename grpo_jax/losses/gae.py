"""Generalised advantage estimation over masked token sequences."""

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks


def gae(
    rewards: chex.Array,
    values: chex.Array,
    mask: chex.Array,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[chex.Array, chex.Array]:
  """Generalised advantage estimation (Schulman et al., 2016, arXiv 1506.02438).

    δ_t = r_t + γ V_{t+1} − V_t,    A_t = δ_t + γλ A_{t+1},    R_t = A_t + V_t.

  Used by PPO in DeepSeekMath eq. 1 with the per-token rewards of eq. 2. The value
  after the last masked-in token is 0: the episode ends there. Masked-out tokens are
  skipped, not ended at: a token's successor is the next masked-in token, so a mask
  with holes (tool output inside a multi-turn episode) chains the turns together.
  Masked-out positions get 0 advantage and 0 return. A reverse `lax.scan` over time.

  Args:
    rewards: `[B, T]` per-token rewards r_t.
    values: `[B, T]` value estimates V_t.
    mask: `[B, T]` true where the token belongs to the episode.
    gamma: discount γ.
    lam: GAE λ.

  Returns:
    `(advantages, returns)`, both `[B, T]` float32.
  """
  chex.assert_rank([rewards, values, mask], 2)
  chex.assert_equal_shape([rewards, values, mask])
  r_t, v_t, m_t = _checks.f32(rewards), _checks.f32(values), _checks.as_mask(mask)

  def step(carry, x):
    next_value, next_adv = carry
    r, v, m = x
    delta = r + gamma * next_value - v
    adv = delta + gamma * lam * next_adv
    keep = m > 0
    carry = (jnp.where(keep, v, next_value), jnp.where(keep, adv, next_adv))
    return carry, jnp.where(keep, adv, 0.0)

  batch = rewards.shape[0]
  init = (jnp.zeros((batch,), jnp.float32), jnp.zeros((batch,), jnp.float32))
  xs = (r_t.T, v_t.T, m_t.T)  # scan over time
  _, adv_t = jax.lax.scan(step, init, xs, reverse=True)
  advantages = adv_t.T
  returns = (advantages + v_t) * m_t
  return advantages, returns


def discounted_returns(rewards: chex.Array, mask: chex.Array, gamma: float = 1.0) -> chex.Array:
  """Reward-to-go G_t = Σ_{k≥0} γ^k r_{t+k} over the masked-in tokens, `[B, T]`.

  GAE with V ≡ 0 and λ = 1, so masking follows `gae`.
  """
  zeros = jnp.zeros(jnp.shape(rewards), jnp.float32)
  advantages, _ = gae(rewards, zeros, mask, gamma=gamma, lam=1.0)
  return advantages
