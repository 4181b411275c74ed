import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import losses

MASK = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]])
LOGP = jnp.log(jnp.array([[0.5, 0.25, 0.5, 0.9], [0.1, 0.2, 0.3, 0.4]]))


def test_sft_is_negative_mean_token_log_likelihood(variant):
  loss = variant(losses.paradigm_loss)(LOGP, losses.sft_coefficient(MASK), MASK)
  expected = -((np.log(0.5) + np.log(0.25) + np.log(0.5)) / 3 + (np.log(0.1) + np.log(0.2)) / 2) / 2
  np.testing.assert_allclose(loss, expected, rtol=1e-6)


def test_rft_keeps_only_correct_outputs():
  gc = losses.rft_coefficient(jnp.array([True, False]), MASK)
  np.testing.assert_array_equal(gc, [[1, 1, 1, 0], [0, 0, 0, 0]])
  grad = jax.grad(lambda lp: losses.paradigm_loss(lp, gc, MASK))(LOGP)
  np.testing.assert_allclose(grad, [[-1 / 6, -1 / 6, -1 / 6, 0], [0, 0, 0, 0]], rtol=1e-6)
  np.testing.assert_array_equal(losses.online_rft_coefficient(jnp.array([0, 1]), MASK), [[0, 0, 0, 0], [1, 1, 0, 0]])


def test_paradigm_loss_gradient_is_coefficient():
  coefficient = jax.random.normal(jax.random.PRNGKey(0), LOGP.shape)
  grad = jax.grad(lambda lp: losses.paradigm_loss(lp, coefficient, MASK))(LOGP)
  np.testing.assert_allclose(grad, -losses.aggregation_weights(MASK) * coefficient, atol=1e-7)


def test_grpo_coefficient_hand_computed():
  ref = LOGP + jnp.log(2.0)  # π_ref / π = 2 everywhere
  gc = losses.grpo_coefficient(jnp.array([1.0, -1.0]), LOGP, ref, beta=0.1)
  np.testing.assert_allclose(gc, [[1.1] * 4, [-0.9] * 4], rtol=1e-6)


def test_dpo_coefficient_matches_dpo_gradient():
  chosen = jnp.array([-3.0, -1.0])
  rejected = jnp.array([-2.0, -4.0])
  ref_chosen = jnp.array([-2.5, -2.0])
  ref_rejected = jnp.array([-2.5, -2.0])
  beta = 0.5
  gc_plus, gc_minus = losses.dpo_coefficient(chosen - ref_chosen, rejected - ref_rejected, beta)
  # Hand: margin β(Δ⁻ − Δ⁺) = 0.5 * (0.5 - (-0.5)) = 0.5 for the first pair.
  np.testing.assert_allclose(gc_plus[0], jax.nn.sigmoid(0.5), rtol=1e-6)
  np.testing.assert_allclose(gc_minus, -gc_plus)
  grad_c, grad_r = jax.grad(lambda c, r: losses.dpo_loss(c, r, ref_chosen, ref_rejected, beta)[0],
                            argnums=(0, 1))(chosen, rejected)
  batch = chosen.shape[0]
  np.testing.assert_allclose(grad_c, -beta * gc_plus / batch, rtol=1e-6)
  np.testing.assert_allclose(grad_r, -beta * gc_minus / batch, rtol=1e-6)
