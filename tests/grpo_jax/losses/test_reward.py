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



def test_within_problem_pairwise_hand_computed(variant):
  # Problem 1: right {ln 3} vs wrong {0, 9 (masked out)}; problem 2: right {0} vs wrong {0}; problem 3 has only
  # right rows. Pairs: (ln 3, 0) with −log σ(ln 3) = ln(4/3) and (0, 0) with ln 2; the right row of problem 3
  # is not paired with problem 1's wrong row.
  logits = jnp.array([LN3, 0.0, 9.0, 0.0, 0.0, 5.0])
  labels = jnp.array([1.0, 0.0, 0.0, 1.0, 0.0, 1.0])
  groups = jnp.array([1, 1, 1, 2, 2, 3])
  mask = jnp.array([True, True, False, True, True, True])
  loss, metrics = variant(reward.within_problem_pairwise_loss)(logits, labels, groups, mask)
  np.testing.assert_allclose(loss, (np.log(4 / 3) + LN2) / 2, rtol=1e-6)
  np.testing.assert_allclose(metrics["pairs"], 2.0)
  np.testing.assert_allclose(metrics["accuracy"], 0.5)
  # A constant per problem (its difficulty) changes nothing; moving one row within its problem does.
  offset = jnp.array([4.0, 4.0, 4.0, -7.0, -7.0, 2.0])
  shifted, _ = reward.within_problem_pairwise_loss(logits + offset, labels, groups, mask)
  np.testing.assert_allclose(shifted, loss, rtol=1e-5)
  moved, _ = reward.within_problem_pairwise_loss(logits.at[1].add(1.0), labels, groups, mask)
  assert moved > loss + 0.1
  empty, metrics = reward.within_problem_pairwise_loss(logits, jnp.ones(6), groups)
  assert float(empty) == 0.0 and float(metrics["pairs"]) == 0.0


def test_within_problem_pairwise_learns_the_ranking_bce_reverses():
  """Simpson's paradox: within every problem a right answer has the higher feature (x = a_g + y/2), but
  the hard problems (few right answers) have the high offsets a_g, so across problems x falls with
  correctness. A linear scorer s = w·x + b trained by pointwise BCE learns w < 0 and ranks every problem's
  samples backwards; trained by the within-problem pairwise loss it learns w > 0 and ranks them all right."""
  from grpo_jax.reward_models import metrics
  right = [3, 2, 1, 1]  # right answers of 4 samples, problems 0..3 with offsets a = 0, 2, 4, 6
  y = np.array([float(i < k) for k in right for i in range(4)], np.float32)
  groups = np.repeat(np.arange(4), 4)
  x = 2.0 * groups + 0.5 * y

  def train(loss_fn):
    params = {"w": jnp.zeros(()), "b": jnp.zeros(())}
    grad = jax.jit(jax.grad(lambda p: loss_fn(p["w"] * x + p["b"])[0]))
    for _ in range(300):
      params = jax.tree.map(lambda p, g: p - 0.5 * g, params, grad(params))
    return float(params["w"]), np.asarray(params["w"] * x + params["b"])

  w_bce, s_bce = train(lambda s: reward.outcome_bce_loss(s, y))
  w_bt, s_bt = train(lambda s: reward.within_problem_pairwise_loss(s, y, groups))
  # At w = 0 the pairwise gradient is −½ σ(0) = −¼ per pair (every pair has x⁺ − x⁻ = ½), whatever b.
  g = jax.grad(lambda w: reward.within_problem_pairwise_loss(w * x, y, groups)[0])(0.0)
  np.testing.assert_allclose(g, -0.25, rtol=1e-6)
  assert w_bce < -0.1 and w_bt > 1.0, (w_bce, w_bt)
  assert metrics.group_auc(s_bce, y, groups) == (0.0, 3 + 4 + 3 + 3)
  assert metrics.group_auc(s_bt, y, groups) == (1.0, 13)
  assert metrics.binary_auc(s_bce, y) > 0.6  # BCE does rank across problems: it learnt difficulty

def test_noisy_and_hand_computed(variant):
  # Row 0: σ(ln 3) · σ(0) = 3/4 · 1/2 = 3/8, logit ln(3/5); row 1: one step, σ(−ln 3) = 1/4, logit −ln 3;
  # row 2 has no step: p = 1 and it is left out of the loss. Losses: −ln(3/8) (y = 1), −ln(3/4) (y = 0).
  logits = jnp.array([[LN3, 0.0, 5.0], [-LN3, 9.0, 9.0], [1.0, 1.0, 1.0]])
  mask = jnp.array([[True, True, False], [True, False, False], [False, False, False]])
  labels = jnp.array([1.0, 0.0, 1.0])
  pooled = variant(reward.noisy_and_logits)(logits, mask)
  np.testing.assert_allclose(pooled[:2], [np.log(3 / 5), -LN3], rtol=1e-5)
  assert pooled[2] > 15  # p = 1, clamped to a large finite logit
  loss, metrics = variant(reward.noisy_and_outcome_loss)(logits, labels, mask)
  np.testing.assert_allclose(loss, (-np.log(3 / 8) - np.log(3 / 4)) / 2, rtol=1e-5)
  np.testing.assert_allclose(metrics["accuracy"], 1 / 2, rtol=1e-6)  # 3/8 < 1/2 misses y = 1; 1/4 is right
  np.testing.assert_allclose(metrics["mean_probability"], (3 / 8 + 1 / 4) / 2, rtol=1e-5)
  loss, _ = variant(reward.noisy_and_outcome_loss)(logits, labels, mask, num_examples=4)
  np.testing.assert_allclose(loss, (-np.log(3 / 8) - np.log(3 / 4)) / 4, rtol=1e-5)


def test_noisy_and_gradient_blames_the_doubted_step():
  # A wrong answer: dℓ/ds_j = p/(1 − p) · (1 − σ(s_j)), largest at the step the model already doubts;
  # a right one: −(1 − σ(s_j)). Masked steps get no gradient.
  logits = jnp.array([[3.0, -1.0, 2.0, 7.0]])
  mask = jnp.array([[True, True, True, False]])
  sig = jax.nn.sigmoid(logits[0, :3])
  p = float(jnp.prod(sig))
  for label, expected in ((0.0, p / (1 - p) * (1 - sig)), (1.0, -(1 - sig))):
    grad = jax.grad(lambda s: reward.noisy_and_outcome_loss(s, jnp.array([label]), mask)[0])(logits)
    np.testing.assert_allclose(grad[0, :3], expected, rtol=1e-5)
    assert grad[0, 3] == 0.0
  assert int(jnp.argmax(grad[0, :3] ** 2)) == 1


def test_noisy_and_is_stable_at_extremes():
  logits = jnp.array([[40.0, 40.0], [-40.0, 40.0], [-40.0, -40.0]])
  mask = jnp.ones((3, 2), bool)
  pooled = reward.noisy_and_logits(logits, mask)
  assert np.all(np.isfinite(pooled)) and pooled[0] > 15
  np.testing.assert_allclose(pooled[1:], [-40.0, -80.0], rtol=1e-5)  # log p − log(1 − p) → log p
  loss, _ = reward.noisy_and_outcome_loss(logits, jnp.array([1.0, 0.0, 0.0]), mask)
  grads = jax.grad(lambda s: reward.noisy_and_outcome_loss(s, jnp.array([1.0, 0.0, 0.0]), mask)[0])(logits)
  assert np.isfinite(loss) and loss < 1e-5 and np.all(np.isfinite(grads))
