"""Where a reward model reads its scores: the end token of each step of a sampled completion.

The segments of a completion (its steps, then its final-answer segment) are found on the
decoded text (`grpo_jax.data.step_labels.segment_spans`); each segment's last character is
mapped to the completion token that produced it.
"""

from collections.abc import Sequence

import numpy as np

from grpo_jax.data import step_labels


def char_ends_to_tokens(token_texts_lengths: Sequence[int], char_ends: Sequence[int]) -> list[int]:
  """Token index holding each character offset, given each token's decoded length.

  Token t covers characters [c_t, c_t + n_t) with c_t = Σ_{u<t} n_u; a character offset maps to
  the token whose range contains it.

  Raises:
    ValueError: when an offset lies beyond the decoded text.
  """
  cum = np.cumsum(np.asarray(token_texts_lengths, np.int64))
  out = []
  for c in char_ends:
    t = int(np.searchsorted(cum, c, side="right"))
    if t >= len(cum):
      raise ValueError(f"character {c} is beyond the decoded text of {int(cum[-1]) if len(cum) else 0} characters")
    out.append(t)
  return out


def decoded_lengths(tokenizer, ids: Sequence[int]) -> list[int]:
  """Decoded length n_t of every token, such that Σ_{u≤t} n_u = len(decode(ids[:t+1])).

  Decodes token by token when that reproduces the whole decoded text (character and most BPE
  tokenizers); otherwise (a multi-byte character split across tokens) decodes each prefix.
  Special tokens decode to nothing, as in `grpo_jax.evaluation.decode`.
  """
  ids = [int(i) for i in ids]
  pieces = [tokenizer.decode([i], skip_special_tokens=True) for i in ids]
  if "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True):
    return [len(p) for p in pieces]
  prefix = [len(tokenizer.decode(ids[:t + 1], skip_special_tokens=True)) for t in range(len(ids))]
  return [b - a for a, b in zip([0] + prefix[:-1], prefix)]


def segment_token_ends(tokenizer, completion_ids: Sequence[int], text: str | None = None) -> list[int]:
  """Completion-relative token index of the end of each segment (steps, then the answer).

  Args:
    tokenizer: the policy's tokenizer.
    completion_ids: the completion's tokens, without padding (the end token may be included).
    text: its decoded text (default: decoded here, skipping special tokens).

  Returns:
    One index into `completion_ids` per segment of `step_labels.segment_spans(text)`.
  """
  if text is None:
    text = tokenizer.decode([int(i) for i in completion_ids], skip_special_tokens=True)
  return char_ends_to_tokens(decoded_lengths(tokenizer, completion_ids), step_labels.segment_end_offsets(text))


def cap_segments(values: Sequence, max_steps: int) -> list:
  """At most `max_steps` entries: the first max_steps − 1 and the last (the answer segment)."""
  values = list(values)
  if len(values) <= max_steps:
    return values
  return values[:max_steps - 1] + values[-1:]


def pad_segments(rows: Sequence[Sequence], max_steps: int, dtype=np.int32) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads per-completion lists (capped by `cap_segments`) to `[N, max_steps]`; returns (values, mask)."""
  if max_steps < 1:
    raise ValueError(f"max_steps must be >= 1, got {max_steps}")
  out = np.zeros((len(rows), max_steps), dtype)
  mask = np.zeros((len(rows), max_steps), bool)
  for i, row in enumerate(rows):
    row = cap_segments(row, max_steps)
    out[i, :len(row)] = row
    mask[i, :len(row)] = True
  return out, mask


def sample_segment_ends(tokenizer, completion_tokens: np.ndarray, lengths: np.ndarray, texts: Sequence[str],
                        max_steps: int) -> tuple[np.ndarray, np.ndarray]:
  """Segment end tokens of a batch of sampled completions, for `step_scores` and `process_advantages`.

  Args:
    tokenizer: the policy's tokenizer.
    completion_tokens: `[N, T]` sampled ids (`SampleOutput.tokens`).
    lengths: `[N]` generated lengths (`SampleOutput.lengths`).
    texts: the decoded completions (`grpo_jax.evaluation.decode`).
    max_steps: K; longer completions keep their first K − 1 segments and the last.

  Returns:
    `(ends [N, K] int32 in [0, T), mask [N, K] bool)`, completion-relative: add the padded
    prompt length P for positions in the full `[N, P + T]` sequence.
  """
  rows = [segment_token_ends(tokenizer, completion_tokens[i, :int(lengths[i])], texts[i])
          for i in range(len(texts))]
  return pad_segments(rows, max_steps)
