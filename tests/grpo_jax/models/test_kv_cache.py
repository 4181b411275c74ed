"""The KV cache (models/kv_cache.py): writes at a shared or per-row index, a prefix's rows, shapes and layouts.

Decoding through the cache against full forwards is test_transformer.py's; decode attention is test_attention.py's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import models
from grpo_jax.models import kv_cache

CONFIG = models.ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8)


def _empty(b=2, s=4):
  """One layer's empty cache: one kv head of dimension 2, `s` slots."""
  return kv_cache.LayerKV(k=jnp.zeros((b, 1, 2, s)), v=jnp.zeros((b, 1, s, 2)))


def test_write_at_a_shared_index():
  """Two tokens a row from slot 1 on: keys as columns [D, S], values as rows [S, D]."""
  k = jnp.arange(1.0, 9.0).reshape(2, 2, 1, 2)  # [B, L, K, D]: row 0's tokens (1, 2) and (3, 4)
  out = kv_cache.write(_empty(), k, -k, jnp.int32(1))
  np.testing.assert_array_equal(out.k[0, 0], [[0, 1, 3, 0], [0, 2, 4, 0]])
  np.testing.assert_array_equal(out.k[1, 0], [[0, 5, 7, 0], [0, 6, 8, 0]])
  np.testing.assert_array_equal(out.v[0, 0], [[0, 0], [-1, -2], [-3, -4], [0, 0]])
  assert out.prefix is None


def test_write_at_each_rows_own_index_drops_past_the_end():
  k = jnp.array([[[[1.0, 2.0]]], [[[3.0, 4.0]]]])  # [B=2, L=1, K=1, D=2]
  out = kv_cache.write(_empty(), k, k, jnp.array([3, 4], jnp.int32))  # row 1's slot 4 is past S = 4: dropped
  np.testing.assert_array_equal(out.k[0, 0], [[0, 0, 0, 1], [0, 0, 0, 2]])
  np.testing.assert_array_equal(out.v[0, 0, 3], [1, 2])
  np.testing.assert_array_equal(out.k[1], 0.0)
  np.testing.assert_array_equal(out.v[1], 0.0)
  with pytest.raises(ValueError, match="one token per row"):
    kv_cache.write(_empty(), jnp.ones((2, 2, 1, 2)), jnp.ones((2, 2, 1, 2)), jnp.array([0, 1], jnp.int32))


def test_a_prefix_per_layer_and_per_row():
  """`layer_prefix` picks a layer's arrays (per-layer tuples or stacked); `prefix_per_row` gathers each cache row's
  prefix row by `rows`, and leaves a grouped prefix as it is."""
  ks = jnp.arange(3 * 2 * 5, dtype=jnp.float32).reshape(3, 2, 1, 1, 5)  # 3 layers, 2 prefix rows [K=1, D=1, P=5]
  vs = 100 + ks.reshape(3, 2, 1, 5, 1)
  mask = jnp.array([[True, True, True, False, False], [True] * 5])
  for k, v in ((tuple(ks), tuple(vs)), (ks, vs)):
    prefix = kv_cache.KVPrefix(k=k, v=v, mask=mask, rows=jnp.array([1, 0, 1]))
    layer = kv_cache.layer_prefix(prefix, 2)
    np.testing.assert_array_equal(layer.k, ks[2])
    np.testing.assert_array_equal(layer.v, vs[2])
  assert kv_cache.layer_prefix(None, 0) is None
  rows = kv_cache.prefix_per_row(layer)
  assert rows.rows is None
  np.testing.assert_array_equal(rows.k[:, 0, 0], [[25, 26, 27, 28, 29], [20, 21, 22, 23, 24], [25, 26, 27, 28, 29]])
  np.testing.assert_array_equal(rows.v, vs[2][jnp.array([1, 0, 1])])
  np.testing.assert_array_equal(rows.mask, mask[jnp.array([1, 0, 1])])
  grouped = kv_cache.prefix_per_row(layer._replace(rows=None))
  np.testing.assert_array_equal(grouped.k, ks[2])

@pytest.mark.parametrize("scan", [False, True])
def test_init_grow_and_prefix_shapes(scan):
  config = CONFIG.replace(scan_layers=scan)
  cache = kv_cache.init_cache(config, 6, 5)
  first_k = cache.k[0] if not scan else cache.k
  assert first_k.shape == ((3,) if scan else ()) + (6, 2, 8, 5)
  assert kv_cache.cache_batch_axis(first_k) == (1 if scan else 0)
  assert cache.mask.shape == (6, 5) and int(cache.index) == 0
  grown = kv_cache.grow_cache(cache._replace(mask=cache.mask.at[:, :2].set(True)), 7)
  assert jax.tree.leaves(grown.v)[0].shape[-2:] == (7, 8) and jax.tree.leaves(grown.k)[0].shape[-1] == 7
  np.testing.assert_array_equal(grown.mask.sum(-1), 2)
  prefix = kv_cache.as_prefix(grown)
  assert prefix.rows is None and prefix.mask.shape == (6, 7)
  with pytest.raises(ValueError, match="already has a prefix"):
    kv_cache.as_prefix(kv_cache.init_cache(config, 6, 2, prefix=prefix))


def test_own_columns_are_t_minus_one_rounded_up_to_whole_tiles():
  assert kv_cache.OWN_COLUMN_MULTIPLE == 16
  # T - 1 tokens are fed back: 191 -> 192, 63 -> 64, 15 -> 16, 16 -> 16, 17 -> 32; one token still gets a tile.
  assert [kv_cache.own_columns(t) for t in (192, 64, 16, 17, 18, 1, 2)] == [192, 64, 16, 16, 32, 16, 16]
