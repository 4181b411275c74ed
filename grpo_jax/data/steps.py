"""Step-level parsing and checking of `a<op>b=c` arithmetic solutions.

A completion is a list of steps, one per line, then a final-answer line that
starts with `####`. Steps are the non-blank lines before the first `####` line
(all non-blank lines when there is none); surrounding spaces are not part of a
step. Process supervision scores each step and places its reward on the step's
last character (`step_end_offsets`).
"""

import re
from typing import NamedTuple

from grpo_jax.data.example import Example

FINAL_MARKER = "####"
OPS = "+-*"
_MAX_INT_DIGITS = 18  # longer numbers never parse, so arithmetic stays cheap
_NUM = rf"(-?[0-9]{{1,{_MAX_INT_DIGITS}}})"
_STEP_RE = re.compile(rf"{_NUM}[ \t]*([+\-*])[ \t]*{_NUM}[ \t]*=[ \t]*{_NUM}")


class Step(NamedTuple):
  """One parsed step `a op b = c`; `c` is as written, not necessarily right."""
  a: int
  op: str
  b: int
  c: int

  def __str__(self) -> str:
    return f"{self.a}{self.op}{self.b}={self.c}"


def apply_op(a: int, op: str, b: int) -> int:
  """Returns `a op b` for op in '+-*'."""
  if op == "+":
    return a + b
  if op == "-":
    return a - b
  if op == "*":
    return a * b
  raise ValueError(f"unknown operation {op!r}; expected one of {OPS!r}")


def parse_step(line: str) -> Step | None:
  """Parses `a<op>b=c` (integers, op in '+-*', spaces allowed); None otherwise."""
  m = _STEP_RE.fullmatch(line.strip())
  if m is None:
    return None
  return Step(int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4)))


def step_spans(completion: str) -> list[tuple[int, int]]:
  """Half-open character spans [start, end) of the steps of a completion.

  `completion[start:end]` is the step without surrounding spaces, and
  `end - 1` the index of its last character.
  """
  spans, offset = [], 0
  for line in completion.split("\n"):
    content = line.strip()
    if content.startswith(FINAL_MARKER):
      break
    if content:
      start = offset + len(line) - len(line.lstrip())
      spans.append((start, start + len(content)))
    offset += len(line) + 1
  return spans


def split_steps(completion: str) -> list[str]:
  """The steps of a completion (see the module docstring), stripped."""
  return [completion[start:end] for start, end in step_spans(completion)]


def step_end_offsets(completion: str) -> list[int]:
  """Index of the last character of each step, where its reward is placed."""
  return [end - 1 for _, end in step_spans(completion)]


def reference_steps(solution: str | None) -> list[Step]:
  """Parses a reference solution whose every step is `a<op>b=c`.

  Raises:
    ValueError: when the solution is missing or a step does not parse.
  """
  if not solution:
    raise ValueError("step checking needs a reference solution; the example has none")
  steps = []
  for line in split_steps(solution):
    step = parse_step(line)
    if step is None:
      raise ValueError(f"reference step {line!r} is not of the form a<op>b=c")
    steps.append(step)
  return steps


def _matches(step: Step, ref: Step) -> bool:
  if step.op != ref.op:
    return False
  if step.op == "-":
    return (step.a, step.b) == (ref.a, ref.b)
  return sorted((step.a, step.b)) == sorted((ref.a, ref.b))


def check_steps(example: Example, completion: str) -> list[bool]:
  """Checks each step of a completion against the example's reference solution.

  Step j (0-based) is correct iff all of:
    1. it parses as `a<op>b=c` (`parse_step`);
    2. its arithmetic is right: c == a op b exactly;
    3. it performs the reference's j-th step: the same operator and operands
       (in either order for the commutative '+' and '*'), hence the same
       result, the reference's j-th intermediate value.
  The reference path is unique for synthetic problems (a left-to-right chain),
  so a step that builds on an earlier mistake is wrong, and steps beyond the
  reference's count are wrong. Problems of the paths task (metadata task
  "synthetic_paths") have several valid paths and are checked by
  `synthetic_paths.check_steps` instead: against the state the steps reached.

  Args:
    example: an example whose `solution` consists of `a<op>b=c` steps.
    completion: the model's completion.

  Returns:
    One bool per step of the completion, in order.
  """
  if example.metadata.get("task") == "synthetic_paths":  # several valid paths: checked against the state reached
    from grpo_jax.data import synthetic_paths  # pylint: disable=import-outside-toplevel  (it imports this module)
    return synthetic_paths.check_steps(example, completion)
  ref = reference_steps(example.solution)
  result = []
  for j, line in enumerate(split_steps(completion)):
    step = parse_step(line)
    result.append(
        step is not None and j < len(ref) and step.c == apply_op(step.a, step.op, step.b)
        and _matches(step, ref[j]))
  return result
