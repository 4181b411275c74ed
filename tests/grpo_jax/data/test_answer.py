"""Tests for grpo_jax.data.answer: extraction, normalisation, equivalence, adversarial input."""

import fractions
import time

import pytest

from grpo_jax.data.answer import (answer_key, answers_equal, extract_answer, extract_boxed,
                                  normalize_answer, parse_number)

F = fractions.Fraction


@pytest.mark.parametrize("text, expected", [
    ("12+7=19\n#### 19", "19"),
    ("#### 5\nmore\n#### 7", "7"),  # the last marker wins
    ("#### 7\n", "7"),
    ("####   1,000  ", "1,000"),
    ("#### ", None),  # an empty final line is no answer
    ("#### \n#### ", None),
    ("The answer is \\boxed{42}.", "42"),
    ("\\boxed{1} then \\boxed{2}", "2"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\frac{\\sqrt{3}}{\\left(2\\right)}} end", "\\frac{\\sqrt{3}}{\\left(2\\right)}"),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces are literal
    ("\\boxed{a\\}b}", "a\\}b"),
    ("\\boxed{3} and an unclosed \\boxed{4", "3"),  # an unclosed box is skipped
    ("\\boxed{4", None),
    ("#### 9 beats \\boxed{3}", "9 beats \\boxed{3}"),
    ("", None),
    (None, None),
    ("no answer here", None),
    ("}}}{{{", None),
])
def test_extract_answer(text, expected):
  assert extract_answer(text) == expected


def test_extract_boxed_deep_nesting_is_fast():
  depth = 100_000
  text = "\\boxed{" + "{" * depth + "x" + "}" * depth + "}"
  start = time.perf_counter()
  assert extract_boxed(text) == "{" * depth + "x" + "}" * depth
  assert extract_boxed("\\boxed{" * depth) is None  # many unclosed boxes: still linear
  assert extract_boxed("}" * depth + "\\boxed{1}") == "1"
  assert time.perf_counter() - start < 60  # linear: well under 1 s here; a quadratic scan takes hours


@pytest.mark.parametrize("text, expected", [
    ("52", F(52)), ("-3", F(-3)), ("\u22123", F(-3)), ("+4", F(4)), ("2.50", F(5, 2)),
    (".5", F(1, 2)), ("5.", F(5)), ("1,000", F(1000)), ("1,234,567.5", F(2469135, 2)),
    ("3/4", F(3, 4)), ("-3 / 4", F(-3, 4)), ("\\frac{3}{4}", F(3, 4)), ("\\dfrac{-3}{4}", F(-3, 4)),
    ("-\\tfrac{3}{4}", F(-3, 4)), ("\\frac34", F(3, 4)), ("1e3", F(1000)), ("2.5E-1", F(1, 4)),
    ("$18.00", F(18)), ("\\$18", F(18)), ("50%", F(50)), ("50\\%", F(50)), ("18 dollars.", F(18)),
    ("10\\text{ cm}", F(10)), ("90^\\circ", F(90)), ("\\boxed{7}", F(7)), ("1{,}000", F(1000)),
    ("x^2+1", None), ("2x", None), ("1,2", None), ("1,0000", None), ("1/0", None),
    ("\\frac{1}{0}", None), ("", None), ("   ", None), ("abc", None), ("--5", None),
    ("1e999999999", None), ("9" * 100_000, None), ("9" * 65, None), ("\u0663", None),
])
def test_parse_number(text, expected):
  assert parse_number(text) == expected


def test_parse_number_caps_are_inclusive():
  assert parse_number("9" * 64) == int("9" * 64)
  assert parse_number("1e64") == 10**64
  assert parse_number("1e65") is None


@pytest.mark.parametrize("text, expected", [
    ("\\boxed{x^{2} + 1}", "x^2+1"), ("\\left( 1, 2 \\right)", "(1,2)"), ("$x$.", "x"),
    ("\\dfrac{a}{b}", "\\frac{a}{b}"), ("X", "X"), ("\\text{(A)}", "(A)"), (None, ""),
])
def test_normalize_answer(text, expected):
  assert normalize_answer(text) == expected


@pytest.mark.parametrize("pred, ref", [
    ("0.5", "1/2"), ("\\frac{1}{2}", "0.5"), ("1,000", "1000"), ("1000.0", "1,000"), ("$18", "18"),
    ("50%", "50"), ("-0.75", "\\dfrac{-3}{4}"), ("\u22127", "-7"), ("x^2+1", "x^{2} + 1"),
    ("\\boxed{3}", "3"), ("9" * 200, "9" * 200), ("1e999999999", "1e999999999"),
])
def test_answers_equal(pred, ref):
  assert answers_equal(pred, ref)
  assert answers_equal(ref, pred)


@pytest.mark.parametrize("pred, ref", [
    ("0.5", "0.25"), ("52", "53"), ("-3", "3"), ("2x", "2"), ("x^2+1", "X^2+1"), (None, "5"),
    ("", "5"), ("", ""), (None, None), ("9" * 100_000, "9" * 99_999 + "8"),
    ("1e999999999", "1e999999998"),
    ("1,2", "12"), ("garbage", "5"), ("\u00bd", "1/2"),
])
def test_answers_not_equal(pred, ref):
  assert not answers_equal(pred, ref)


def test_adversarial_inputs_are_fast():
  inputs = ["9" * 100_000, "1e999999999", "-" * 100_000, "\\frac{" * 50_000, "{" * 100_000,
            "1," * 50_000 + "1", "1 " * 50_000 + "apples", "\\boxed{" + "9" * 100_000 + "}",
            "é" * 100_000, "\x00" * 1000]
  start = time.perf_counter()
  for text in inputs:
    answers_equal(text, "5")
    answers_equal(text, text)
    extract_answer(text)
  assert time.perf_counter() - start < 60  # linear: about 1 s here; a quadratic scan takes hours


def test_answer_key_groups_equivalents():
  assert answer_key("0.5") == answer_key("\\frac12") == ("num", F(1, 2))
  assert answer_key("x + 1") == ("str", "x+1")
  assert answer_key(None) is None
  assert answer_key("  ") is None
