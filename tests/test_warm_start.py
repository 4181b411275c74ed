"""Stage 1 (`experiments/runner/warm_start.py`): SFT batches are padded to the longest demonstration, which
leaves the loss and its gradient as they are at the full budget's shapes."""

import functools

import jax
import numpy as np

from experiments.runner import warm_start
from grpo_jax import models
from grpo_jax import training
from grpo_jax.training import update as update_lib


def _demos(prompt_budget=16, target_budget=40):
  rng = np.random.default_rng(0)
  pairs = [(rng.integers(5, 90, rng.integers(3, 8)).tolist(), rng.integers(5, 90, rng.integers(2, 12)).tolist())
           for _ in range(12)]
  return warm_start.Demonstrations(pairs, prompt_budget, target_budget, stream=0)


def test_padded_lengths_are_the_longest_demonstration_within_the_budgets():
  demos = _demos()
  longest_prompt = max(len(p) for p, _ in demos.pairs)
  longest_target = max(len(t) for _, t in demos.pairs)
  assert warm_start.padded_lengths(demos) == (longest_prompt, longest_target)
  assert warm_start.padded_lengths(demos._replace(prompt_len=4, target_len=5)) == (4, 5)  # budgets cut


def test_trimmed_padding_gives_the_full_budget_loss_and_gradient():
  config = models.tiny_config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=1)
  params = models.init_params(config, jax.random.key(1))
  demos = _demos()
  prompts, targets = [p for p, _ in demos.pairs], [t for _, t in demos.pairs]
  objective = update_lib.bind(training.sft_objective, config=config, chunk_size=8)
  results = []
  for lengths in ((demos.prompt_len, demos.target_len), warm_start.padded_lengths(demos)):
    batch = training.supervised_batch(prompts, targets, *lengths, pad_id=0)
    totals = update_lib._totals(batch.loss_mask)  # pylint: disable=protected-access
    (loss, _), grads = jax.value_and_grad(objective, has_aux=True)(params, batch, totals)
    results.append((loss, grads, batch.tokens.shape))
  (full_loss, full_grads, full_shape), (loss, grads, shape) = results
  assert shape[1] < full_shape[1] - 10  # the trim is real
  np.testing.assert_allclose(loss, full_loss, rtol=1e-6)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-7), grads, full_grads)
