"""Evaluation metrics over sampled completions: pass@k, maj@k, format rate, length."""

from typing import Callable, Sequence

import numpy as np

from grpo_jax.data.example import Example
from grpo_jax.data.answer import answer_key, answers_equal, extract_answer
from grpo_jax.rewards.rule import has_final_answer_format


def pass_at_k(n, c, k: int) -> np.ndarray:
  """Unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large Language
  Models Trained on Code", arXiv 2107.03374).

    pass@k = 1 − C(n−c, k) / C(n, k) = 1 − ∏_{i=n−c+1}^{n} (1 − k/i)

  computed in log space from one cumulative sum over i, S[m] = Σ_{i=k+1}^{m}
  log(1 − k/i), as 1 − exp(S[n] − S[n−c]) when n − c >= k and 1 otherwise:
  vectorised over problems, and it neither overflows nor cancels badly.

  Args:
    n: samples per problem, int or int array.
    c: correct samples per problem, broadcastable with n; 0 <= c <= n.
    k: the k of pass@k; 1 <= k <= min(n).

  Returns:
    float64 array of the broadcast shape of n and c: the estimate per problem.
  """
  n, c = np.broadcast_arrays(np.asarray(n), np.asarray(c))
  if not (np.issubdtype(n.dtype, np.integer) and np.issubdtype(c.dtype, np.integer)):
    raise TypeError(f"n and c must be integers, got {n.dtype} and {c.dtype}")
  if np.any(c < 0) or np.any(c > n):
    raise ValueError("need 0 <= c <= n for every problem")
  if k < 1:
    raise ValueError(f"k must be >= 1, got {k}")
  if np.any(n < k):
    raise ValueError(f"need k <= n for every problem, got k={k} and n={n.min()}")
  if n.size == 0:
    return np.zeros(n.shape, dtype=np.float64)
  i = np.arange(k + 1, int(n.max()) + 1, dtype=np.float64)
  cum = np.concatenate([np.zeros(k + 1), np.cumsum(np.log1p(-k / i))])  # cum[m] = S[m]
  fails_left = n - c >= k
  ratio = np.exp(cum[n] - cum[np.where(fails_left, n - c, n)])
  return np.where(fails_left, 1.0 - ratio, 1.0)


def majority_vote(answers: Sequence[str | None]) -> str | None:
  """The most common answer, equivalent answers voting together (`answer_key`).

  Ties go to the group whose first member comes first. Missing answers (None
  or empty) never win; the result is None only when all are missing. The
  winner is returned as its group's first member wrote it.
  """
  counts, first = {}, {}
  for answer in answers:
    key = answer_key(answer)
    if key is None:
      continue
    counts[key] = counts.get(key, 0) + 1
    first.setdefault(key, answer)
  if not counts:
    return None
  best = max(counts, key=counts.__getitem__)  # max keeps the first-inserted on ties
  return first[best]


def maj_at_k(answers_per_problem: Sequence[Sequence[str | None]],
             reference: Sequence[str], k: int) -> np.ndarray:
  """maj@k: whether the majority vote of the first k answers is right.

  Args:
    answers_per_problem: per problem, extracted answers (None when absent).
    reference: the reference answer per problem.
    k: answers per vote; every problem needs at least k.

  Returns:
    float64 [num_problems] of 0.0/1.0.
  """
  if len(answers_per_problem) != len(reference):
    raise ValueError(f"{len(answers_per_problem)} problems but {len(reference)} references")
  if k < 1:
    raise ValueError(f"k must be >= 1, got {k}")
  out = np.zeros(len(reference), dtype=np.float64)
  for i, (answers, ref) in enumerate(zip(answers_per_problem, reference)):
    if len(answers) < k:
      raise ValueError(f"problem {i} has {len(answers)} answers, fewer than k={k}")
    out[i] = answers_equal(majority_vote(answers[:k]), ref)
  return out


def format_rate(completions: Sequence[str],
                is_formatted: Callable[[str], bool] = has_final_answer_format) -> float:
  """Fraction of completions in the expected format (default: `#### x` last)."""
  if not completions:
    return 0.0
  return float(np.mean([bool(is_formatted(c)) for c in completions]))


def mean_length(items: Sequence[str] | Sequence[int] | np.ndarray) -> float:
  """Mean length: of strings in characters, or of given lengths (e.g. tokens)."""
  lengths = [len(x) if isinstance(x, str) else x for x in items]
  return float(np.mean(lengths)) if len(lengths) else 0.0


def summarize(completions_per_problem: Sequence[Sequence[str]], examples: Sequence[Example],
              ks: Sequence[int] = (1,),
              is_formatted: Callable[[str], bool] = has_final_answer_format
              ) -> dict[str, float]:
  """Evaluation metrics of G sampled completions per problem.

  Args:
    completions_per_problem: per problem, its completions (the same count for all).
    examples: the problems, one per entry of completions_per_problem.
    ks: the k of pass@k and maj@k; each must be <= the number of completions.
    is_formatted: the format check for "format_rate".

  Returns:
    {"pass@k", "maj@k" for each k, "accuracy" (mean correctness of all
    samples), "format_rate", "mean_length" (characters), "num_problems",
    "num_samples"}.
  """
  if len(completions_per_problem) != len(examples):
    raise ValueError(f"{len(completions_per_problem)} problems but {len(examples)} examples")
  answers = [[extract_answer(c) for c in cs] for cs in completions_per_problem]
  correct = [[answers_equal(a, e.answer) for a in ans] for ans, e in zip(answers, examples)]
  n = np.asarray([len(cs) for cs in correct], dtype=np.int64)
  c = np.asarray([sum(cs) for cs in correct], dtype=np.int64)
  flat = [c for cs in completions_per_problem for c in cs]
  metrics = {}
  for k in ks:
    metrics[f"pass@{k}"] = float(np.mean(pass_at_k(n, c, k)))
    metrics[f"maj@{k}"] = float(np.mean(maj_at_k(answers, [e.answer for e in examples], k)))
  metrics["accuracy"] = float(c.sum() / max(n.sum(), 1))
  metrics["format_rate"] = format_rate(flat, is_formatted)
  metrics["mean_length"] = mean_length(flat)
  metrics["num_problems"] = float(len(examples))
  metrics["num_samples"] = float(len(flat))
  return metrics
