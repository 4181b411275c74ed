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
