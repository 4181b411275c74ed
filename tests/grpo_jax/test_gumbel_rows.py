"""Rows of JAX's Gumbel draw, computed alone (gumbel_rows.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry2x32_p

from grpo_jax.gumbel_rows import gumbel_rows, threefry2x32

u32 = lambda *xs: tuple(np.uint32(x) for x in xs)


@pytest.mark.parametrize("key, counter, expected", [
    # Known answers of Threefry-2x32-20 from the Random123 distribution (kat_vectors).
    (u32(0, 0), u32(0, 0), u32(0x6B200159, 0x99BA4EFE)),
    (u32(0xFFFFFFFF, 0xFFFFFFFF), u32(0xFFFFFFFF, 0xFFFFFFFF), u32(0x1CB996FC, 0xBB002BE7)),
    (u32(0x13198A2E, 0x03707344), u32(0x243F6A88, 0x85A308D3), u32(0xC4923A9C, 0x483DF7A0)),
])
def test_threefry_known_answers(key, counter, expected):
  out = jax.jit(threefry2x32)(*key, *counter)
  assert tuple(int(x) for x in out) == tuple(int(x) for x in expected)


def test_threefry_equals_jax_primitive():
  k0, k1 = jax.random.key_data(jax.random.key(11))
  x0, x1 = jax.random.bits(jax.random.key(12), (2, 1000), jnp.uint32)
  for mine, theirs in zip(threefry2x32(k0, k1, x0, x1), threefry2x32_p.bind(k0, k1, x0, x1)):
    np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("make_key", [jax.random.key, jax.random.PRNGKey], ids=["typed", "raw"])
def test_rows_equal_the_whole_draw(make_key):
  key = jax.random.fold_in(make_key(3), 17)
  whole = jax.random.gumbel(key, (48, 101))
  rows = jax.jit(gumbel_rows, static_argnums=(2, 3))
  for first, n in [(0, 48), (0, 24), (24, 24), (13, 7), (47, 1)]:
    np.testing.assert_array_equal(rows(key, first, n, (48, 101)), whole[first:first + n])
  np.testing.assert_array_equal(gumbel_rows(key, 5, 3, (48, 101)), whole[5:8])  # not jitted
  assert bool(jnp.isfinite(whole).all()) and abs(float(whole.mean()) - np.euler_gamma) < 0.05  # Gumbel(0, 1)


def test_rows_of_a_traced_shard_equal_the_whole_draw():
  """As a sampler's shard calls it: the first row from the shard index, under vmap as under shard_map."""
  key = jax.random.key(5)
  shard = jax.vmap(lambda i: gumbel_rows(key, i * 16, 16, (64, 33)))(jnp.arange(4))
  np.testing.assert_array_equal(shard.reshape(64, 33), jax.random.gumbel(key, (64, 33)))


def test_other_streams_fall_back_to_the_whole_draw():
  rbg = jax.random.key(7, impl="rbg")
  np.testing.assert_array_equal(gumbel_rows(rbg, 2, 3, (8, 5)), jax.random.gumbel(rbg, (8, 5))[2:5])
  key = jax.random.key(7)
  np.testing.assert_array_equal(gumbel_rows(key, 1, 2, (4, 6), jnp.bfloat16),
                                jax.random.gumbel(key, (4, 6), jnp.bfloat16)[1:3])
  for flag, value in [("jax_threefry_partitionable", False), ("jax_high_dynamic_range_gumbel", True)]:
    before = getattr(jax.config, flag)
    jax.config.update(flag, value)
    try:
      whole = jax.random.gumbel(key, (8, 5))
      np.testing.assert_array_equal(gumbel_rows(key, 4, 4, (8, 5)), whole[4:])
    finally:
      jax.config.update(flag, before)
    assert not bool((whole == jax.random.gumbel(key, (8, 5))).all())  # the flag changed the stream
