"""Flow-GRPO loss (grpo_jax/losses/flow_grpo.py): eq. 7 broadcast, eq. 5 nested means, hand-worked numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import losses
from grpo_jax.losses import flow_grpo

SQRT2 = np.sqrt(2.0)


def test_outcome_advantages_broadcast_to_every_turn(variant):
  # Query 0: rewards (1, 0, 0): mean 1/3, std √2/3, A = (√2, −1/√2, −1/√2). Query 1: all equal, A = 0.
  rewards = jnp.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
  # Trajectory 0 has 2 turns, 1 has 3, 2 has 1, 3 to 5 one each.
  ids = jnp.array([0, 0, 1, 1, 1, 2, 3, 4, 5])
  adv = variant(flow_grpo.broadcast_outcome_advantages, eps=0.0)(rewards, ids)
  expected = [SQRT2, SQRT2, -1 / SQRT2, -1 / SQRT2, -1 / SQRT2, -1 / SQRT2, 0.0, 0.0, 0.0]
  np.testing.assert_allclose(adv, expected, rtol=1e-6, atol=1e-7)


def test_outcome_advantages_normalise_per_query():
  # (3, 1) and (10, 20, ...): each query normalised over its own G trajectories only.
  rewards = jnp.array([[3.0, 1.0], [10.0, 20.0]])
  adv = flow_grpo.broadcast_outcome_advantages(rewards, jnp.arange(4), eps=0.0)
  np.testing.assert_allclose(adv, [1.0, -1.0, -1.0, 1.0], rtol=1e-6)
  unscaled = flow_grpo.broadcast_outcome_advantages(rewards, jnp.array([3, 0]), scale="none")
  np.testing.assert_allclose(unscaled, [5.0, 1.0], rtol=1e-6)


def test_weights_are_nested_means(variant):
  # Rows: trajectory A turn 1 (2 tokens), A turn 2 (1 token), B turn 1 (3 tokens), a padding row.
  mask = jnp.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], bool)
  turns = jnp.array([2.0, 2.0, 1.0, 1.0])
  w = variant(flow_grpo.flow_grpo_weights)(mask, turns)
  # N = 1/2 + 1/2 + 1 = 2 trajectories; w = 1 / (N · T · |a|).
  expected = [[1 / 8, 1 / 8, 0], [1 / 4, 0, 0], [1 / 6, 1 / 6, 1 / 6], [0, 0, 0]]
  np.testing.assert_allclose(w, expected, rtol=1e-6)
  np.testing.assert_allclose(jnp.sum(w), 1.0, rtol=1e-6)  # every trajectory weighs 1/N
  halves = flow_grpo.flow_grpo_weights(mask, turns, num_trajectories=4.0)
  np.testing.assert_allclose(halves, np.asarray(expected) / 2, rtol=1e-6)


# The hand-worked case: one query, G = 2; trajectory A (reward 1) has 2 turns, B (reward 0) one turn.
# eps = 0: A_A = +1 on both of A's turns, A_B = −1. Ratios ρ and the clipped per-token surrogate (ε = 0.2):
#   A turn 1: ρ = (1.5, 1.0)      −min(ρ, clip ρ)  = (−1.2, −1.0)   mean −1.1
#   A turn 2: ρ = (0.5)           −min(0.5, 0.8)   = (−0.5)         mean −0.5   -> A: (1/2)(−1.1 − 0.5) = −0.8
#   B turn 1: ρ = (1.0, 1.3, 0.7)  max(ρ, clip ρ)  = (1.0, 1.3, 0.8) mean 31/30 -> B: 31/30
# pg_loss = (1/2)(−0.8 + 31/30) = 7/60. KL: only B's first token differs from the reference, d = log 2,
# k3 = 2 − log 2 − 1, weight 1/(2·1·3), β = 0.1: kl_loss = 0.1 (1 − log 2) / 6.
MASK = jnp.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], bool)
RATIO = jnp.array([[1.5, 1.0, 1.0], [0.5, 1.0, 1.0], [1.0, 1.3, 0.7]])
OLD = jnp.array([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0], [-1.5, -0.3, -2.0]])
LOGP = OLD + jnp.log(RATIO)
REF = LOGP.at[2, 0].add(np.log(2.0))
TURNS = jnp.array([2.0, 2.0, 1.0])
ADV = flow_grpo.broadcast_outcome_advantages(jnp.array([[1.0, 0.0]]), jnp.array([0, 0, 1]), eps=0.0)
PG = 7 / 60
KL_LOSS = 0.1 * (1 - np.log(2.0)) / 6


def test_loss_hand_worked(variant):
  np.testing.assert_allclose(ADV, [1.0, 1.0, -1.0], rtol=1e-6)
  loss, metrics = variant(flow_grpo.flow_grpo_loss, epsilon=0.2, beta=0.1)(LOGP, OLD, REF, ADV, MASK, TURNS)
  np.testing.assert_allclose(metrics["pg_loss"], PG, rtol=1e-5)
  np.testing.assert_allclose(metrics["kl_loss"], KL_LOSS, rtol=1e-5)
  np.testing.assert_allclose(loss, PG + KL_LOSS, rtol=1e-5)
  np.testing.assert_allclose(metrics["kl"], (1 - np.log(2.0)) / 6, rtol=1e-5)  # token mean over 6 action tokens
  # ρ = 1.5 (A > 0) and ρ = 0.7 (A < 0) are clipped; ρ = 0.5 with A > 0 and ρ = 1.3 with A < 0 are not.
  np.testing.assert_allclose(metrics["clip_frac"], 2 / 6, rtol=1e-6)
  no_ref, _ = flow_grpo.flow_grpo_loss(LOGP, OLD, None, ADV, MASK, TURNS, epsilon=0.2, beta=0.1)
  np.testing.assert_allclose(no_ref, PG, rtol=1e-5)


def test_gradient_hand_worked():
  grad = jax.grad(lambda lp: flow_grpo.flow_grpo_loss(lp, OLD, None, ADV, MASK, TURNS, epsilon=0.2, beta=0.0)[0])(LOGP)
  # ∂/∂log π of w·(−Aρ) is −w A ρ where the clip is inactive, 0 where it is active or masked out.
  expected = [[0.0, -1 / 8 * 1.0, 0.0], [-1 / 4 * 0.5, 0.0, 0.0], [1 / 6 * 1.0, 1 / 6 * 1.3, 0.0]]
  np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)


def test_padding_rows_and_positions_leave_the_loss_unchanged():
  pad = lambda x, v: jnp.concatenate([x, jnp.full((1, 3), v, x.dtype)])
  loss, _ = flow_grpo.flow_grpo_loss(pad(LOGP, jnp.nan), pad(OLD, 0.0), pad(REF, 0.0), jnp.append(ADV, 5.0),
                                     pad(MASK, False), jnp.append(TURNS, 1.0), epsilon=0.2, beta=0.1)
  np.testing.assert_allclose(loss, PG + KL_LOSS, rtol=1e-5)


def test_micro_batches_sum_to_the_batch_loss():
  # Trajectory A in one part, B in the other: with the global N = 2 the two losses add up.
  kw = dict(epsilon=0.2, beta=0.1, num_trajectories=2.0)
  first, _ = flow_grpo.flow_grpo_loss(LOGP[:2], OLD[:2], REF[:2], ADV[:2], MASK[:2], TURNS[:2], **kw)
  second, _ = flow_grpo.flow_grpo_loss(LOGP[2:], OLD[2:], REF[2:], ADV[2:], MASK[2:], TURNS[2:], **kw)
  np.testing.assert_allclose(first + second, PG + KL_LOSS, rtol=1e-5)


def test_single_turn_is_grpo():
  rng = np.random.default_rng(0)
  logp, old, ref = (jnp.asarray(rng.normal(size=(4, 5)) - 2.0, jnp.float32) for _ in range(3))
  mask = jnp.asarray(rng.random((4, 5)) > 0.3).at[:, 0].set(True)
  adv = jnp.asarray(rng.normal(size=(4,)), jnp.float32)
  flow, _ = flow_grpo.flow_grpo_loss(logp, old, ref, adv, mask, jnp.ones(4), epsilon=0.2, beta=0.04)
  grpo, _ = losses.grpo_loss(logp, old, ref, adv, mask, epsilon=0.2, beta=0.04)
  np.testing.assert_allclose(flow, grpo, rtol=1e-5)


def test_shape_checks():
  with pytest.raises(AssertionError):
    flow_grpo.flow_grpo_loss(LOGP, OLD, None, ADV[:, None], MASK, TURNS, epsilon=0.2, beta=0.0)
  with pytest.raises(AssertionError):
    flow_grpo.flow_grpo_weights(MASK, TURNS[:2])
