import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import losses


def test_hand_computed(variant):
  values = jnp.array([[1.5, 0.9, 4.0]])
  old = jnp.array([[1.0, 1.0, 0.0]])
  returns = jnp.array([[2.0, 0.0, 1.0]])
  mask = jnp.array([[1, 1, 0]])
  # Token 0: max((1.5-2)^2, (1.2-2)^2) / 2 = 0.32; token 1 inside the clip range: 0.81 / 2.
  np.testing.assert_allclose(variant(losses.value_loss, clip=0.2)(values, old, returns, mask),
                             [[0.32, 0.405, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(variant(losses.value_loss, clip=None)(values, old, returns, mask),
                             [[0.125, 0.405, 0.0]], rtol=1e-6)


def test_gradient_zero_when_clipped_side_dominates():
  values, old, returns = jnp.array([[1.5]]), jnp.array([[1.0]]), jnp.array([[2.0]])
  grad = jax.grad(lambda v: jnp.sum(losses.value_loss(v, old, returns, jnp.ones((1, 1)), 0.2)))(values)
  np.testing.assert_allclose(grad, [[0.0]])
  grad = jax.grad(lambda v: jnp.sum(losses.value_loss(v, old, returns, jnp.ones((1, 1)), None)))(values)
  np.testing.assert_allclose(grad, [[-0.5]])


def test_vmap():
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 2, 4))
  out = jax.vmap(lambda v: losses.value_loss(v, v * 0.5, v + 1, jnp.ones((2, 4)), 0.1))(x)
  np.testing.assert_allclose(out[2], losses.value_loss(x[2], x[2] * 0.5, x[2] + 1, jnp.ones((2, 4)), 0.1))
