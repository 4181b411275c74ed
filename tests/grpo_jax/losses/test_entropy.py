import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import losses


def test_hand_computed(variant):
  entropy = jnp.array([[1.0, 2.0, 3.0], [4.0, 9.0, jnp.nan]])
  mask = jnp.array([[1, 1, 1], [1, 0, 0]])
  np.testing.assert_allclose(variant(losses.entropy_bonus, coef=0.1)(entropy, mask), -0.1 * 10 / 4, rtol=1e-6)


def test_micro_batches_with_global_counts_sum_to_the_batch():
  entropy = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
  mask = jnp.array([[1, 1, 1], [1, 0, 0]])
  whole = losses.entropy_bonus(entropy, mask, 0.5)
  parts = [losses.entropy_bonus(entropy[i:i + 1], mask[i:i + 1], 0.5, num_tokens=4.0) for i in range(2)]
  np.testing.assert_allclose(sum(parts), whole, rtol=1e-6)


def _entropy(logits):
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def test_its_gradient_raises_the_entropy():
  logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 5)) * 3.0
  mask = jnp.array([[1, 1, 0], [1, 1, 1]])
  grad = jax.grad(lambda z: losses.entropy_bonus(_entropy(z), mask, 0.1))(logits)
  # ∂H/∂z_v = −π_v (log π_v + H), so the bonus's gradient is c/N times π_v (log π_v + H) on masked-in rows.
  p = jax.nn.softmax(logits)
  expected = 0.1 / 5 * p * (jnp.log(p) + _entropy(logits)[..., None]) * mask[..., None]
  np.testing.assert_allclose(grad, expected, atol=1e-7)
  after = _entropy(logits - 1.0 * grad)
  assert bool(jnp.all(jnp.where(mask > 0, after > _entropy(logits), after == _entropy(logits))))
