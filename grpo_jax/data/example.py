"""`Example`: one problem with its reference answer, shared by every task."""

import dataclasses
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class Example:
  """One math problem.

  Attributes:
    question: the problem text shown to the model (without any prompt template).
    answer: the canonical final answer, e.g. "52" or "\\frac{3}{4}".
    solution: a full reference solution, or None when the dataset has none.
      Synthetic and GSM8K solutions end with a `#### <answer>` line; MATH
      solutions are kept as written and end with a `\\boxed{...}`.
    metadata: free-form extra fields (source, level, ...); not hashed.
  """
  question: str
  answer: str
  solution: str | None = None
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)
