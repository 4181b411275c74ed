"""Held-out quality of a reward model: accuracy and ROC AUC of its scores against binary labels, and the
within-problem AUC that decides whether GRPO can use it."""

import numpy as np


def binary_auc(scores, labels) -> float:
  """ROC AUC = P(s⁺ > s⁻) + ½ P(s⁺ = s⁻) over all (positive, negative) pairs (Mann-Whitney U).

  Args:
    scores: `[M]` scores (any monotone scale: logits or probabilities).
    labels: `[M]` labels; > 0.5 is positive.

  Returns:
    The AUC in [0, 1]; NaN when one class is absent.
  """
  s = np.asarray(scores, np.float64).reshape(-1)
  y = np.asarray(labels, np.float64).reshape(-1) > 0.5
  if s.shape != y.shape:
    raise ValueError(f"binary_auc: {s.shape[0]} scores for {y.shape[0]} labels")
  n_pos, n_neg = int(y.sum()), int((~y).sum())
  if n_pos == 0 or n_neg == 0:
    return float("nan")
  order = np.argsort(s, kind="mergesort")
  ranks = np.empty(len(s), np.float64)
  sorted_s = s[order]
  # Average rank (1-based) within each run of tied scores.
  starts = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
  ends = np.r_[starts[1:], len(s)]
  for a, b in zip(starts, ends):
    ranks[order[a:b]] = 0.5 * (a + 1 + b)
  u = ranks[y].sum() - n_pos * (n_pos + 1) / 2
  return float(u / (n_pos * n_neg))


def group_auc(scores, labels, groups) -> tuple[float, int]:
  """Within-problem AUC: P(s⁺ > s⁻) + ½ P(s⁺ = s⁻) over (right, wrong) pairs of the same problem.

  GRPO normalises rewards within each group of samples of one problem, so only this ranking
  reaches the policy: a reward model can have a high global AUC by scoring easy problems high and
  still rank a problem's own samples at chance (0.5), which GRPO turns into pure noise.

  Args:
    scores: `[M]` scores.
    labels: `[M]` labels; > 0.5 is positive.
    groups: `[M]` problem ids.

  Returns:
    `(auc, pairs)`: the AUC (NaN when no problem has both classes) and the number of pairs.
  """
  s = np.asarray(scores, np.float64).reshape(-1)
  y = np.asarray(labels, np.float64).reshape(-1) > 0.5
  g = np.asarray(groups).reshape(-1)
  if not s.shape == y.shape == g.shape:
    raise ValueError(f"group_auc: {s.size} scores, {y.size} labels, {g.size} groups")
  wins, pairs = 0.0, 0
  for group in np.unique(g):
    in_group = g == group
    pos, neg = s[in_group & y], s[in_group & ~y]
    if pos.size and neg.size:
      diff = pos[:, None] - neg[None, :]
      wins += float(np.sum(diff > 0) + 0.5 * np.sum(diff == 0))
      pairs += diff.size
  return (wins / pairs if pairs else float("nan")), pairs


def binary_accuracy(logits, labels) -> float:
  """Fraction where σ(s) > ½ (s > 0) agrees with label > ½."""
  s = np.asarray(logits, np.float64).reshape(-1)
  y = np.asarray(labels, np.float64).reshape(-1)
  if s.shape != y.shape or not s.size:
    raise ValueError(f"binary_accuracy: {s.size} scores for {y.size} labels")
  return float(np.mean((s > 0) == (y > 0.5)))


def summarize(logits, labels, mask=None, prefix: str = "") -> dict[str, float]:
  """{accuracy, auc, positive_rate, count} of the masked entries, names prefixed."""
  s, y = np.asarray(logits), np.asarray(labels)
  if mask is not None:
    m = np.asarray(mask, bool)
    s, y = s[m], y[m]
  s, y = s.reshape(-1), y.reshape(-1)
  if not s.size:
    return {f"{prefix}count": 0.0}
  return {f"{prefix}accuracy": binary_accuracy(s, y), f"{prefix}auc": binary_auc(s, y),
          f"{prefix}positive_rate": float(np.mean(y > 0.5)), f"{prefix}count": float(s.size)}
