"""Reward-model losses (losses/reward.py) against hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.losses import reward

LN2, LN3 = np.log(2.0), np.log(3.0)


def test_outcome_bce_hand_computed(variant):
  # σ(0) = 1/2, σ(ln 3) = 3/4, σ(−ln 3) = 1/4: the losses are ln 2, ln(4/3), ln(4/3).
  logits, labels = jnp.array([0.0, LN3, -LN3]), jnp.array([1.0, 1.0, 0.0])
  loss, metrics = variant(reward.outcome_bce_loss)(logits, labels)
  np.testing.assert_allclose(loss, (LN2 + 2 * np.log(4 / 3)) / 3, rtol=1e-6)
  np.testing.assert_allclose(metrics["accuracy"], 2 / 3, rtol=1e-6)  # s = 0 is not > 0: a miss on y = 1
  np.testing.assert_allclose(metrics["mean_probability"], (0.5 + 0.75 + 0.25) / 3, rtol=1e-6)
  np.testing.assert_allclose(metrics["mean_label"], 2 / 3, rtol=1e-6)
  mask = jnp.array([True, True, False])
  loss, _ = variant(reward.outcome_bce_loss)(logits, labels, mask)
  np.testing.assert_allclose(loss, (LN2 + np.log(4 / 3)) / 2, rtol=1e-6)
  loss, _ = variant(reward.outcome_bce_loss)(logits, labels, mask, num_examples=4)
  np.testing.assert_allclose(loss, (LN2 + np.log(4 / 3)) / 4, rtol=1e-6)


def test_outcome_bce_soft_label_gradient_and_stability():
  # y = 1/2 at s = ln 3: softplus(ln 3) − ln 3 / 2 = ln 4 − ln 3 / 2; dℓ/ds = σ(s) − y = 1/4.
  loss, _ = reward.outcome_bce_loss(jnp.array([LN3]), jnp.array([0.5]))
  np.testing.assert_allclose(loss, np.log(4) - LN3 / 2, rtol=1e-6)
  grad = jax.grad(lambda s: reward.outcome_bce_loss(s, jnp.array([0.5, 0.0]))[0])(jnp.array([LN3, 0.0]))
  np.testing.assert_allclose(grad, [0.25 / 2, 0.5 / 2], rtol=1e-6)
  loss, _ = reward.outcome_bce_loss(jnp.array([100.0, -100.0]), jnp.array([0.0, 1.0]))
  np.testing.assert_allclose(loss, 100.0, rtol=1e-6)
  loss, _ = reward.outcome_bce_loss(jnp.array([100.0, -100.0], jnp.bfloat16), jnp.array([1.0, 0.0]))
  assert loss.dtype == jnp.float32 and float(loss) < 1e-30


def test_step_bce_hand_computed(variant):
  logits = jnp.array([[0.0, LN3], [-LN3, 99.0]])
  labels = jnp.array([[1.0, 0.0], [0.0, 1.0]])
  mask = jnp.array([[True, True], [True, False]])
  # ln 2 + softplus(ln 3) + softplus(−ln 3) = ln 2 + ln 4 + ln(4/3) over 3 real steps.
  loss, metrics = variant(reward.step_bce_loss)(logits, labels, mask)
  np.testing.assert_allclose(loss, (LN2 + np.log(4) + np.log(4 / 3)) / 3, rtol=1e-6)
  np.testing.assert_allclose(metrics["accuracy"], 1 / 3, rtol=1e-6)  # only step (1, 0) is right
  loss, _ = variant(reward.step_bce_loss)(logits, labels, mask, num_steps=6.0)
  np.testing.assert_allclose(loss, (LN2 + np.log(4) + np.log(4 / 3)) / 6, rtol=1e-6)
  grad = jax.grad(lambda s: reward.step_bce_loss(s, labels, mask)[0])(logits)
  np.testing.assert_allclose(grad, [[(0.5 - 1) / 3, 0.75 / 3], [0.25 / 3, 0.0]], rtol=1e-6, atol=1e-7)


def test_pairwise_hand_computed(variant):
  chosen, rejected = jnp.array([LN3, 0.0, 5.0]), jnp.array([0.0, 0.0, -5.0])
  mask = jnp.array([True, True, False])
  # −log σ(ln 3) = ln(4/3), −log σ(0) = ln 2.
  loss, metrics = variant(reward.pairwise_reward_loss)(chosen, rejected, mask)
  np.testing.assert_allclose(loss, (np.log(4 / 3) + LN2) / 2, rtol=1e-6)
  np.testing.assert_allclose(metrics["accuracy"], 0.5)
  np.testing.assert_allclose(metrics["margin"], LN3 / 2, rtol=1e-6)
  # Only differences matter; the gradient on s⁺ is −(1 − σ(s⁺ − s⁻)) / P.
  grad = jax.grad(lambda c: reward.pairwise_reward_loss(c, rejected, mask)[0])(chosen)
  np.testing.assert_allclose(grad, [-0.25 / 2, -0.5 / 2, 0.0], rtol=1e-6)
  shifted, _ = reward.pairwise_reward_loss(chosen + 7.0, rejected + 7.0, mask)
  np.testing.assert_allclose(shifted, loss, rtol=1e-5)
  matrix, _ = variant(reward.pairwise_reward_loss)(jnp.zeros((2, 2)), jnp.zeros((2, 2)))
  np.testing.assert_allclose(matrix, LN2, rtol=1e-6)
