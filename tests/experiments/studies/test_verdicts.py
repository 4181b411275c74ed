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


# THE DESIGN RULE: Student-t intervals and p-values, Holm across the family.

SEEDS8 = [0.02, 0.05, -0.01, 0.04, 0.03, 0.06, 0.01, 0.04]  # mean 0.03, s = 0.022678, s.e. = 0.0080178


def _mean_se(values):
  import math as m
  mean = sum(values) / len(values)
  return mean, m.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def test_t_interval_and_p_against_scipy():
  from scipy import stats
  mean, se = _mean_se(SEEDS8)
  lo, hi = verdicts.t_interval(mean, se, 8)
  # by hand: t_{0.975, 7} = 2.364624; 0.03 ± 2.364624 x 0.0080178 = [0.011041, 0.048959]
  assert (lo, hi) == pytest.approx((0.011041, 0.048959), abs=1e-6)
  ref = stats.ttest_1samp(SEEDS8, 0.0)
  assert (lo, hi) == pytest.approx(tuple(ref.confidence_interval(0.95)), rel=1e-9)
  assert verdicts.p_zero(mean, se, 8) == pytest.approx(ref.pvalue, rel=1e-9)  # t = 3.7417, p = 0.007247
  assert verdicts.p_zero(mean, se, 8) == pytest.approx(0.007247, abs=1e-6)
  # at 3 seeds the 95% interval is m ± 4.303 s.e., where the old rule took ± 2
  assert verdicts.t_interval(0.0, 1.0, 3) == pytest.approx((-4.302653, 4.302653), abs=1e-6)
  # TOST against ±0.05: the larger of the one-sided p-values, P(T_7 >= (0.05 - 0.03) / s.e.) = P(T_7 >= 2.4944)
  upper = stats.ttest_1samp(SEEDS8, 0.05, alternative="less").pvalue
  lower = stats.ttest_1samp(SEEDS8, -0.05, alternative="greater").pvalue
  assert verdicts.p_wide(mean, se, 8, 0.05) == pytest.approx(max(upper, lower), rel=1e-9)
  # outside ±0.01: twice P(T_7 >= (0.03 - 0.01) / s.e.), the side the data picked
  assert verdicts.p_narrow(mean, se, 8, 0.01) == pytest.approx(
      2 * stats.ttest_1samp(SEEDS8, 0.01, alternative="greater").pvalue, rel=1e-9)
  # a zero standard error: every seed alike
  assert verdicts.p_zero(0.02, 0.0, 8) == 0.0 and verdicts.p_zero(0.0, 0.0, 8) == 1.0
  assert verdicts.p_wide(0.0, 0.0, 8, 0.03) == 0.0 and verdicts.p_narrow(0.0, 0.0, 8, 0.03) == 1.0


def test_holm_by_hand():
  # sorted 0.005, 0.010, 0.030, 0.040 against 0.05/4, 0.05/3, 0.05/2, 0.05/1: the first two pass, the third fails
  # (0.030 > 0.025) and Holm stops, so 0.040 is not rejected either, though 0.040 <= 0.05.
  # adjusted: 4 x 0.005 = 0.02; 3 x 0.010 = 0.03; 2 x 0.030 = 0.06; max(0.06, 1 x 0.040) = 0.06
  adjusted = verdicts.holm([0.010, 0.040, 0.030, 0.005])
  assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
  assert [p <= 0.05 for p in adjusted] == [True, False, False, True]
  # Bonferroni (m x p) would reject only 0.005 and 0.010 too, but here Holm is no looser; with 0.012 instead of
  # 0.030 the step-down rejects everything: 4 x 0.005, 3 x 0.010, 2 x 0.012, 1 x 0.040, all <= 0.05, where
  # Bonferroni's 4 x 0.040 = 0.16 does not
  assert verdicts.holm([0.010, 0.040, 0.012, 0.005]) == pytest.approx([0.03, 0.04, 0.03, 0.02])
  assert verdicts.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1, monotone
  assert verdicts.holm([]) == []


def test_the_family_decides_a_worked_example():
  """Three claims, 8 seeds each, in points: (a) a beats b by +3.0 ± 0.80 (the SEEDS8 values); (b) c beats d by
  +0.4 ± 0.5 with a ±3 margin; (c) Pass@64 stays flat, +0.5 ± 0.4 with a ±3 margin; and one reported cell.
  Five hypotheses: a's zero (p = 0.00725), b's zero (t = 0.8, p = 0.4497) and inside ±3 (t = 5.2, p = 0.000625),
  c's inside ±3 (t = 6.25, p = 0.000212) and outside ±3 (t = -6.25, p = 1). Holm: 5 x 0.000212 = 0.00106,
  4 x 0.000625 = 0.0025, 3 x 0.00725 = 0.0217, 2 x 0.4497 = 0.899, then 1: a reproduced, b equal within its margin,
  c equal within its margin."""
  from scipy import stats
  mean, se = _mean_se(SEEDS8)
  cells = [verdicts.Cell(">", mean, se, 8, scale=100), verdicts.Cell(">", 0.004, 0.005, 8, 0.03, scale=100),
           verdicts.Cell("=", 0.005, 0.004, 8, 0.03, scale=100), verdicts.Cell("", 0.1, 0.01, 8, scale=100)]
  out = verdicts.decide_family(cells)
  assert [v.word for v in out] == ["reproduced", verdicts.EQUAL, verdicts.EQUAL, "reported"]
  p_b_wide = stats.t.sf((0.03 - 0.004) / 0.005, 7)
  assert p_b_wide == pytest.approx(0.000625, abs=2e-5)
  assert out[0].detail == ("95% t interval [+1.1, +4.9] on 8 seeds; Holm-adjusted p (5 hypotheses, α = 0.05): "
                           f"against zero {3 * verdicts.p_zero(mean, se, 8):.3g}")
  assert f"inside ±3.0 {4 * p_b_wide:.3g}" in out[1].detail
  assert out[3].detail == "95% t interval [+7.6, +12.4] on 8 seeds"  # 10 ± 2.3646 x 1.0
  # the same a alone is reproduced at p = 0.0072, but in a family of 8 hypotheses Holm needs p <= 0.05/8 at best:
  # with seven null companions its adjusted p is 8 x 0.0072 = 0.058, and it is undecided
  nulls = [verdicts.Cell(">", 0.0, 0.01, 8) for _ in range(7)]
  assert verdicts.decide_family([cells[0]])[0].word == "reproduced"
  assert verdicts.decide_family([cells[0], *nulls])[0].word == "undecided"


