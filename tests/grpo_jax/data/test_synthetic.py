"""Tests for grpo_jax.data.synthetic: rendering, bounds, determinism, disjoint splits."""

import itertools
import random
import re

import pytest

from grpo_jax.data.steps import Step, apply_op, check_steps, reference_steps, split_steps
from grpo_jax.data.synthetic import (SyntheticConfig, format_prompt, make_splits,
                                     render_question, render_solution, sample_example, stream)


def _evaluate(question: str) -> int:
  """Evaluates +-*() with precedence by recursive descent (test oracle; no eval)."""
  tokens = [int(t) if t.isdigit() else t for t in re.findall(r"[0-9]+|[-+*()]", question)]
  assert "".join(map(str, tokens)) == question
  state = {"i": 0}

  def peek():
    return tokens[state["i"]] if state["i"] < len(tokens) else None

  def take():
    state["i"] += 1
    return tokens[state["i"] - 1]

  def atom():
    if peek() == "(":
      take()
      value = expr()
      assert take() == ")"
      return value
    return take()

  def term():
    value = atom()
    while peek() == "*":
      take()
      value *= atom()
    return value

  def expr():
    value = term()
    while peek() in ("+", "-"):
      value = value + term() if take() == "+" else value - term()
    return value

  result = expr()
  assert state["i"] == len(tokens)
  return result


def test_render_hand_example():
  steps = [Step(12, "+", 7, 19), Step(19, "*", 3, 57), Step(57, "-", 5, 52)]
  assert render_question(steps) == "(12+7)*3-5"
  assert render_solution(steps) == "12+7=19\n19*3=57\n57-5=52\n#### 52"
  assert render_question([Step(2, "*", 3, 6), Step(6, "+", 4, 10), Step(10, "*", 5, 50)]) \
      == "(2*3+4)*5"
  assert render_question([Step(9, "-", 4, 5), Step(5, "+", 1, 6)]) == "9-4+1"
  assert render_question([Step(2, "*", 3, 6), Step(6, "*", 4, 24)]) == "2*3*4"


def test_examples_are_consistent_and_within_bounds():
  config = SyntheticConfig()
  rng = random.Random(0)
  for _ in range(2000):
    example = sample_example(rng, config)
    steps = reference_steps(example.solution)
    assert config.min_steps <= len(steps) <= config.max_steps
    assert _evaluate(example.question) == int(example.answer) == steps[-1].c
    for prev, step in zip(steps, steps[1:]):
      assert step.a == prev.c
    for step in steps:
      assert step.c == apply_op(step.a, step.op, step.b)
      assert 0 <= step.c <= config.max_value
      assert step.b < (10**config.mul_digits if step.op == "*" else 10**config.max_digits)
      assert step.op != "*" or step.b >= 2
    assert example.solution.endswith(f"\n#### {example.answer}")
    assert all(check_steps(example, example.solution))
    assert len(format_prompt(example)) + len(example.solution) < 80


def test_knobs():
  config = SyntheticConfig(min_steps=3, max_steps=3, max_digits=1, ops="-", max_value=9,
                           allow_negative=True)
  rng = random.Random(1)
  examples = [sample_example(rng, config) for _ in range(300)]
  assert all(len(split_steps(e.solution)) == 3 for e in examples)
  assert all(set(e.question) <= set("0123456789-") for e in examples)
  assert any(int(e.answer) < 0 for e in examples)
  assert all(abs(s.c) <= 9 for e in examples for s in reference_steps(e.solution))


@pytest.mark.parametrize("kwargs", [
    dict(min_steps=0), dict(min_steps=3, max_steps=2), dict(ops=""), dict(ops="+/"),
    dict(ops="++"), dict(max_digits=0), dict(max_digits=3, max_value=500),
])
def test_config_validation(kwargs):
  with pytest.raises(ValueError):
    SyntheticConfig(**kwargs)


def test_splits_deterministic_disjoint_and_distinct():
  train, test = make_splits(500, 100, seed=3)
  train2, test2 = make_splits(500, 100, seed=3)
  assert train == train2 and test == test2
  assert len(train) == 500 and len(test) == 100
  train_q, test_q = {e.question for e in train}, {e.question for e in test}
  assert len(train_q) == 500 and len(test_q) == 100
  assert not train_q & test_q
  other_train, other_test = make_splits(500, 100, seed=4)
  assert other_test != test and other_train != train
  bigger_train, same_test = make_splits(800, 100, seed=3)
  assert same_test == test and bigger_train[:500] == train


def test_splits_exhaust_small_space():
  config = SyntheticConfig(min_steps=1, max_steps=1, max_digits=1, ops="+", max_value=18)
  train, test = make_splits(61, 20, seed=0, config=config)  # 9 * 9 = 81 questions in all
  assert len({e.question for e in train + test}) == 81
  with pytest.raises(ValueError, match="too small"):
    make_splits(62, 20, seed=0, config=config)


def test_stream_excludes_and_is_deterministic():
  config = SyntheticConfig(min_steps=1, max_steps=1, max_digits=1, ops="+", max_value=18)
  _, test = make_splits(0, 30, seed=0, config=config)
  excluded = {e.question for e in test}
  first = list(itertools.islice(stream(7, config, excluded), 300))
  assert not {e.question for e in first} & excluded
  assert len({e.question for e in first}) == 81 - 30
  assert first == list(itertools.islice(stream(7, config, excluded), 300))
  everything = {e.question for e in itertools.islice(stream(0, config), 2000)}
  assert len(everything) == 81
  with pytest.raises(ValueError, match="covers the problem space"):
    next(stream(0, config, everything))
