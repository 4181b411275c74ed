import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import losses


def test_hand_computed(variant):
  entropy = jnp.array([[1.0, 4.0, 100.0], [2.0, 3.0, 0.0]])
  mask = jnp.array([[1, 1, 0], [1, 1, 0]])  # the padded 100 is neither counted nor kept
  # ρ = 0.5: the median of {1, 2, 3, 4} is 2.5
  keep = variant(losses.top_entropy_mask, quantile=0.5)(entropy, mask)
  np.testing.assert_array_equal(keep, [[False, True, False], [False, True, False]])
  # ρ = 0.2 of ten tokens: the 0.8-quantile of 0..9 is 7.2, so the top two
  keep = losses.top_entropy_mask(jnp.arange(10.0)[None], jnp.ones((1, 10)), 0.2)
  np.testing.assert_array_equal(np.flatnonzero(keep), [8, 9])


def test_extremes_ties_and_an_empty_batch():
  entropy = jnp.array([[0.5, 2.0, 2.0, 1.0]])
  mask = jnp.array([[1, 1, 1, 0]])
  np.testing.assert_array_equal(losses.top_entropy_mask(entropy, mask, 1.0), mask.astype(bool))
  np.testing.assert_array_equal(losses.top_entropy_mask(entropy, mask, 0.0), [[False, True, True, False]])
  np.testing.assert_array_equal(losses.top_entropy_mask(entropy, jnp.zeros((1, 4)), 0.2), False)


def test_the_share_kept_matches_the_quantile():
  entropy = jax.random.uniform(jax.random.PRNGKey(0), (8, 50))
  mask = jnp.arange(50)[None] < jax.random.randint(jax.random.PRNGKey(1), (8, 1), 10, 51)
  keep = jax.jit(losses.top_entropy_mask)(entropy, mask, 0.2)
  share = float(jnp.sum(keep) / jnp.sum(mask))
  assert abs(share - 0.2) < 1 / float(jnp.sum(mask)) + 1e-6
  assert float(jnp.min(jnp.where(keep, entropy, jnp.inf))) >= float(jnp.max(jnp.where(mask & ~keep, entropy, -1)))


def test_not_differentiated():
  entropy = jnp.array([[1.0, 2.0, 3.0]])
  grad = jax.grad(lambda h: jnp.sum(losses.top_entropy_mask(h, jnp.ones((1, 3)), 0.5) * h))(entropy)
  np.testing.assert_array_equal(grad, [[0.0, 1.0, 1.0]])  # only through the product, not the selection
