"""Reward-model training data: labelled policy samples as one `RewardData` of NumPy arrays.

Both kinds share one layout: K scored positions per completion with a label each. An ORM has
K = 1, its last token labelled with the outcome; a PRM has one position per segment (steps, then
the answer), labelled exactly or by Monte Carlo rollouts (`grpo_jax.data.step_labels`).
"""

from collections.abc import Sequence
from typing import NamedTuple
import zlib

import jax
import numpy as np

from grpo_jax.data import step_labels
from grpo_jax.data.example import Example
from grpo_jax.reward_models import model
from grpo_jax.reward_models import positions as positions_lib
from grpo_jax.rewards import rule
from grpo_jax.sampling import SampleOutput


class RewardData(NamedTuple):
  """N labelled completions; every field has leading dimension N.

  Attributes:
    tokens: `[N, L]` int32, left-padded prompt then right-padded completion.
    attention_mask: `[N, L]` bool.
    positions: `[N, K]` int32 positions in `tokens` of the scored tokens.
    labels: `[N, K]` float32 labels in [0, 1].
    loss_mask: `[N, K]` bool, true for real scored positions (the name `make_train_step` counts).
    group: `[N]` int32 id of the problem (`problem_id`).
    outcome: `[N]` float32, 1 where the completion's final answer is right.
  """
  tokens: np.ndarray
  attention_mask: np.ndarray
  positions: np.ndarray
  labels: np.ndarray
  loss_mask: np.ndarray
  group: np.ndarray
  outcome: np.ndarray


def problem_id(example: Example) -> int:
  """A stable 31-bit id of a problem (CRC-32 of its question)."""
  return zlib.crc32(example.question.encode("utf-8")) & 0x7FFFFFFF


def concat(parts: Sequence[RewardData]) -> RewardData:
  """Rows of several RewardData, in order (same L and K)."""
  return RewardData(*[np.concatenate(fields, axis=0) for fields in zip(*parts)])


def take(data: RewardData, index) -> RewardData:
  """The rows `index` of `data`."""
  return RewardData(*[np.asarray(x)[index] for x in data])


def num_rows(data: RewardData) -> int:
  return int(data.tokens.shape[0])


def outcome_labels(texts: Sequence[str], examples: Sequence[Example]) -> np.ndarray:
  """`[N]` float32, 1 where the completion's final answer is right (the `correctness` rule)."""
  return np.asarray([rule.correctness(t, e) for t, e in zip(texts, examples)], np.float32)


def exact_step_labels(texts: Sequence[str], examples: Sequence[Example]) -> list[np.ndarray]:
  """Per completion, its exact propagated segment labels (synthetic task)."""
  correct = outcome_labels(texts, examples)
  return [step_labels.exact_labels(e, t, correct=bool(c)) for t, e, c in zip(texts, examples, correct)]


def monte_carlo_step_labels(samples: SampleOutput, texts: Sequence[str], examples: Sequence[Example], tokenizer, *,
                            rollout: step_labels.RolloutFn, key: jax.Array, soft: bool = False) -> list[np.ndarray]:
  """Per completion, its propagated Math-Shepherd labels: hard (any rollout right) or soft (the fraction)."""
  samples = jax.tree.map(np.asarray, samples)
  n = len(texts)
  prompts = [samples.prompt_tokens[i][samples.prompt_mask[i]].tolist() for i in range(n)]
  completions = [samples.tokens[i, :int(samples.lengths[i])].tolist() for i in range(n)]
  ends = [positions_lib.segment_token_ends(tokenizer, completions[i], texts[i]) for i in range(n)]
  values = step_labels.monte_carlo_values(
      prompts, completions, ends, examples, rollout=rollout,
      decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
      is_correct=lambda text, example: rule.correctness(text, example) > 0, key=key)
  return [step_labels.propagate(v if soft else (v > 0).astype(np.float32)) for v in values]


def build_reward_data(samples: SampleOutput, texts: Sequence[str], examples: Sequence[Example], tokenizer, *,
                      kind: str, max_steps: int = 8, step_label_rows: Sequence[Sequence[float]] | None = None
                      ) -> RewardData:
  """Labelled reward-model rows from sampled completions.

  Args:
    samples: a (NumPy) SampleOutput; row i is `texts[i]` for `examples[i]`.
    texts: the decoded completions (`grpo_jax.evaluation.decode`).
    examples: the problem of each row.
    tokenizer: the policy's tokenizer.
    kind: "orm" (K = 1: the last completion token, labelled by correctness), "prm"
      (K = max_steps: each segment's end token, labelled by `step_label_rows`) or "orm_steps"
      (each segment's end token, every one labelled with the completion's correctness; the
      noisy-AND loss reads only the first label of a row).
    max_steps: K of a PRM or "orm_steps"; longer completions keep their first K − 1 segments and the last.
    step_label_rows: PRM only: per completion, one label per segment (`exact_step_labels`,
      `monte_carlo_step_labels`).

  Returns:
    A RewardData with N = len(texts) rows.
  """
  samples = jax.tree.map(np.asarray, samples)
  n = len(texts)
  if not n == len(examples) == samples.tokens.shape[0]:
    raise ValueError(f"build_reward_data: {n} texts, {len(examples)} examples, {samples.tokens.shape[0]} samples")
  prompt_len = samples.prompt_tokens.shape[1]
  tokens = np.concatenate([samples.prompt_tokens, samples.tokens], axis=1).astype(np.int32)
  attention = np.concatenate([samples.prompt_mask, samples.mask], axis=1).astype(bool)
  group = np.asarray([problem_id(e) for e in examples], np.int32)
  outcome = outcome_labels(texts, examples)
  if kind == "orm":
    last = prompt_len + np.maximum(samples.lengths.astype(np.int32), 1) - 1
    return RewardData(tokens, attention, last[:, None].astype(np.int32), outcome[:, None],
                      (samples.lengths > 0)[:, None], group, outcome)
  if kind not in model.STEP_KINDS:
    raise ValueError(f"unknown reward model kind {kind!r}; expected 'orm', 'orm_steps' or 'prm'")
  ends, mask = positions_lib.sample_segment_ends(tokenizer, samples.tokens, samples.lengths, texts, max_steps)
  if kind == "orm_steps":
    labels = np.where(mask, outcome[:, None], 0.0).astype(np.float32)
    return RewardData(tokens, attention, (prompt_len + ends).astype(np.int32), labels, mask, group, outcome)
  if step_label_rows is None or len(step_label_rows) != n:
    raise ValueError("build_reward_data: a PRM needs one row of step labels per completion")
  labels, label_mask = positions_lib.pad_segments(step_label_rows, max_steps, np.float32)
  if not np.array_equal(label_mask, mask):
    bad = int(np.argmax(np.any(label_mask != mask, axis=1)))
    raise ValueError(f"row {bad}: {len(step_label_rows[bad])} step labels for {int(mask[bad].sum())} segments")
  return RewardData(tokens, attention, (prompt_len + ends).astype(np.int32), labels, mask, group, outcome)
