import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import losses


def test_group_advantages_hand_computed(variant):
  rewards = jnp.array([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
  group = variant(losses.group_advantages, scale="group", eps=0.0)(rewards)
  np.testing.assert_allclose(group, [[1, -1, -1, 1], [0, 0, 0, 0]], atol=1e-6)
  sample_std = variant(losses.group_advantages, scale="group", eps=0.0, ddof=1)(rewards[:1])
  np.testing.assert_allclose(sample_std, [[0.866025, -0.866025, -0.866025, 0.866025]], rtol=1e-5)
  dr_grpo = variant(losses.group_advantages, scale="none")(rewards)
  np.testing.assert_allclose(dr_grpo, [[0.5, -0.5, -0.5, 0.5], [0, 0, 0, 0]])
  # Batch std of all eight rewards is sqrt(5.5 / 8).
  batch = variant(losses.group_advantages, scale="batch", eps=0.0)(rewards)
  np.testing.assert_allclose(batch, [[0.603023, -0.603023, -0.603023, 0.603023], [0, 0, 0, 0]], rtol=1e-5)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_zero_mean_per_group(scale):
  rewards = jax.random.uniform(jax.random.PRNGKey(0), (6, 8))
  adv = losses.group_advantages(rewards, scale=scale)
  np.testing.assert_allclose(jnp.mean(adv, axis=-1), 0.0, atol=1e-5)
  if scale == "group":
    np.testing.assert_allclose(jnp.std(adv, axis=-1), 1.0, atol=1e-2)


def test_group_advantages_bad_scale():
  with pytest.raises(ValueError, match="unknown scale 'std'"):
    losses.group_advantages(jnp.zeros((2, 2)), scale="std")


def test_process_advantages_hand_computed(variant):
  # Output 0: steps end at tokens 1 and 3 with rewards 1, 0. Output 1: steps end at 0 and 2
  # with rewards 0, 1. The third step slot is padding whose reward must be ignored.
  step_rewards = jnp.array([[[1.0, 0.0, 100.0], [0.0, 1.0, 100.0]]])
  step_ends = jnp.array([[[1, 3, 0], [0, 2, 0]]])
  step_mask = jnp.array([[[1, 1, 0], [1, 1, 0]]], bool)
  mask = jnp.array([[[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]], bool)
  adv = variant(losses.process_advantages, eps=0.0)(step_rewards, step_ends, step_mask, mask)
  # R = {1, 0, 0, 1}: mean 0.5, std 0.5, so normalised rewards are ±1.
  np.testing.assert_allclose(adv, [[[0, 0, -1, -1, 0], [0, 1, 1, 0, 0]]], atol=1e-6)
  # scale="none": centred rewards ±0.5 summed the same way, unscaled.
  unscaled = variant(losses.process_advantages, scale="none")(step_rewards, step_ends, step_mask, mask)
  np.testing.assert_allclose(unscaled, [[[0, 0, -0.5, -0.5, 0], [0, 0.5, 0.5, 0, 0]]], atol=1e-6)


def test_process_advantages_center_tokens_removes_the_drift(variant):
  # Both outputs score their first step 1 and their second 0 (R = {1, 0, 1, 0}, r̃ = ±1): every
  # suffix sum is 0 or -1, so no token is reinforced. Output 0 ends steps at 1, 3 (4 tokens),
  # output 1 at 0, 2 (3 tokens); the mean over the 7 tokens is -4/7.
  step_rewards = jnp.array([[[1.0, 0.0], [1.0, 0.0]]])
  step_ends = jnp.array([[[1, 3], [0, 2]]])
  step_mask = jnp.ones((1, 2, 2), bool)
  mask = jnp.array([[[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]], bool)
  plain = variant(losses.process_advantages, eps=0.0)(step_rewards, step_ends, step_mask, mask)
  np.testing.assert_allclose(plain, [[[0, 0, -1, -1, 0], [0, -1, -1, 0, 0]]], atol=1e-6)
  centred = variant(losses.process_advantages, eps=0.0, center_tokens=True)(step_rewards, step_ends, step_mask,
                                                                             mask)
  a, b = 4 / 7, -3 / 7
  np.testing.assert_allclose(centred, [[[a, a, b, b, 0], [a, b, b, 0, 0]]], atol=1e-6)
  np.testing.assert_allclose(jnp.sum(centred), 0.0, atol=1e-6)


def test_process_advantages_one_step_at_the_end_is_outcome_supervision():
  rewards = jax.random.uniform(jax.random.PRNGKey(3), (2, 4))
  lengths = jnp.array([[5, 3, 6, 2], [1, 6, 4, 4]])
  mask = jnp.arange(6)[None, None] < lengths[..., None]
  adv = losses.process_advantages(rewards[..., None], (lengths - 1)[..., None], jnp.ones((2, 4, 1), bool), mask)
  outcome = losses.group_advantages(rewards)
  np.testing.assert_allclose(adv, outcome[..., None] * mask, atol=1e-5)


def test_rloo(variant):
  adv = variant(losses.rloo_advantages)(jnp.array([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]]))
  np.testing.assert_allclose(adv, [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [4 / 3, -4 / 3, 0.0, 0.0]], atol=1e-6)
  with pytest.raises(ValueError, match="at least 2"):
    losses.rloo_advantages(jnp.zeros((3, 1)))


def test_whiten_and_reinforce_pp(variant):
  out = variant(losses.whiten)(jnp.array([[1.0, 2.0, 3.0, 100.0]]), jnp.array([[1, 1, 1, 0]]))
  np.testing.assert_allclose(out, [[-1.224745, 0.0, 1.224745, 0.0]], rtol=1e-5)
  # Reward-to-go [[1, 1, 1], [-1, -1, 0]] over 5 valid tokens: mean 0.2, std sqrt(0.96).
  token_rewards = jnp.array([[0.0, 0.0, 1.0], [0.0, -1.0, 7.0]])
  mask = jnp.array([[1, 1, 1], [1, 1, 0]])
  adv = variant(losses.reinforce_pp_advantages)(token_rewards, mask)
  hi, lo = 0.8 / np.sqrt(0.96), -1.2 / np.sqrt(0.96)
  np.testing.assert_allclose(adv, [[hi, hi, hi], [lo, lo, 0.0]], rtol=1e-5)


def test_vmap():
  rewards = jax.random.normal(jax.random.PRNGKey(5), (3, 4, 6))
  batched = jax.vmap(losses.group_advantages)(rewards)
  for i in range(3):
    np.testing.assert_allclose(batched[i], losses.group_advantages(rewards[i]), atol=1e-6)
  rloo = jax.vmap(losses.rloo_advantages)(rewards)
  np.testing.assert_allclose(rloo[1], losses.rloo_advantages(rewards[1]), atol=1e-6)
