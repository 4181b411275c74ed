"""A fixture that makes some sampled completions right and some wrong by construction.

A tiny trained policy's accuracy depends on how the processor rounds (a 40-step SFT policy is right on 6% of
problems on one machine and on none on another), so tests that need right and wrong samples (RFT's data,
DPO's pairs, non-zero GRPO/PPO advantages) inject them instead of hoping the policy provides them.
"""

import numpy as np
import pytest

from experiments.methods import rollouts as rollouts_lib
from grpo_jax import sampling as sampling_lib


def _inject_known_answers(samples, examples, num_samples, tokenizer):
  """Rows r = 0 mod 4 answer `#### <answer>` (right), rows r = 1 mod 4 `#### <answer + 1>` (wrong); the
  other rows keep the policy's own samples. Row r belongs to prompt r // num_samples."""
  s = sampling_lib.SampleOutput(*[np.array(x) for x in samples])
  width = s.tokens.shape[1]
  for row in range(len(s.tokens)):
    if row % 4 > 1:
      continue
    answer = examples[row // num_samples].answer
    text = f"#### {answer}" if row % 4 == 0 else f"#### {int(answer) + 1}"
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert len(ids) <= width, (text, width)
    s.tokens[row] = tokenizer.pad_token_id or 0
    s.tokens[row, :len(ids)] = ids
    s.mask[row] = np.arange(width) < len(ids)
    s.logprobs[row] = np.where(s.mask[row], np.log(0.5), 0.0)
    s.lengths[row], s.truncated[row] = len(ids), False
  return s


@pytest.fixture
def known_answers(monkeypatch):
  """Every `Rollouts.sample` call (online steps and the offline datasets of RFT/DPO) returns some right and
  some wrong completions whatever the policy, and these are scored by the real rewards."""
  real_sample = rollouts_lib.sampling.sample
  real_method = rollouts_lib.Rollouts.sample

  def sample(self, params, examples, key, num_samples):
    def injected(*args, **kwargs):
      out = real_sample(*args, **kwargs)
      return _inject_known_answers(out, examples, num_samples, self.task.tokenizer)
    monkeypatch.setattr(rollouts_lib.sampling, "sample", injected)
    try:
      return real_method(self, params, examples, key, num_samples)
    finally:
      monkeypatch.setattr(rollouts_lib.sampling, "sample", real_sample)

  monkeypatch.setattr(rollouts_lib.Rollouts, "sample", sample)
