"""Synthetic multi-step arithmetic: short problems a tiny character model can learn.

A problem is a left-to-right chain of operations on small integers, written
with the fewest parentheses that keep the usual precedence right, and solved
one operation per line:

  question  "(12+7)*3-5"
  prompt    "(12+7)*3-5\n"                      (`format_prompt`)
  solution  "12+7=19\n19*3=57\n57-5=52\n#### 52"
  answer    "52"

Step j of the solution combines the running value with the (j+1)-th operand,
so the solution path is unique and each step can be checked on its own
(`grpo_jax.data.steps.check_steps`). Generation is deterministic from a seed.
"""

import dataclasses
import random
from typing import Iterable, Iterator

from grpo_jax.data.example import Example, avoiding, distinct
from grpo_jax.data.steps import FINAL_MARKER, OPS, Step, apply_op

_MAX_TRIES_PER_STEP = 32
_MAX_TRIES_PER_PROBLEM = 1000


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
  """Difficulty knobs of the synthetic task.

  Attributes:
    min_steps: fewest operations per problem (>= 1).
    max_steps: most operations per problem.
    max_digits: operands of '+' and '-' (and the first operand) have 1 to
      max_digits digits, the digit count drawn uniformly.
    mul_digits: operands of '*' have 1 to mul_digits digits (never 0 or 1).
    ops: the operations allowed, a non-empty subset of '+-*'.
    max_value: every intermediate value v satisfies |v| <= max_value.
    allow_negative: whether intermediate values may be negative.
  """
  min_steps: int = 2
  max_steps: int = 4
  max_digits: int = 2
  mul_digits: int = 1
  ops: str = "+-*"
  max_value: int = 999
  allow_negative: bool = False

  def __post_init__(self):
    if not 1 <= self.min_steps <= self.max_steps:
      raise ValueError(f"need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}")
    if self.max_digits < 1 or self.mul_digits < 1:
      raise ValueError(f"digits must be >= 1, got {self.max_digits}, {self.mul_digits}")
    if not self.ops or set(self.ops) - set(OPS) or len(set(self.ops)) != len(self.ops):
      raise ValueError(f"ops must be distinct characters of {OPS!r}, got {self.ops!r}")
    if self.max_value < 10**self.max_digits - 1:
      raise ValueError(f"max_value {self.max_value} is below the largest operand")


def _operand(rng: random.Random, max_digits: int, low: int) -> int:
  digits = rng.randint(1, max_digits)
  return rng.randint(max(low, 10**(digits - 1)), 10**digits - 1)


def _sample_steps(rng: random.Random, config: SyntheticConfig) -> list[Step] | None:
  """One chain of operations within the config's bounds, or None on a dead end."""
  value = _operand(rng, config.max_digits, low=1)
  steps = []
  for _ in range(rng.randint(config.min_steps, config.max_steps)):
    for _ in range(_MAX_TRIES_PER_STEP):
      op = rng.choice(config.ops)
      if op == "*":
        operand = _operand(rng, config.mul_digits, low=2)
      else:
        operand = _operand(rng, config.max_digits, low=1)
      result = apply_op(value, op, operand)
      if abs(result) <= config.max_value and (config.allow_negative or result >= 0):
        break
    else:
      return None
    steps.append(Step(value, op, operand, result))
    value = result
  return steps


def render_question(steps: list[Step]) -> str:
  """Writes a chain as an expression, parenthesising a sum before a '*'."""
  expr, additive = str(steps[0].a), False
  for step in steps:
    if step.op == "*" and additive:
      expr = f"({expr})"
    expr, additive = f"{expr}{step.op}{step.b}", step.op in "+-"
  return expr


def render_solution(steps: list[Step]) -> str:
  """One `a<op>b=c` line per step, then `#### <answer>`."""
  return "\n".join([str(s) for s in steps] + [f"{FINAL_MARKER} {steps[-1].c}"])


def format_prompt(example: Example) -> str:
  """The prompt shown to the model: the question and a newline."""
  return example.question + "\n"


def sample_example(rng: random.Random, config: SyntheticConfig = SyntheticConfig()) -> Example:
  """Draws one problem; deterministic given the state of `rng`."""
  for _ in range(_MAX_TRIES_PER_PROBLEM):
    steps = _sample_steps(rng, config)
    if steps is not None:
      return Example(
          question=render_question(steps), answer=str(steps[-1].c),
          solution=render_solution(steps),
          metadata={"task": "synthetic", "num_steps": len(steps)})
  raise ValueError(f"no problem satisfies {config}; loosen max_value or allow_negative")


def _unique(rng: random.Random, config: SyntheticConfig, count: int, exclude: set[str]) -> list[Example]:
  """`count` problems with distinct questions outside `exclude`."""
  return distinct(lambda: sample_example(rng, config), count, exclude, config)


def make_splits(num_train: int, num_test: int, seed: int = 0,
                config: SyntheticConfig = SyntheticConfig()
                ) -> tuple[list[Example], list[Example]]:
  """Deterministic train and test sets with no question in common.

  The test set is drawn first from its own stream, so it depends only on
  (num_test, seed, config): growing the train set never changes it.

  Args:
    num_train: number of training problems.
    num_test: number of test problems.
    seed: the random seed.
    config: the difficulty.

  Returns:
    (train, test), each a list of examples with distinct questions.
  """
  if num_train < 0 or num_test < 0:
    raise ValueError(f"sizes must be >= 0, got {num_train}, {num_test}")
  test = _unique(random.Random(f"synthetic/{seed}/test"), config, num_test, set())
  train = _unique(random.Random(f"synthetic/{seed}/train"), config, num_train,
                  {e.question for e in test})
  return train, test


def stream(seed: int = 0, config: SyntheticConfig = SyntheticConfig(),
           exclude: Iterable[str] = ()) -> Iterator[Example]:
  """An endless deterministic stream of problems whose questions avoid `exclude`.

  Pass the test questions as `exclude` to train on fresh problems every step
  without leaking the test set. Questions may repeat within the stream.

  Raises:
    ValueError: after `example.MAX_STREAM_MISSES` excluded draws in a row (the
      exclusion covers all or nearly all of the problem space).
  """
  rng = random.Random(f"synthetic/{seed}/stream")
  return avoiding(lambda: sample_example(rng, config), exclude, config)
