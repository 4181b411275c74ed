"""Step labels for process reward models: exact ones, Monte Carlo ones, and label propagation.

A PRM scores the segments of a completion: its steps (`grpo_jax.data.steps`) and then its
final-answer segment, the text from the first `####` line to the end, so that the answer
tokens are scored too. A segment's score sits on its last character (its end token).

Exact labels (synthetic task): step j is right iff `check_steps` says so; the answer segment is
right iff the final answer is. Monte Carlo labels (datasets without step truth; Math-Shepherd,
Wang et al., arXiv 2312.08935): from the prefix that ends with segment j, k completions are
sampled from the policy; the hard estimate is 1 if any of them reaches the right answer, the
soft estimate the fraction that do. Either way, propagation then marks every segment after
the first wrong one wrong: a solution that went astray does not recover credit.
"""

from collections.abc import Callable, Sequence

import jax
import numpy as np

from grpo_jax.data.example import Example
from grpo_jax.data.steps import FINAL_MARKER, check_steps, step_spans

# (prefix token ids, key) -> per prefix, the k continuation texts sampled after it.
RolloutFn = Callable[[Sequence[Sequence[int]], jax.Array], list[list[str]]]
# (completion text, example) -> whether its final answer is right.
CorrectFn = Callable[[str, Example], bool]


def segment_spans(completion: str) -> list[tuple[int, int]]:
  """Half-open character spans [start, end) of the steps, then of the final-answer segment.

  The answer segment runs from the first `####` line to the last non-space character of the
  completion; it is absent when there is no `####` line.
  """
  spans = step_spans(completion)
  offset = 0
  for line in completion.split("\n"):
    if line.strip().startswith(FINAL_MARKER):
      start = offset + len(line) - len(line.lstrip())
      spans.append((start, len(completion.rstrip())))
      break
    offset += len(line) + 1
  return spans


def segment_end_offsets(completion: str) -> list[int]:
  """Index of the last character of each segment (steps, then the answer segment)."""
  return [end - 1 for _, end in segment_spans(completion)]


def has_answer_segment(completion: str) -> bool:
  return len(segment_spans(completion)) > len(step_spans(completion))


def propagate(labels: Sequence[float]) -> np.ndarray:
  """Zeroes every label after the first zero label: y'_j = y_j · Π_{i<j} [y_i > 0].

  For hard labels: after the first wrong step, later steps are wrong. For soft labels the
  same rule applies to a step none of whose rollouts succeeded.
  """
  y = np.asarray(labels, np.float32)
  alive = np.concatenate([[True], np.cumprod(y > 0)[:-1].astype(bool)]) if y.size else np.zeros(0, bool)
  return np.where(alive, y, 0.0).astype(np.float32)


def exact_labels(example: Example, completion: str, *, correct: bool) -> np.ndarray:
  """Exact, propagated segment labels of a synthetic-task completion.

  Args:
    example: the problem, with an `a<op>b=c` reference solution.
    completion: the model's completion.
    correct: whether its final answer is right (labels the answer segment).

  Returns:
    `[num_segments]` float32 0/1 labels, in the order of `segment_spans`.
  """
  labels = [float(ok) for ok in check_steps(example, completion)]
  if has_answer_segment(completion):
    labels.append(float(correct))
  return propagate(labels)


def monte_carlo_values(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                       segment_ends: Sequence[Sequence[int]], examples: Sequence[Example], *,
                       rollout: RolloutFn, decode: Callable[[Sequence[int]], str], is_correct: CorrectFn,
                       key: jax.Array) -> list[np.ndarray]:
  """Math-Shepherd Monte Carlo values: per segment, the fraction of rollouts that end right.

    v_ij = (1/k) Σ_{c=1..k} is_correct(o_i[:index(j)] + ĉ_c),   ĉ_c ~ π(· | q_i, o_i[:index(j)]),

  with index(j) the end token of segment j. All prefixes go to `rollout` in one call, so it
  can batch them.

  Args:
    prompt_ids: per completion, its prompt's token ids.
    completion_ids: per completion, its token ids (no padding; the end token may be included).
    segment_ends: per completion, the token index (into its completion_ids) where each
      segment ends.
    examples: per completion, its problem.
    rollout: samples k continuations after each prefix (see `RolloutFn`).
    decode: token ids -> text, as the completions were decoded.
    is_correct: whether a full completion text ends with the right answer.
    key: PRNG key of the rollouts.

  Returns:
    Per completion, `[num_segments]` float32 values in [0, 1]. Hard labels are `v > 0`, soft
    labels `v`; pass either through `propagate`.
  """
  if not len(prompt_ids) == len(completion_ids) == len(segment_ends) == len(examples):
    raise ValueError("monte_carlo_values: prompt_ids, completion_ids, segment_ends and examples differ in length")
  prefixes, heads, owners = [], [], []
  for i, (prompt, completion, ends) in enumerate(zip(prompt_ids, completion_ids, segment_ends)):
    for end in ends:
      head = list(completion[:end + 1])
      prefixes.append(list(prompt) + head)
      heads.append(decode(head))
      owners.append(i)
  values = [np.zeros(len(ends), np.float32) for ends in segment_ends]
  if not prefixes:
    return values
  continuations = rollout(prefixes, key)
  if len(continuations) != len(prefixes):
    raise ValueError(f"rollout returned {len(continuations)} groups for {len(prefixes)} prefixes")
  position = [0] * len(segment_ends)
  for owner, head, group in zip(owners, heads, continuations):
    if not group:
      raise ValueError("rollout returned no continuation for a prefix")
    hits = [bool(is_correct(head + text, examples[owner])) for text in group]
    values[owner][position[owner]] = np.mean(hits)
    position[owner] += 1
  return values
