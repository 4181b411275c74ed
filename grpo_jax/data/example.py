"""`Example`: one problem with its reference answer, shared by every task."""

import dataclasses
from typing import Any, Callable, Iterable, Iterator, Mapping


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


def distinct(draw: Callable[[], Example], count: int, exclude: set[str], what: Any) -> list[Example]:
  """`count` examples of `draw()` with distinct questions outside `exclude` (a generated task's split).

  Raises:
    ValueError: naming `what` (the generator's config) when 100 * count + 1000 draws in a row bring no new
      question: the problem space is too small.
  """
  examples, seen, misses = [], set(exclude), 0
  while len(examples) < count:
    example = draw()
    if example.question in seen:
      misses += 1
      if misses > 100 * count + 1000:
        raise ValueError(f"found only {len(examples)} of {count} distinct problems under {what}; "
                         "the problem space is too small")
      continue
    misses = 0
    seen.add(example.question)
    examples.append(example)
  return examples


MAX_STREAM_MISSES = 100_000  # excluded draws in a row before a stream gives up


def avoiding(draw: Callable[[], Example], exclude: Iterable[str], what: Any) -> Iterator[Example]:
  """An endless stream of `draw()`s whose questions are not in `exclude` (they may repeat within it).

  Raises:
    ValueError: naming `what` after `MAX_STREAM_MISSES` excluded draws in a row (the exclusion covers all or nearly
      all of the problem space).
  """
  excluded, misses = set(exclude), 0
  while True:
    example = draw()
    if example.question not in excluded:
      misses = 0
      yield example
    elif (misses := misses + 1) > MAX_STREAM_MISSES:
      raise ValueError(f"{misses} excluded problems in a row under {what}; the exclusion covers the problem space")
