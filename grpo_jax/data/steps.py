"""Step-level checking of `a<op>b=c` arithmetic solutions (their text: `step_text`, re-exported here).

Each step of a completion is checked against the problem: against the reference's chain for the synthetic task,
against the state the steps reached for the paths task (`synthetic_paths.check_steps`).
"""

from grpo_jax.data import synthetic_paths
from grpo_jax.data.example import Example
from grpo_jax.data.step_text import (FINAL_MARKER, OPS, Step, apply_op, parse_step, split_steps,  # noqa: F401
                                     step_end_offsets, step_spans)


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
    return synthetic_paths.check_steps(example, completion)
  ref = reference_steps(example.solution)
  result = []
  for j, line in enumerate(split_steps(completion)):
    step = parse_step(line)
    result.append(
        step is not None and j < len(ref) and step.c == apply_op(step.a, step.op, step.b)
        and _matches(step, ref[j]))
  return result
