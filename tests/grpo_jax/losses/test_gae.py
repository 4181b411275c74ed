import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from grpo_jax import losses


def test_hand_computed(variant):
  rewards = jnp.array([[1.0, 0.0, 2.0, 0.0], [1.0, 5.0, 0.0, 1.0]])
  values = jnp.array([[0.5, 1.0, 1.5, 9.0], [0.2, 7.0, 0.4, 0.6]])
  mask = jnp.array([[1, 1, 1, 0], [1, 0, 1, 1]], bool)
  adv, ret = variant(losses.gae, gamma=0.9, lam=0.8)(rewards, values, mask)
  # Row 0 ends at t=2 (V after it is 0); row 1 skips the masked-out t=1.
  np.testing.assert_allclose(adv, [[1.9112, 0.71, 0.5, 0.0], [1.46816, 0.0, 0.428, 0.4]], rtol=1e-5)
  np.testing.assert_allclose(ret, [[2.4112, 1.71, 2.0, 0.0], [1.66816, 0.0, 0.828, 1.0]], rtol=1e-5)


def test_gamma_lam_one_is_reward_to_go_minus_value():
  key_r, key_v = jax.random.split(jax.random.PRNGKey(0))
  rewards = jax.random.normal(key_r, (3, 7))
  values = jax.random.normal(key_v, (3, 7))
  lengths = jnp.array([7, 4, 1])
  mask = jnp.arange(7)[None] < lengths[:, None]
  adv, _ = losses.gae(rewards, values, mask, gamma=1.0, lam=1.0)
  masked_r = np.where(mask, rewards, 0.0)
  to_go = np.flip(np.cumsum(np.flip(masked_r, -1), -1), -1)
  np.testing.assert_allclose(adv, np.where(mask, to_go - values, 0.0), atol=1e-5)


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.9), (0.5, 0.0)])
def test_parity_with_rlax(gamma, lam):
  rng = np.random.default_rng(1)
  batch, length = 5, 11
  rewards = rng.normal(size=(batch, length)).astype(np.float32)
  values = rng.normal(size=(batch, length)).astype(np.float32)
  lengths = np.array([11, 6, 1, 9, 3])
  mask = np.arange(length)[None] < lengths[:, None]
  adv, ret = losses.gae(rewards, values, mask, gamma=gamma, lam=lam)
  for b, n in enumerate(lengths):
    expected = rlax.truncated_generalized_advantage_estimation(
        rewards[b, :n], jnp.full((n,), gamma), lam, jnp.append(values[b, :n], 0.0))
    np.testing.assert_allclose(adv[b, :n], expected, atol=1e-5)
    np.testing.assert_allclose(ret[b, :n], expected + values[b, :n], atol=1e-5)
    np.testing.assert_array_equal(adv[b, n:], 0.0)


def test_vmap_and_bfloat16():
  rng = np.random.default_rng(2)
  rewards = rng.normal(size=(4, 2, 5)).astype(np.float32)
  values = rng.normal(size=(4, 2, 5)).astype(np.float32)
  mask = rng.random((4, 2, 5)) > 0.3
  batched, _ = jax.vmap(lambda r, v, m: losses.gae(r, v, m, 0.9, 0.7))(rewards, values, mask)
  for i in range(4):
    np.testing.assert_allclose(batched[i], losses.gae(rewards[i], values[i], mask[i], 0.9, 0.7)[0], atol=1e-6)
  adv_bf16, _ = losses.gae(rewards[0].astype(jnp.bfloat16), values[0].astype(jnp.bfloat16), mask[0], 0.9, 0.7)
  assert adv_bf16.dtype == jnp.float32
  np.testing.assert_allclose(adv_bf16, batched[0], atol=0.05)


def test_discounted_returns():
  rewards = jnp.array([[1.0, 2.0, 3.0, 4.0]])
  mask = jnp.array([[1, 1, 1, 0]])
  np.testing.assert_allclose(losses.discounted_returns(rewards, mask, gamma=0.5), [[2.75, 3.5, 3.0, 0.0]])


def test_rejects_bad_shapes():
  with pytest.raises(AssertionError):
    losses.gae(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.ones((2, 3)))
