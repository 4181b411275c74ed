"""The rollouts' training columns (`experiments/methods/rollouts.py`): a step's batch keeps its completions up to the
longest one, rounded up to `--completion_pad_multiple`. The methods' batches at both widths are compared in
tests/experiments/test_methods.py."""

import numpy as np
import pytest

from experiments.methods import rollouts as rollouts_lib
from grpo_jax import sampling


@pytest.mark.parametrize("lengths, multiple, width", [
    ([3, 35, 12], 4, 36), ([3, 32, 12], 4, 32), ([33], 8, 40), ([38], 4, 40),  # rounded up, at most max_new_tokens
    ([3, 35, 12], 0, 40),  # 0: every column
    ([3, 35, 12], 1, 35), ([0, 0], 4, 4),  # a step of empty completions keeps one multiple
])
def test_completion_width(lengths, multiple, width):
  assert rollouts_lib.completion_width(np.asarray(lengths), 40, multiple) == width


@pytest.mark.parametrize("longest, width", [(1, 4), (4, 4), (5, 8), (9, 16), (33, 64), (65, 128), (129, 192),
                                            (192, 192)])
def test_doubling_widths(longest, width):
  """`--completion_widths=doubling` with multiple 4 and 192 columns: 4, 8, 16, ..., 128, then the cap."""
  assert rollouts_lib.completion_width(np.asarray([1, longest]), 192, 4, doubling=True) == width


def test_doubling_compiles_a_few_widths():
  """Over every longest length 1 ... 192: 7 widths doubling (4, 8, ..., 128, 192), 48 as multiples of 4."""
  widths = lambda doubling: {rollouts_lib.completion_width(np.asarray([n]), 192, 4, doubling) for n in range(1, 193)}
  assert sorted(widths(True)) == [4, 8, 16, 32, 64, 128, 192] and len(widths(False)) == 48


def test_trim_keeps_the_first_columns_of_the_completion_fields():
  n, p, t = 3, 4, 10
  rng = np.random.default_rng(0)
  samples = sampling.SampleOutput(
      prompt_tokens=rng.integers(0, 9, (n, p)), prompt_mask=np.ones((n, p), bool), tokens=rng.integers(0, 9, (n, t)),
      logprobs=-rng.random((n, t)), mask=rng.random((n, t)) > 0.5, lengths=np.array([1, 2, 3]),
      truncated=np.zeros(n, bool))
  cut = rollouts_lib.trim_completions(samples, 6)
  for name in ("tokens", "logprobs", "mask"):
    np.testing.assert_array_equal(getattr(cut, name), getattr(samples, name)[:, :6])
  for name in ("prompt_tokens", "prompt_mask", "lengths", "truncated"):
    assert getattr(cut, name) is getattr(samples, name)
  assert rollouts_lib.trim_completions(samples, t) is samples
