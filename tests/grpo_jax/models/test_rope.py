"""RoPE (models/rope.py): the rotation by hand, and attention scores that depend on relative positions only."""

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import models
from grpo_jax.models import rope

CONFIG = models.ModelConfig(vocab_size=61, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=4, rope_theta=100.0)


def test_rotation_by_hand():
  """head_dim 4, theta 100: frequencies 1 and 0.1; at position 3 the pairs (x0, x2) and (x1, x3) turn by 3 and
  0.3 radians (the rotate-half layout)."""
  np.testing.assert_allclose(rope.rope_inv_freq(CONFIG), [1.0, 0.1], rtol=1e-6)
  cos, sin = rope.rope_tables(CONFIG, jnp.array([[0, 3]]))
  x = jnp.array([1.0, 2.0, 3.0, 4.0])
  got = rope.apply(jnp.broadcast_to(x, (1, 2, 1, 4)), cos, sin)
  np.testing.assert_allclose(got[0, 0, 0], x, rtol=1e-6)  # position 0: unchanged
  c3, s3, c03, s03 = np.cos(3.0), np.sin(3.0), np.cos(0.3), np.sin(0.3)
  np.testing.assert_allclose(got[0, 1, 0], [1 * c3 - 3 * s3, 2 * c03 - 4 * s03, 3 * c3 + 1 * s3, 4 * c03 + 2 * s03],
                             rtol=1e-5)


def test_scores_depend_on_relative_positions_only():
  q, k = jax.random.normal(jax.random.key(0), (2, 4))
  at = lambda x, p: rope.apply(x[None, None, None], *rope.rope_tables(CONFIG, jnp.array([[p]])))[0, 0, 0]
  score = lambda pq, pk: float(jnp.dot(at(q, pq), at(k, pk)))
  np.testing.assert_allclose(score(7, 2), score(5, 0), rtol=1e-5)
  np.testing.assert_allclose(score(12, 10), score(2, 0), rtol=1e-5)
  assert abs(score(7, 2) - score(7, 3)) > 1e-3
