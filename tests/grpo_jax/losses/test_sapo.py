import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import losses

RATIOS = jnp.array([[1.0, 1.5, 0.5, 1.5, 0.5]])
ADV = jnp.array([[2.0, 1.0, 1.0, -1.0, -1.0]])
OLD = jnp.array([[-1.0, -2.0, -0.5, -3.0, -1.5]])
LOGP = OLD + jnp.log(RATIOS)
MASK = jnp.ones((1, 5), bool)


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def test_hand_computed(variant):
  loss = variant(losses.sapo_surrogate, tau_pos=1.0, tau_neg=2.0)(LOGP, OLD, ADV, MASK)
  # f(1) = 4/τ · 1/2; A > 0 takes τ = 1, A < 0 τ = 2.
  expected = [-2.0 * 2.0, -4.0 * _sigmoid(0.5), -4.0 * _sigmoid(-0.5), 2.0 * _sigmoid(1.0), 2.0 * _sigmoid(-1.0)]
  np.testing.assert_allclose(loss, [expected], rtol=1e-6)
  np.testing.assert_allclose(loss[0, 1], -2.4898373, rtol=1e-6)


def test_gradient_is_the_gate_times_the_unclipped_gradient():
  tau = np.array([1.0, 1.0, 1.0, 2.0, 2.0])
  grad = jax.grad(lambda lp: jnp.sum(losses.sapo_surrogate(lp, OLD, ADV, MASK, 1.0, 2.0)))(LOGP)
  s = _sigmoid(tau * (np.asarray(RATIOS) - 1.0))
  w = 4 * s * (1 - s)
  np.testing.assert_allclose(grad, -w * np.asarray(RATIOS) * np.asarray(ADV), rtol=1e-5)
  np.testing.assert_allclose(losses.sapo_gradient_scale(LOGP, OLD, ADV, MASK, 1.0, 2.0), w, rtol=1e-5)
  assert float(w[0, 0]) == 1.0 and bool(np.all(w[0, 1:] < 1.0))
  # unlike the clip, no token's gradient is 0 (the clip's are at tokens 1 and 4)
  assert bool(jnp.all(grad != 0))


def test_gradient_at_ratio_one_equals_the_unclipped_surrogates():
  k1, k2 = jax.random.split(jax.random.PRNGKey(0))
  logp = -jax.random.uniform(k1, (4, 6), minval=0.1, maxval=3.0)
  adv = jax.random.normal(k2, (4,))
  mask = jnp.arange(6)[None] < jnp.array([6, 3, 1, 5])[:, None]

  def sapo(lp):
    return losses.aggregate(losses.sapo_surrogate(lp, jax.lax.stop_gradient(lp), adv, mask, 0.7, 1.3), mask)

  def unclipped(lp):  # −ρÂ
    return losses.aggregate(-jnp.exp(lp - jax.lax.stop_gradient(lp)) * adv[:, None], mask)

  np.testing.assert_allclose(jax.grad(sapo)(logp), jax.grad(unclipped)(logp), atol=1e-7)


def test_the_gate_fades_with_distance_and_temperature():
  ratios = jnp.array([[1.0, 1.2, 1.6, 3.0]])
  old = jnp.zeros((1, 4))
  adv = jnp.ones((1, 4))
  scale = losses.sapo_gradient_scale(jnp.log(ratios), old, adv, jnp.ones((1, 4)), 1.0, 1.0)
  assert bool(jnp.all(jnp.diff(scale) < 0))
  sharper = losses.sapo_gradient_scale(jnp.log(ratios), old, adv, jnp.ones((1, 4)), 4.0, 1.0)
  assert bool(jnp.all(sharper[0, 1:] < scale[0, 1:]))
  # negative advantages use tau_neg
  neg = losses.sapo_gradient_scale(jnp.log(ratios), old, -adv, jnp.ones((1, 4)), 1.0, 4.0)
  np.testing.assert_allclose(neg, sharper, rtol=1e-6)


def test_padding_does_not_leak():
  mask = jnp.array([[1, 1, 1, 0, 0]])
  poisoned = LOGP.at[0, 3:].set(-jnp.inf)
  loss = losses.sapo_surrogate(poisoned, OLD, ADV, mask)
  np.testing.assert_array_equal(loss[0, 3:], 0.0)
  grad = jax.grad(lambda lp: jnp.sum(losses.sapo_surrogate(lp, OLD, ADV, mask)))(poisoned)
  assert bool(jnp.all(jnp.isfinite(grad))) and bool(jnp.all(grad[0, 3:] == 0))


def test_vmap_and_bfloat16():
  stacked = jnp.stack([LOGP, LOGP + 0.1])
  out = jax.vmap(lambda lp: losses.sapo_surrogate(lp, OLD, ADV, MASK))(stacked)
  np.testing.assert_allclose(out[1], losses.sapo_surrogate(LOGP + 0.1, OLD, ADV, MASK), rtol=1e-6)
  assert losses.sapo_surrogate(LOGP.astype(jnp.bfloat16), OLD, ADV, MASK).dtype == jnp.float32
