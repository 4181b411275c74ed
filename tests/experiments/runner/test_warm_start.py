"""Stage 1's batches (`experiments/runner/warm_start.py`): padded to the demonstrations' longest prompt and target
within the limits, with the same loss and gradient as batches padded to the limits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.runner import warm_start
from grpo_jax import models
from grpo_jax import training
from grpo_jax.training import update as update_lib


def _demos(pairs, prompt_len=16, target_len=40):
  return warm_start.Demonstrations(pairs, prompt_len, target_len, stream=0)


@pytest.mark.parametrize("pairs, limits, widths", [
    ([([1] * 7, [2] * 20), ([1] * 10, [2] * 35), ([1] * 3, [2] * 5)], (16, 40), (10, 35)),  # the pool's longest
    ([([1] * 20, [2] * 50), ([1] * 3, [2] * 5)], (16, 40), (16, 40)),  # longer ones are cut to the limits
    ([([], [2] * 4), ([], [2])], (16, 40), (1, 4)),  # prompts keep one column even when all are empty
])
def test_batch_widths(pairs, limits, widths):
  assert warm_start.batch_widths(_demos(pairs, *limits)) == widths


def test_narrow_batches_have_the_loss_and_gradient_of_padded_ones():
  config = models.tiny_config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=1)
  params = models.init_params(config, jax.random.key(0))
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(5, config.vocab_size, n)) for n in (3, 7, 5, 6)]
  targets = [list(rng.integers(5, config.vocab_size, n)) for n in (9, 4, 11, 2)]
  prompt_len, target_len = warm_start.batch_widths(_demos(list(zip(prompts, targets))))
  assert (prompt_len, target_len) == (7, 11)
  narrow = training.supervised_batch(prompts, targets, prompt_len, target_len, 0)
  padded = training.supervised_batch(prompts, targets, 16, 40, 0)
  assert narrow.tokens.shape == (4, 18) and padded.tokens.shape == (4, 56)
  # The narrow batch is the padded one without the columns that are padding in every row.
  columns = np.r_[16 - 7:16, 16:16 + 11]
  for name in ("tokens", "attention_mask", "loss_mask"):
    np.testing.assert_array_equal(getattr(narrow, name), np.asarray(getattr(padded, name))[:, columns], name)
  assert not np.asarray(padded.attention_mask)[:, np.setdiff1d(np.arange(56), columns)].any()
  objective = jax.jit(jax.value_and_grad(update_lib.bind(training.sft_objective, config=config, chunk_size=8),
                                         has_aux=True))
  totals = lambda batch: {"num_sequences": jnp.float32(4), "num_tokens": jnp.sum(batch.loss_mask)}  # noqa: E731
  (loss_n, _), grad_n = objective(params, narrow, totals(narrow))
  (loss_p, _), grad_p = objective(params, padded, totals(padded))
  # Each demonstration alone, without padding: the loss is the NLL of its target tokens, summed over the four
  # and divided by their 26 tokens (token-mean).
  nll = 0.0
  for prompt, target in zip(prompts, targets):
    logits, _ = models.apply(params, config, jnp.asarray([prompt + target]))
    logp = jax.nn.log_softmax(logits[0].astype(jnp.float32), axis=-1)
    nll -= sum(float(logp[t - 1, token]) for t, token in enumerate(prompt + target) if t >= len(prompt))
  np.testing.assert_allclose(loss_n, nll / 26, rtol=1e-5)
  np.testing.assert_allclose(loss_n, loss_p, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), grad_n, grad_p)
