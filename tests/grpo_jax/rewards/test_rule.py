"""Tests for grpo_jax.rewards.rule: each reward, the spec parser and batched scoring."""

import numpy as np
import pytest

from grpo_jax.data.example import Example
from grpo_jax.rewards.rule import (REWARD_NAMES, REWARDS, get_reward_fn, has_final_answer_format,
                                   make_reward_fn, parse_reward_spec, score)

SYNTH = Example(question="(12+7)*3-5", answer="52",
                solution="12+7=19\n19*3=57\n57-5=52\n#### 52")
GOOD = "12+7=19\n19*3=57\n57-5=52\n#### 52"


@pytest.mark.parametrize("completion, expected", [
    (GOOD, 1.0), (GOOD + "\n", 1.0), ("wrong steps\n#### 52", 1.0), ("#### 52.0", 1.0),
    ("\\boxed{52}", 1.0), ("#### 53", 0.0), ("#### 52\n#### 53", 0.0), ("", 0.0), ("52", 0.0),
    ("#### ", 0.0),
])
def test_correctness(completion, expected):
  assert get_reward_fn("correctness")(completion, SYNTH) == expected


@pytest.mark.parametrize("completion, expected", [
    (GOOD, True),
    (GOOD + "\n\n ", True),  # trailing whitespace only
    ("Natalia sold 24.\nSo 72 in all.\n#### 72", True),
    ("#### 52", False),  # no steps
    (GOOD + "\nmore", False),  # something after the final line
    ("12+7=19\n\n19*3=57\n#### 57", False),  # a blank line among the steps
    ("12+7=19\n#### 19\n#### 19", False),  # two final lines
    ("12+7=19\n####19", False), ("12+7=19\n#### ", False), ("12+7=19\n ####  5", False),
    ("12+7=19\n19*3=57", False), ("", False),
])
def test_format(completion, expected):
  assert has_final_answer_format(completion) is expected
  assert get_reward_fn("format")(completion, SYNTH) == float(expected)


def test_arithmetic_and_boxed_format():
  arithmetic = get_reward_fn("arithmetic_format")
  assert arithmetic(GOOD, SYNTH) == 1.0
  assert arithmetic("12+7=20\n#### 20", SYNTH) == 1.0  # format only, not arithmetic truth
  assert arithmetic("12 plus 7 is 19\n#### 19", SYNTH) == 0.0
  boxed = get_reward_fn("boxed_format")
  assert boxed("so $\\boxed{\\frac{1}{2}}$", SYNTH) == 1.0
  assert boxed("\\boxed{}", SYNTH) == 0.0
  assert boxed("\\boxed{1", SYNTH) == 0.0
  assert boxed(GOOD, SYNTH) == 0.0


@pytest.mark.parametrize("completion, expected", [
    (GOOD, 1.0),
    ("12+7=19\n19*3=56\n56-5=51\n#### 51", 1 / 3),
    ("12+7=19\n19*3=57\n#### 57", 2 / 3),  # a missing step counts against
    (GOOD.replace("\n####", "\n52*1=52\n####"), 3 / 4),  # so does an extra one
    ("#### 52", 0.0),
])
def test_step_correctness(completion, expected):
  assert get_reward_fn("step_correctness")(completion, SYNTH) == pytest.approx(expected)


def test_step_correctness_needs_reference():
  with pytest.raises(ValueError, match="reference"):
    get_reward_fn("step_correctness")(GOOD, Example(question="q", answer="1"))


def test_make_reward_fn_weights():
  fn = make_reward_fn("correctness:1.0, format:0.1")
  assert fn(GOOD, SYNTH) == pytest.approx(1.1)
  assert fn("#### 52", SYNTH) == pytest.approx(1.0)
  assert fn("x\n#### 1", SYNTH) == pytest.approx(0.1)
  assert make_reward_fn("correctness")(GOOD, SYNTH) == 1.0
  assert make_reward_fn("format:-0.5")("#### 1\nx", SYNTH) == 0.0
  assert make_reward_fn("format:-0.5")(GOOD, SYNTH) == -0.5
  assert parse_reward_spec("correctness:2,step_correctness:1e-1") == [
      ("correctness", 2.0), ("step_correctness", 0.1)]


@pytest.mark.parametrize("spec, message", [
    ("correctnes:1.0", "unknown reward 'correctnes'; available: arithmetic_format"),
    ("correctness:abc", "bad weight 'abc' for reward 'correctness'"),
    ("correctness:", "bad weight '' for reward 'correctness'"),
    ("correctness:nan", "must be finite"),
    ("correctness:inf", "must be finite"),
    ("correctness,,format", "empty term"),
    ("", "empty term"),
    ("format:1,format:2", "appears twice"),
])
def test_bad_specs(spec, message):
  with pytest.raises(ValueError, match=message):
    make_reward_fn(spec)


def test_get_reward_fn_unknown():
  with pytest.raises(ValueError, match="unknown reward 'nope'"):
    get_reward_fn("nope")
  assert set(REWARD_NAMES) == {"correctness", "format", "arithmetic_format", "boxed_format",
                               "step_correctness", "math_verify"}
  assert set(REWARDS) == set(REWARD_NAMES) - {"math_verify"}  # the plain functions; math_verify needs a verifier


def test_score():
  completions = [GOOD, "#### 53", "x\n#### 52"]
  rewards = score(completions, [SYNTH] * 3, "correctness:1,format:0.5")
  assert rewards.dtype == np.float32 and rewards.shape == (3,)
  np.testing.assert_allclose(rewards, [1.5, 0.0, 1.5])
  np.testing.assert_array_equal(score(completions, [SYNTH] * 3, get_reward_fn("correctness")),
                                [1.0, 0.0, 1.0])
  assert score([], [], "correctness").shape == (0,)
  with pytest.raises(ValueError, match="2 completions but 1 examples"):
    score(completions[:2], [SYNTH], "correctness")
