"""Tests for grpo_jax.data.steps: step parsing, spans and checking."""

import pytest

from grpo_jax.data.example import Example
from grpo_jax.data.steps import (Step, apply_op, check_steps, parse_step, reference_steps,
                                 split_steps, step_end_offsets, step_spans)

EXAMPLE = Example(question="(12+7)*3-5", answer="52",
                  solution="12+7=19\n19*3=57\n57-5=52\n#### 52")


@pytest.mark.parametrize("line, expected", [
    ("12+7=19", Step(12, "+", 7, 19)),
    (" 19 * 3 = 57 ", Step(19, "*", 3, 57)),
    ("5-12=-7", Step(5, "-", 12, -7)),
    ("-7*3=-21", Step(-7, "*", 3, -21)),
    ("5--3=8", Step(5, "-", -3, 8)),
    ("12+7=20", Step(12, "+", 7, 20)),  # parses; the arithmetic is checked elsewhere
    ("12+7", None), ("12/4=3", None), ("12+7=19=19", None), ("a+b=c", None), ("", None),
    ("12+7=19.0", None), ("1" * 19 + "+1=2", None), ("\u0661+1=2", None),
])
def test_parse_step(line, expected):
  assert parse_step(line) == expected


def test_apply_op():
  assert [apply_op(7, op, 3) for op in "+-*"] == [10, 4, 21]
  with pytest.raises(ValueError, match="unknown operation"):
    apply_op(1, "/", 2)


def test_spans_and_offsets():
  completion = "12+7=19\n  19*3=57 \n\n57-5=52\n#### 52\n"
  assert step_spans(completion) == [(0, 7), (10, 17), (20, 27)]
  assert split_steps(completion) == ["12+7=19", "19*3=57", "57-5=52"]
  assert step_end_offsets(completion) == [6, 16, 26]
  assert [completion[i] for i in step_end_offsets(completion)] == ["9", "7", "2"]


def test_steps_stop_at_the_first_final_line():
  assert split_steps("1+1=2\n####2\n2+2=4") == ["1+1=2"]
  assert split_steps("  #### 4") == []
  assert split_steps("") == []
  assert split_steps("1+1=2\n2+2=") == ["1+1=2", "2+2="]  # truncated: every line is a step


def test_reference_steps():
  assert reference_steps(EXAMPLE.solution) == [
      Step(12, "+", 7, 19), Step(19, "*", 3, 57), Step(57, "-", 5, 52)]
  with pytest.raises(ValueError, match="no reference solution|needs a reference"):
    reference_steps(None)
  with pytest.raises(ValueError, match="not of the form"):
    reference_steps("Natalia sold 48 clips.\n#### 72")


@pytest.mark.parametrize("completion, expected", [
    (EXAMPLE.solution, [True, True, True]),
    ("12+7=19\n19*3=57\n57-5=52", [True, True, True]),  # no final line: steps still checkable
    ("7+12=19\n3*19=57\n57-5=52\n#### 52", [True, True, True]),  # commutative order
    ("12+7=19\n19*3=56\n56-5=51\n#### 51", [True, False, False]),  # wrong product, then built on
    ("12+7=19\n19*3=57\n5-57=-52\n#### -52", [True, True, False]),  # '-' is not commutative
    ("12+7=20\n20*3=60\n60-5=55\n#### 55", [False, False, False]),
    ("12+7=19\n57-5=52\n#### 52", [True, False]),  # skipped a step
    ("12+7=19\n19*3=57\n57-5=52\n52+0=52\n#### 52", [True, True, True, False]),  # extra step
    ("12+7=19\n19+3=22\n22-5=17\n#### 17", [True, False, False]),  # wrong operator
    ("12+7=19\n19*3 is 57\n57-5=52\n#### 52", [True, False, True]),
    ("#### 52", []),
    ("", []),
])
def test_check_steps(completion, expected):
  assert check_steps(EXAMPLE, completion) == expected


def test_check_steps_length_matches_spans():
  completion = "garbage\n12+7=19\n\n19*3=57\n#### 57"
  assert len(check_steps(EXAMPLE, completion)) == len(step_spans(completion)) == 3
  assert check_steps(EXAMPLE, completion) == [False, False, False]
