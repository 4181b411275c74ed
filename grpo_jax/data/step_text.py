"""The text of `a<op>b=c` arithmetic solutions: steps, their parsing and where each one ends.

A completion is a list of steps, one per line, then a final-answer line that
starts with `####`. Steps are the non-blank lines before the first `####` line
(all non-blank lines when there is none); surrounding spaces are not part of a
step. Process supervision scores each step and places its reward on the step's
last character (`step_end_offsets`). Checking steps against a problem is `steps`'.
"""

import re
from typing import NamedTuple

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