@pytest.mark.parametrize("cell,word", [
    (verdicts.Cell(">", -0.03, 0.008, 8), "contradicted"),
    (verdicts.Cell("<", -0.03, 0.008, 8), "reproduced"),
    # t = 1.25 against zero (p = 0.251); (0.03 - 0.01) / 0.008 = 2.5 inside ±3 (p = 0.0205, x 2 = 0.041): equal
    (verdicts.Cell(">", 0.01, 0.008, 8, 0.03), verdicts.EQUAL),
    (verdicts.Cell(">", 0.01, 0.008, 8), "undecided"),            # the same without a margin: never equal
    # t = 2.5 against zero (p = 0.041, x 2 = 0.082), 1.25 inside ±3 (p = 0.125): neither survives Holm
    (verdicts.Cell(">", 0.02, 0.008, 8, 0.03), "undecided"),
    (verdicts.Cell("=", 0.08, 0.01, 8, 0.03), "contradicted"),    # (0.08 - 0.03) / 0.01 = 5: outside ±3
    (verdicts.Cell("=", 0.03, 0.01, 8, 0.03), "undecided"),       # on the margin's edge
])
def test_family_words_alone(cell, word):
  assert verdicts.decide_family([cell])[0].word == word


def test_the_family_waits_for_its_declared_seeds():
  cells = [verdicts.Cell(">", 0.05, 0.001, 8), verdicts.Cell(">", have=5, declared=8),
           verdicts.Cell("", have=3, declared=8)]
  out = verdicts.decide_family(cells)
  assert [v.word for v in out] == ["pending", "pending", "reported"]
  assert out[1].short == "5 of 8 declared seeds"
  assert "waits for every claim's declared seeds" in out[0].detail
  with pytest.raises(ValueError, match="margin"):
    verdicts.decide_family([verdicts.Cell("=", 0.0, 0.01, 8)])


def test_the_short_form_gives_the_deciding_tests_p():
  """A family of one claim with a ±3 margin, -1.0 ± 0.3 points on 8 seeds: against zero t = 3.33 (two-sided
  p = 0.0125), inside ±3 t = (3 - 1) / 0.3 = 6.67 (p = 0.00014). Holm over the two: 2 x 0.00014 = 0.00029, then
  max(0.00029, 0.0125) = 0.0125. Both reject; the rule's word is "contradicted", decided by the test against zero,
  and the short form gives that test's p (it gave the smallest, the equivalence test's, before). Undecided gives
  the smallest."""
  from scipy import stats
  p_zero, p_wide = 2 * stats.t.sf(1.0 / 0.3, 7), stats.t.sf(2.0 / 0.3, 7)
  out = verdicts.decide_family([verdicts.Cell(">", -0.010, 0.003, 8, 0.03, scale=100)])[0]
  assert out.word == "contradicted"
  assert out.short == f"[-1.7, -0.3] (95% t), Holm p {p_zero:.2g}" and p_zero > 2 * p_wide
  assert f"against zero {p_zero:.3g}; inside ±3.0 {2 * p_wide:.3g}" in out.detail
  # -1.5 ± 0.8: against zero t = 1.875 (two-sided p = 0.103), inside ±3 t = 1.875 (one-sided p = 0.051, x 2 =
  # 0.103): neither survives, and the short form gives the smaller adjusted p
  out = verdicts.decide_family([verdicts.Cell(">", -0.015, 0.008, 8, 0.03, scale=100)])[0]
  assert out.word == "undecided" and out.short.endswith(f"Holm p {2 * stats.t.sf(1.875, 7):.2g}")
  # a no-change claim outside its margin, +8 ± 1 against ±3: decided by the test outside the margin (two-sided
  # p = 2 x P(T_7 >= 5), x 2 hypotheses)
  out = verdicts.decide_family([verdicts.Cell("=", 0.08, 0.01, 8, 0.03, scale=100)])[0]
  assert out.word == "contradicted" and out.short.endswith(f"Holm p {4 * stats.t.sf(5.0, 7):.2g}")
