"""Fixtures that make some sampled completions right and some wrong by construction.

A tiny trained policy's accuracy depends on how the processor rounds (a 40-step SFT policy is right on 6% of
problems on one machine and on none on another), so tests that need right and wrong samples (RFT's data,
DPO's pairs, non-zero GRPO/PPO advantages, process rewards) inject them instead of hoping the policy provides them.
"""

import numpy as np
import pytest

from experiments.methods import rollouts as rollouts_lib
from grpo_jax import sampling as sampling_lib


def _inject_texts(samples, texts, tokenizer):
  """`samples` with row r's completion replaced by `texts[r]` and the end token (rows whose text is None keep
  the policy's own sample); the injected tokens have log-prob log ½."""
  s = sampling_lib.SampleOutput(*[np.array(x) for x in samples])
  width = s.tokens.shape[1]
  for row, text in enumerate(texts):
    if text is None:
      continue
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert len(ids) <= width, (text, width)
    s.tokens[row] = tokenizer.pad_token_id or 0
    s.tokens[row, :len(ids)] = ids
    s.mask[row] = np.arange(width) < len(ids)
    s.logprobs[row] = np.where(s.mask[row], np.log(0.5), 0.0)
    s.lengths[row], s.truncated[row] = len(ids), False
  return s


def inject_completions(monkeypatch, text_of_row):
  """Every `Rollouts.sample` call (online steps and the offline datasets of RFT/DPO) returns, in row r, the
  completion `text_of_row(r, example)` (None: the policy's own), scored by the real rewards. Row r belongs to
  prompt r // num_samples."""
  real_generate = rollouts_lib.Rollouts.generate  # the sampler call of `Rollouts.sample`, either sampler
  real_method = rollouts_lib.Rollouts.sample

  def sample(self, params, examples, key, num_samples):
    def injected(*args, **kwargs):
      out = real_generate(self, *args, **kwargs)
      texts = [text_of_row(row, examples[row // num_samples]) for row in range(len(out.tokens))]
      return _inject_texts(out, texts, self.task.tokenizer)
    self.generate = injected  # this call's rollouts only
    try:
      return real_method(self, params, examples, key, num_samples)
    finally:
      del self.generate

  monkeypatch.setattr(rollouts_lib.Rollouts, "sample", sample)


def _known_answer(row, example):
  """Rows r = 0 mod 4 answer `#### <answer>` (right), rows r = 1 mod 4 `#### <answer + 1>` (wrong)."""
  if row % 4 > 1:
    return None
  return f"#### {example.answer}" if row % 4 == 0 else f"#### {int(example.answer) + 1}"


@pytest.fixture
def known_answers(monkeypatch):
  """Rows r = 0 mod 4 answer `#### <answer>` (right), rows r = 1 mod 4 `#### <answer + 1>` (wrong); the other
  rows keep the policy's own samples."""
  inject_completions(monkeypatch, _known_answer)
