"""experiments/studies/verdicts.py: each verdict by hand, at its boundaries."""

import pytest

from experiments.studies import verdicts


@pytest.mark.parametrize("mean,se,n,expect,word", [
    (0.05, 0.02, 5, ">", "reproduced"),      # interval [0.01, 0.09]
    (0.03, 0.02, 5, ">", "undecided"),       # [-0.01, 0.07]
    (-0.05, 0.02, 5, ">", "contradicted"),
    (-0.05, 0.02, 5, "<", "reproduced"),
    (0.05, 0.02, 5, "<", "contradicted"),
    (0.01, 0.02, 5, "=", "consistent"),      # [-0.03, 0.05] holds 0
    (0.05, 0.02, 5, "=", "contradicted"),
    (0.05, 0.02, 5, "", "reported"),
    (0.05, None, 1, ">", "undecided"),
    (0.0, 0.0, 3, "=", "consistent"),        # every seed equal: GSPO against GRPO
    (0.02, 0.0, 3, ">", "reproduced"),
    (0.05, 0.01, 2, ">", "undecided"),       # 5 s.e., but 2 seeds decide nothing
    (0.05, 0.01, 2, "", "reported"),
])
def test_words(mean, se, n, expect, word):
  assert verdicts.decide(mean, se, n, expect).word == word


@pytest.mark.parametrize("mean,se,word", [
    (0.011, 0.001, "consistent"),    # [0.009, 0.013] inside ±0.03, though 11 s.e. from zero
    (0.05, 0.005, "contradicted"),   # [0.04, 0.06] wholly above 0.03
    (0.02, 0.01, "undecided"),       # [0.00, 0.04] crosses 0.03
    (-0.02, 0.01, "undecided"),
])
def test_no_change_within_a_margin(mean, se, word):
  assert verdicts.decide(mean, se, 3, "=", margin=0.03).word == word
  if word == "consistent":
    assert verdicts.decide(mean, se, 3, "=").word == "contradicted"  # without a margin any change is one


@pytest.mark.parametrize("mean,se,expect,word", [
    (-0.005, 0.01, ">", "equal"),          # [-0.025, +0.015]: holds 0, inside ±0.03
    (0.01, 0.01, ">", "equal"),            # [-0.010, +0.030]: the edge is inside
    (0.02, 0.01, ">", "undecided"),        # [0.000, +0.040]: 0 is not above 0, and +0.040 is outside
    (0.025, 0.01, ">", "reproduced"),      # [+0.005, +0.045]: an ordering, though it crosses +0.03
    (0.015, 0.001, ">", "reproduced"),     # inside ±0.03 but above 0: a small ordering is still one
    (-0.025, 0.01, ">", "contradicted"),   # [-0.045, -0.005]
    (-0.01, 0.015, ">", "undecided"),      # [-0.040, +0.020]: crosses -0.03
    (0.005, 0.01, "<", "equal"),           # the mirror image
])
def test_ordering_within_a_margin(mean, se, expect, word):
  assert verdicts.decide(mean, se, 3, expect, margin=0.03).word == word
  if word == "equal":
    assert verdicts.decide(mean, se, 3, expect).word == "undecided"  # without a margin: never equal
    assert verdicts.decide(mean, se, 2, expect, margin=0.03).word == "undecided"  # 2 seeds decide nothing


def test_equal_in_points():
  v = verdicts.decide(-0.005, 0.01, 5, ">", scale=100, margin=0.03)
  assert v.detail == "0.5 s.e., no ordering outside ±3.0; 2 s.e. interval [-2.5, +1.5]"
  assert v.short == "[-2.5, +1.5] at 2 s.e., inside ±3.0: no ordering larger than 3.0"


def test_details_in_points():
  v = verdicts.decide(0.03, 0.02, 5, ">", scale=100)
  # 3 -> 2 s.e. needs the s.e. x 0.75, the seeds x 1/0.75^2: 5 x 16/9 = 8.9 -> 9
  assert v.detail == ("1.5 s.e., the paper's direction; 2 s.e. interval [-1.0, +7.0]; about 9 seeds would decide "
                      "it at this mean and spread")
  assert verdicts.seeds_to_decide(0.03, 0.02, 5) == 9 and verdicts.seeds_to_decide(0.039, 0.02, 5) == 6
  v = verdicts.decide(0.01, 0.02, 5, "=", scale=100)
  assert v.detail == "no change outside [-3.0, +5.0] at 2 s.e."
  assert verdicts.decide(-0.05, 0.02, 5, ">", scale=100).detail == "2.5 s.e. against; 2 s.e. interval [-9.0, -1.0]"
  with pytest.raises(ValueError, match="expect"):
    verdicts.decide(0.0, 0.1, 3, ">=")
