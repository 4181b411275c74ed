import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import sampling
from grpo_jax import training


def test_pad_left_truncates_from_the_left():
  tokens, mask = training.pad_left([[1, 2], [3, 4, 5, 6], []], 3, pad_id=0)
  np.testing.assert_array_equal(tokens, [[0, 1, 2], [4, 5, 6], [0, 0, 0]])
  np.testing.assert_array_equal(mask, [[0, 1, 1], [1, 1, 1], [0, 0, 0]])


def test_supervised_batch_layout():
  batch = training.supervised_batch([[7, 8]], [[1, 2, 3]], prompt_len=3, target_len=4, pad_id=0)
  np.testing.assert_array_equal(batch.tokens, [[0, 7, 8, 1, 2, 3, 0]])
  np.testing.assert_array_equal(batch.attention_mask, [[0, 1, 1, 1, 1, 1, 0]])
  np.testing.assert_array_equal(batch.loss_mask, [[0, 0, 0, 1, 1, 1, 0]])


def test_batch_from_samples_broadcasts_advantages_over_the_completion():
  samples = sampling.SampleOutput(
      prompt_tokens=jnp.array([[0, 5], [6, 7]]), prompt_mask=jnp.array([[0, 1], [1, 1]], bool),
      tokens=jnp.array([[9, 1, 0], [9, 9, 9]]), logprobs=jnp.array([[-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0]]),
      mask=jnp.array([[1, 1, 0], [1, 1, 1]], bool), lengths=jnp.array([2, 3]), truncated=jnp.array([False, True]))
  loss_mask = samples.mask & ~samples.truncated[:, None]  # --mask_truncated
  batch = training.batch_from_samples(samples, loss_mask, samples.logprobs, jnp.zeros((2, 3)), jnp.array([0.5, -1.0]))
  np.testing.assert_array_equal(batch.tokens, [[0, 5, 9, 1, 0], [6, 7, 9, 9, 9]])
  np.testing.assert_array_equal(batch.loss_mask, [[0, 0, 1, 1, 0], [0, 0, 0, 0, 0]])
  np.testing.assert_allclose(batch.advantages, [[0, 0, 0.5, 0.5, 0], [0, 0, 0, 0, 0]])
  np.testing.assert_allclose(batch.old_logp, [[0, 0, -1, -2, 0], [0, 0, -1, -1, -1]])


class _Tok:
  pad_token_id = 0

  def encode(self, text, add_special_tokens=False):
    del add_special_tokens
    return [ord(c) for c in text]


def test_encode_prompts_counts_truncation_and_rejects_empty():
  tokens, mask, truncated = training.encode_prompts(_Tok(), ["ab", "abcd"], 3)
  np.testing.assert_array_equal(tokens, [[0, 97, 98], [98, 99, 100]])
  assert truncated == 1 and mask.sum() == 5
  with pytest.raises(ValueError, match="tokenises to nothing"):
    training.encode_prompts(_Tok(), ["ok", ""], 3)
