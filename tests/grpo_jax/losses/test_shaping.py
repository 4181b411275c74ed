import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import losses


def test_overlong_penalty_hand_computed(variant):
  # L_max = 10, L_cache = 4: free up to 6, linear to -1 at 10, -1 beyond.
  out = variant(losses.overlong_penalty, max_len=10, cache_len=4)(jnp.array([5, 6, 8, 10, 11]))
  np.testing.assert_allclose(out, [0.0, 0.0, -0.5, -1.0, -1.0])


def test_overlong_penalty_bad_buffer():
  with pytest.raises(ValueError, match="cache_len"):
    losses.overlong_penalty(jnp.array([1]), max_len=4, cache_len=8)
