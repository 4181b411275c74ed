"""Tests for grpo_jax.data.steps: reference steps and checking a completion's steps against them."""

import pytest

from grpo_jax.data.example import Example
from grpo_jax.data.step_text import step_spans
from grpo_jax.data.steps import Step, check_steps, reference_steps

EXAMPLE = Example(question="(12+7)*3-5", answer="52",
                  solution="12+7=19\n19*3=57\n57-5=52\n#### 52")


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
