import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import losses

# Four tokens: (A, ρ) = (1, 1.5), (1, 0.5), (-1, 1.5), (-1, 0.5): test_surrogate.py's.
from tests.grpo_jax.losses.test_surrogate import (  # noqa: E402  pylint: disable=wrong-import-position
    ADV, LOGP, MASK, OLD)


def test_hand_computed(variant):
  loss = variant(losses.cispo_surrogate, eps_high=0.2)(LOGP, OLD, ADV, MASK)
  weights = np.array([[1.2, 0.5, 1.2, 0.5]])  # min(ρ, 1.2): no lower bound
  np.testing.assert_allclose(loss, -weights * np.asarray(ADV) * np.asarray(LOGP), rtol=1e-6)
  np.testing.assert_allclose(loss[0, 0], -1.2 * (-1.0 + np.log(1.5)), rtol=1e-6)  # 0.71344...
  both = variant(losses.cispo_surrogate, eps_high=0.2, eps_low=0.2)(LOGP, OLD, ADV, MASK)
  np.testing.assert_allclose(both, -np.array([[1.2, 0.8, 1.2, 0.8]]) * np.asarray(ADV) * np.asarray(LOGP), rtol=1e-6)


def test_gradient_is_the_clipped_weight_times_the_advantage_on_every_token():
  grad = jax.grad(lambda lp: jnp.sum(losses.cispo_surrogate(lp, OLD, ADV, MASK, 0.2)))(LOGP)
  np.testing.assert_allclose(grad, [[-1.2, -0.5, 1.2, 0.5]], rtol=1e-6)
  # PPO's clip drops tokens 0 and 3 (test_surrogate.py); CISPO keeps all four.
  clip_grad = jax.grad(lambda lp: jnp.sum(losses.clipped_surrogate(lp, OLD, ADV, MASK, 0.2)))(LOGP)
  np.testing.assert_array_equal(np.asarray(clip_grad)[0, [0, 3]], 0.0)


def test_no_token_loses_its_gradient_far_off_policy():
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
  old = -jax.random.uniform(k1, (6, 10), minval=0.1, maxval=4.0)
  logp = old + jax.random.uniform(k2, (6, 10), minval=-2.3, maxval=2.3)  # ρ in [0.1, 10]
  adv = jax.random.normal(k3, (6,))
  mask = jnp.arange(10)[None] < jnp.array([10, 7, 3, 10, 1, 5])[:, None]
  grad = jax.grad(lambda lp: jnp.sum(losses.cispo_surrogate(lp, old, adv, mask, 0.28)))(logp)
  assert bool(jnp.all(jnp.where(mask, grad != 0, grad == 0)))
  clip_grad = jax.grad(lambda lp: jnp.sum(losses.clipped_surrogate(lp, old, adv, mask, 0.28)))(logp)
  assert int(jnp.sum(mask & (clip_grad == 0))) > 5  # the comparison can fail: PPO drops many of them
  ratio = jnp.exp(logp - old)
  np.testing.assert_allclose(grad, jnp.where(mask, -jnp.minimum(ratio, 1.28) * adv[:, None], 0.0), rtol=1e-5)


def test_gradient_at_ratio_one_equals_the_surrogates():
  k1, k2 = jax.random.split(jax.random.PRNGKey(1))
  logp = -jax.random.uniform(k1, (4, 6), minval=0.1, maxval=3.0)
  adv = jax.random.normal(k2, (4,))
  mask = jnp.arange(6)[None] < jnp.array([6, 3, 1, 5])[:, None]

  def objective(fn):
    return lambda lp: losses.aggregate(fn(lp, jax.lax.stop_gradient(lp), adv, mask, 0.2), mask, "token-mean")

  np.testing.assert_allclose(jax.grad(objective(losses.cispo_surrogate))(logp),
                             jax.grad(objective(losses.clipped_surrogate))(logp), atol=1e-7)


def test_sequence_importance_weights_every_token_by_the_clipped_sequence_ratio():
  logp = jnp.array([[jnp.log(2.0), 0.0, 5.0]])
  old = jnp.zeros((1, 3))
  mask = jnp.array([[1, 1, 0]])
  loss = losses.cispo_surrogate(logp, old, jnp.array([1.0]), mask, 1.0, importance="sequence")
  s = np.sqrt(2.0)  # exp(mean(log 2, 0)), under the cap 2
  np.testing.assert_allclose(loss, [[-s * np.log(2.0), 0.0, 0.0]], rtol=1e-6)
  grad = jax.grad(lambda lp: jnp.sum(losses.cispo_surrogate(lp, old, jnp.array([1.0]), mask, 0.2,
                                                            importance="sequence")))(logp)
  np.testing.assert_allclose(grad, [[-1.2, -1.2, 0.0]], rtol=1e-6)


def test_padding_does_not_leak():
  mask = jnp.array([[1, 1, 0, 0]])
  poisoned = LOGP.at[0, 2:].set(-jnp.inf)
  loss = losses.cispo_surrogate(poisoned, OLD, ADV, mask, 0.2)
  np.testing.assert_array_equal(loss[0, 2:], 0.0)
  grad = jax.grad(lambda lp: jnp.sum(losses.cispo_surrogate(lp, OLD, ADV, mask, 0.2)))(poisoned)
  np.testing.assert_allclose(grad, [[-1.2, -0.5, 0.0, 0.0]], rtol=1e-6)


def test_truncation_fractions():
  stats = losses.cispo_truncation(LOGP, OLD, MASK, 0.2)
  np.testing.assert_allclose([stats["clip_frac_high"], stats["clip_frac_low"], stats["clip_frac"]], [0.5, 0.0, 0.5])
  stats = losses.cispo_truncation(LOGP, OLD, jnp.array([[1, 1, 1, 0]]), 0.2, eps_low=0.2)
  np.testing.assert_allclose([stats["clip_frac_high"], stats["clip_frac_low"], stats["clip_frac"]], [2 / 3, 1 / 3, 1.0])


def test_vmap_and_bfloat16():
  stacked = jnp.stack([LOGP, LOGP + 0.1])
  out = jax.vmap(lambda lp: losses.cispo_surrogate(lp, OLD, ADV, MASK, 0.2))(stacked)
  np.testing.assert_allclose(out[1], losses.cispo_surrogate(LOGP + 0.1, OLD, ADV, MASK, 0.2), rtol=1e-6)
  assert losses.cispo_surrogate(LOGP.astype(jnp.bfloat16), OLD, ADV, MASK, 0.2).dtype == jnp.float32
