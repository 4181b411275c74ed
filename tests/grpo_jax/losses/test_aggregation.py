import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import losses

PER_TOKEN = jnp.array([[1.0, 2.0, 3.0, jnp.nan], [4.0, jnp.inf, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
MASK = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], bool)  # the third row is empty padding


@pytest.mark.parametrize("mode,expected", [
    ("seq-mean-token-mean", (2.0 + 4.0) / 2),
    ("token-mean", (1 + 2 + 3 + 4) / 4),
    ("seq-mean-token-sum", (6 + 4) / 2),
    ("seq-mean-token-sum-norm", (6 / 4 + 4 / 4) / 2),
])
def test_hand_computed(variant, mode, expected):
  np.testing.assert_allclose(variant(losses.aggregate, mode=mode)(PER_TOKEN, MASK), expected, rtol=1e-6)


def test_sum_norm_constant_length():
  out = losses.aggregate(PER_TOKEN, MASK, "seq-mean-token-sum-norm", max_len=10)
  np.testing.assert_allclose(out, (0.6 + 0.4) / 2, rtol=1e-6)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum"])
def test_micro_batches_with_global_counts_sum_to_full_batch(mode):
  x = jax.random.normal(jax.random.PRNGKey(0), (6, 5))
  mask = jnp.arange(5)[None] < jnp.array([5, 2, 4, 1, 3, 5])[:, None]
  full = losses.aggregate(x, mask, mode)
  parts = sum(losses.aggregate(x[i:i + 2], mask[i:i + 2], mode, num_sequences=6, num_tokens=jnp.sum(mask))
              for i in range(0, 6, 2))
  np.testing.assert_allclose(parts, full, rtol=1e-5)


def test_bad_mode():
  with pytest.raises(ValueError, match="aggregation mode 'mean' is unknown"):
    losses.aggregate(PER_TOKEN, MASK, "mean")


def test_masked_mean_hand_computed(variant):
  # PER_TOKEN holds NaN and inf at masked positions: they contribute exactly 0, not NaN.
  mean = variant(losses.masked_mean)
  np.testing.assert_allclose(mean(PER_TOKEN, MASK), (1 + 2 + 3 + 4) / 4, rtol=1e-6)
  np.testing.assert_allclose(mean(PER_TOKEN, MASK.astype(jnp.float32)), 2.5, rtol=1e-6)  # a 0/1 mask alike
  rows = variant(losses.masked_mean, axis=-1, keepdims=True)(PER_TOKEN, MASK)
  np.testing.assert_allclose(rows, [[2.0], [4.0], [0.0]], rtol=1e-6)  # an empty row's mean is 0
  assert rows.dtype == jnp.float32


def test_masked_mean_gradient_ignores_masked_nan():
  x = jnp.array([1.0, 3.0, jnp.nan])
  grad = jax.grad(lambda v: losses.masked_mean(v, jnp.array([True, True, False])))(x)
  np.testing.assert_array_equal(grad, [0.5, 0.5, 0.0])


def test_masked_mean_checks_shapes():
  with pytest.raises(AssertionError):
    losses.masked_mean(jnp.ones((2, 3)), jnp.ones((2,), bool))
