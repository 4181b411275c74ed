"""Tests for grpo_jax.evaluation.metrics: pass@k against enumeration, maj@k, summaries."""

import itertools
import math

import numpy as np
import pytest

from grpo_jax.data.example import Example
from grpo_jax.evaluation.metrics import (format_rate, maj_at_k, majority_vote, mean_length,
                                         pass_at_k, summarize)


def _brute_pass_at_k(n, c, k):
  samples = [True] * c + [False] * (n - c)
  subsets = list(itertools.combinations(samples, k))
  return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration():
  cases = [(n, c, k) for n in range(1, 9) for c in range(n + 1) for k in range(1, n + 1)]
  for k in range(1, 9):
    sub = [(n, c) for n, c, kk in cases if kk == k]
    n, c = np.array(sub).T
    expected = [_brute_pass_at_k(ni, ci, k) for ni, ci in sub]
    np.testing.assert_allclose(pass_at_k(n, c, k), expected, rtol=1e-12, atol=1e-12)


def test_pass_at_k_hand_values():
  assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # pass@1 = c / n
  assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
  assert pass_at_k(4, 1, 4) == 1.0
  assert pass_at_k(4, 0, 2) == 0.0
  # Large n: the product form stays finite where C(n, k) would overflow float64.
  assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5, abs=1e-12)
  exact = 1 - math.comb(1997, 1000) / math.comb(2000, 1000)
  assert pass_at_k(2000, 3, 1000) == pytest.approx(exact, rel=1e-12)
  out = pass_at_k(np.array([[5, 5], [6, 6]]), np.array([[0, 1], [2, 6]]), 1)
  assert out.shape == (2, 2)
  np.testing.assert_allclose(out, [[0.0, 0.2], [1 / 3, 1.0]])
  assert pass_at_k(np.array([10, 10]), 5, 3).shape == (2,)  # broadcasting


@pytest.mark.parametrize("n, c, k, error", [
    (5, 6, 1, ValueError), (5, -1, 1, ValueError), (5, 2, 6, ValueError), (5, 2, 0, ValueError),
    (5.0, 2, 1, TypeError),
])
def test_pass_at_k_validation(n, c, k, error):
  with pytest.raises(error):
    pass_at_k(n, c, k)


@pytest.mark.parametrize("answers, expected", [
    (["3", "4", "4"], "4"),
    (["3", "4", "4", "3"], "3"),  # tie: the group seen first wins
    (["4", "3", "3", "4"], "4"),
    (["1/2", "3", "0.5", "3", "\\frac{1}{2}"], "1/2"),  # equivalents vote together
    ([None, None, "7"], "7"),  # None never wins while an answer exists
    (["", None, "", "7"], "7"),
    ([None, None], None),
    ([], None),
    (["x+1", "x + 1", "2"], "x+1"),
])
def test_majority_vote(answers, expected):
  assert majority_vote(answers) == expected


def test_maj_at_k():
  answers = [["5", "6", "6", "5", "5"], ["1,000", "7", "1000"], [None, None, None]]
  refs = ["5", "1000", "3"]
  np.testing.assert_array_equal(maj_at_k(answers, refs, 1), [1.0, 1.0, 0.0])
  np.testing.assert_array_equal(maj_at_k(answers, refs, 3), [0.0, 1.0, 0.0])  # first 3 only
  np.testing.assert_array_equal(maj_at_k(answers[:1], refs[:1], 5), [1.0])
  with pytest.raises(ValueError, match="fewer than k=4"):
    maj_at_k(answers, refs, 4)
  with pytest.raises(ValueError, match="3 problems but 2 references"):
    maj_at_k(answers, refs[:2], 1)


def test_format_rate_and_mean_length():
  assert format_rate(["1+1=2\n#### 2", "#### 2", "x\n#### 2\n"]) == pytest.approx(2 / 3)
  assert format_rate([]) == 0.0
  assert format_rate(["a", "bb"], is_formatted=lambda c: len(c) == 2) == 0.5
  assert mean_length(["ab", "abcd"]) == 3.0
  assert mean_length(np.array([1, 2, 6])) == 3.0
  assert mean_length([]) == 0.0


def test_summarize():
  examples = [Example("1+1", "2", "1+1=2\n#### 2"), Example("2*3", "6", "2*3=6\n#### 6")]
  completions = [["1+1=2\n#### 2", "1+1=3\n#### 3", "#### 2"],
                 ["2*3=5\n#### 5", "2*3=5\n#### 5", "2*3=6\n#### 6"]]
  m = summarize(completions, examples, ks=(1, 3))
  assert m["pass@1"] == pytest.approx((2 / 3 + 1 / 3) / 2)
  assert m["pass@3"] == pytest.approx(1.0)
  assert m["maj@1"] == pytest.approx(0.5)
  assert m["maj@3"] == pytest.approx(0.5)  # problem 2's majority is the wrong 5
  assert m["accuracy"] == pytest.approx(3 / 6)
  assert m["format_rate"] == pytest.approx(5 / 6)
  assert m["mean_length"] == pytest.approx(np.mean([len(c) for cs in completions for c in cs]))
  assert m["num_problems"] == 2 and m["num_samples"] == 6
