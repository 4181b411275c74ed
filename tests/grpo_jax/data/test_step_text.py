"""Tests for grpo_jax.data.step_text: the text of `a<op>b=c` solutions, its steps, their parsing and ends."""

import pytest

from grpo_jax.data.step_text import Step, apply_op, parse_step, split_steps, step_end_offsets, step_spans


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
