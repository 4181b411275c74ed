import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import losses


def test_hand_computed(variant):
  logp = jnp.log(jnp.array([[0.5, 0.25, 0.8, 0.1]]))
  teacher = jnp.log(jnp.array([[0.5, 0.5, 0.4, 0.9]]))
  mask = jnp.array([[1, 1, 1, 0]])
  loss, metrics = variant(losses.distill_loss, epsilon=0.2)(logp, logp, teacher, mask)
  r = np.log([1.0, 2.0, 0.5])  # log π_T − log π_old on the three real tokens
  np.testing.assert_allclose(losses.reverse_kl_rewards(logp, teacher, mask)[0, :3], r, rtol=1e-6)
  np.testing.assert_allclose(loss, -np.mean(r), rtol=1e-6)  # ρ = 1: ℓ_t = −r_t, token mean
  np.testing.assert_allclose(metrics["reverse_kl"], -np.mean(r), rtol=1e-6)


def test_expected_gradient_is_the_exact_reverse_kl_gradient():
  # One context, a vocabulary of 5: averaging the sampled-token gradient over o ~ π_θ (by enumeration) gives
  # ∇_z D_KL[softmax(z) ‖ softmax(z_T)] exactly.
  z = jnp.array([1.0, -0.5, 0.3, 2.0, -1.2])
  z_teacher = jnp.array([0.2, 0.9, -0.3, 1.0, 0.4])
  teacher = jax.nn.log_softmax(z_teacher)

  def sampled(z, v):
    logp = jax.nn.log_softmax(z)[v].reshape(1, 1)
    return losses.distill_loss(logp, jax.lax.stop_gradient(logp), teacher[v].reshape(1, 1), jnp.ones((1, 1)),
                               epsilon=0.2)[0]

  pi = jax.nn.softmax(z)
  expected = sum(pi[v] * jax.grad(sampled)(z, v) for v in range(5))
  exact = jax.grad(lambda z: jnp.sum(jax.nn.softmax(z) * (jax.nn.log_softmax(z) - teacher)))(z)
  np.testing.assert_allclose(expected, exact, atol=1e-6)
  assert float(jnp.abs(exact).max()) > 0.05


def test_a_student_equal_to_its_teacher_gets_no_gradient():
  logp = jnp.log(jnp.array([[0.5, 0.25, 0.8]]))
  grad = jax.grad(lambda lp: losses.distill_loss(lp, jax.lax.stop_gradient(lp), logp, jnp.ones((1, 3)),
                                                 epsilon=0.2)[0])(logp)
  np.testing.assert_array_equal(grad, 0.0)


def test_off_policy_tokens_are_clipped():
  old = jnp.log(jnp.array([[0.2, 0.2]]))
  logp = old + jnp.log(jnp.array([[1.5, 1.1]]))  # ratios 1.5 (clipped, r > 0) and 1.1
  teacher = jnp.log(jnp.array([[0.4, 0.4]]))  # r = log 2 on both
  fn = lambda lp: losses.distill_loss(lp, old, teacher, jnp.ones((1, 2)), epsilon=0.2)[0]
  np.testing.assert_allclose(fn(logp), -np.log(2) * (1.2 + 1.1) / 2, rtol=1e-6)
  np.testing.assert_allclose(jax.grad(fn)(logp), [[0.0, -np.log(2) * 1.1 / 2]], rtol=1e-6)


def test_padding_does_not_leak():
  logp = jnp.log(jnp.array([[0.5, 0.25, 0.8]]))
  mask = jnp.array([[1, 1, 0]])
  poisoned = jnp.array([[jnp.log(0.5), jnp.log(0.5), -jnp.inf]])
  loss, metrics = losses.distill_loss(logp, logp, poisoned, mask, epsilon=0.2)
  np.testing.assert_allclose(loss, -np.log(2) / 2, rtol=1e-6)
  assert all(bool(jnp.isfinite(v)) for v in metrics.values())
  grad = jax.grad(lambda lp: losses.distill_loss(lp, jax.lax.stop_gradient(lp), poisoned, mask, epsilon=0.2)[0])(logp)
  np.testing.assert_allclose(grad, [[0.0, -np.log(2) / 2, 0.0]], atol=1e-7)
