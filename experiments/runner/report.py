"""What a run tells its reader on the terminal: notes, the progress line, a step's metrics over its minibatches,
the closing table. Shared by the training loop and the other entry modules (train_reward_model, sample_eval), so
that none of them imports the loop to print."""

import math
import sys

import numpy as np

from grpo_jax import training

# The rollout-trainer mismatch (`training.update.rollout_correction`) compares the sampler's log-probs with the
# update forward's π_θ: on a step's first minibatch that is the policy that sampled, so it is taken from that one.
MISMATCH_PREFIX = "mismatch_"
# The progress line shows the mismatch from this k3 KL(π_sampler ‖ π_trainer) per token, or when any ratio
# π_trainer / π_sampler of the step lies outside [0.5, 2].
MISMATCH_SHOWN_KL = 1e-3


def note(line: str) -> None:
  """A one-line note on stderr, on a line of its own."""
  training.end_progress_line()
  print(line, file=sys.stderr)


def combine(name: str, values: list[float]) -> float:
  """One metric over a step's minibatches (separate optimiser steps): min/max for extremes, else the mean; the
  mismatch metrics are the first minibatch's."""
  if name.startswith(MISMATCH_PREFIX):
    return values[0]
  if name.endswith("_min"):
    return min(values)
  if name.endswith("_max"):
    return max(values)
  return float(np.mean(values))


def progress_line(values: dict) -> str:
  """A stage-2 step's progress line from its logged `values` (`train/...`): the finite ones of a fixed list, and
  the rollout-trainer mismatch once it is large enough to matter."""
  parts = [("reward", "train/reward_mean", ".3f"), ("acc", "train/accuracy", ".3f"), ("loss", "train/loss", ".4f"),
           ("kl", "train/kl", ".4f"), ("kl", "train/kl_reward", ".3f"), ("vf", "train/value_loss", ".4f"),
           ("len", "train/response_length", ".1f"), ("turns", "train/mean_turns", ".2f"),
           ("tool err", "train/tool_error_rate", ".3f"), ("rm_auc", "train/reward_group_auc", ".2f")]
  line = " ".join(f"{name} {values[k]:{fmt}}" for name, k, fmt in parts
                  if isinstance(values.get(k), (int, float)) and math.isfinite(values[k]))
  kl, outside = values.get("train/mismatch_kl"), values.get("train/mismatch_ratio_outside")
  if isinstance(kl, float) and isinstance(outside, float) and (kl >= MISMATCH_SHOWN_KL or outside > 0):
    line += f" mismatch kl {kl:.1e} out {100 * outside:.2f}%"
  return line


def print_table(title: str, rows: list[tuple[str, str]]) -> None:
  """A run's closing table: a title, a rule, then `name  value` lines."""
  width = max(len(r[0]) for r in rows)
  print("\n".join(["", title, "-" * (width + 10)] + [f"{a:<{width}}  {b}" for a, b in rows]))
