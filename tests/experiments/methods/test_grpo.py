"""GRPO's step batch (`grpo.step_batch`): one program from the sampler's rows to the training batch, against values
worked by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.methods import grpo
from grpo_jax import sampling

_SETTINGS = dict(group_size=2, mask_truncated=False, estimator="grpo", scale="group", eps=0.0, beta=0.04, kl="k1",
                 center_tokens=False)


def _samples():
  """2 prompts x 2 samples, 1 prompt token, 3 completion columns; row 1 is truncated."""
  mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], bool)
  return sampling.SampleOutput(
      prompt_tokens=np.full((4, 1), 7, np.int32), prompt_mask=np.ones((4, 1), bool),
      tokens=np.arange(12, dtype=np.int32).reshape(4, 3), logprobs=np.where(mask, -0.5, 0.0).astype(np.float32),
      mask=mask, lengths=mask.sum(1).astype(np.int32), truncated=np.array([False, True, False, False]))


def test_group_advantages_the_loss_mask_and_the_layout():
  samples, rewards = _samples(), np.array([1.0, 0.0, 0.0, 0.0], np.float32)
  ref = np.full((4, 3), -1.0, np.float32)
  batch, positive = jax.jit(lambda *a: grpo.step_batch(*a, **_SETTINGS))(samples, rewards, 4, None, ref)
  # group 0: rewards (1, 0): mean 0.5, std 0.5 -> Â = (+1, -1); group 1: equal rewards -> 0
  np.testing.assert_allclose(batch.advantages[:, 1:], [[1, 1, 0], [-1, -1, -1], [0, 0, 0], [0, 0, 0]])
  np.testing.assert_array_equal(batch.advantages[:, 0], 0.0)  # the prompt column
  np.testing.assert_array_equal(batch.loss_mask[:, 1:], samples.mask)
  np.testing.assert_array_equal(batch.tokens[:, 0], 7)
  np.testing.assert_array_equal(batch.tokens[:, 1:], samples.tokens)
  np.testing.assert_array_equal(batch.old_logp, 0.0)  # None: not read
  np.testing.assert_array_equal(batch.ref_logp[:, 1:], ref)
  np.testing.assert_array_equal(batch.sampler_logp[:, 1:], samples.logprobs)
  assert int(positive) == 1


def test_filler_groups_and_truncated_rows_leave_the_loss():
  samples, rewards = _samples(), np.array([1.0, 0.0, 1.0, 0.0], np.float32)
  settings = dict(_SETTINGS, mask_truncated=True)
  batch, positive = jax.jit(lambda *a: grpo.step_batch(*a, **settings))(samples, rewards, 2, None, None)
  expected = samples.mask.copy()
  expected[1] = False  # truncated
  expected[2:] = False  # past the trained rows: a short dynamic-sampling batch's filler group
  np.testing.assert_array_equal(batch.loss_mask[:, 1:], expected)
  np.testing.assert_allclose(batch.advantages[:, 1:], np.where(expected, [[1], [-1], [1], [-1]], 0.0))
  # the positive rows count Â > 0 before the mask: both groups' rewarded rows
  assert int(positive) == 2


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_pp"])
def test_the_estimators_match_their_losses(estimator):
  from grpo_jax import losses  # pylint: disable=import-outside-toplevel
  samples, rewards = _samples(), np.array([1.0, 0.0, 0.5, 0.0], np.float32)
  old, ref = np.full((4, 3), -0.5, np.float32), np.full((4, 3), -1.0, np.float32)
  settings = dict(_SETTINGS, estimator=estimator)
  batch, _ = jax.jit(lambda *a: grpo.step_batch(*a, **settings))(samples, rewards, 4, old, ref)
  mask = jnp.asarray(samples.mask)
  if estimator == "rloo":  # r_i − mean of the others
    expected = np.array([1.0, -1.0, 0.5, -0.5])[:, None] * samples.mask
  else:
    expected = losses.reinforce_pp_advantages(losses.kl_penalized_rewards(rewards, old, ref, mask, 0.04, kl="k1"),
                                              mask) * mask
  np.testing.assert_allclose(batch.advantages[:, 1:], expected, rtol=1e-6)
