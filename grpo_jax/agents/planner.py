"""Planners: the policy model through the KV-cache sampler, or a fixed script (teachers, tests).

`SamplerPlanner` pads each batch of prompts to a fixed length and the row count up to a bucket (a
power of two, at least `min_bucket`), so `sampling.sample` compiles once per bucket instead of
once per active-set size while finished trajectories drop out turn by turn.
"""

from typing import Sequence

import jax
import numpy as np

from grpo_jax import sampling
from grpo_jax.agents.episodes import PlannerOutput, PlanRequest
from grpo_jax.training import batch as batch_lib


def bucket_size(n: int, min_bucket: int = 8) -> int:
  """The smallest power of two >= max(n, min_bucket)."""
  return 1 << (max(n, min_bucket, 1) - 1).bit_length()


class SamplerPlanner:
  """π_θ as a planner: samples one action per request and sample with `sampling.sample`.

  Args:
    params, config: the policy.
    tokenizer: its tokenizer (prompts are encoded without special tokens).
    max_prompt_len: prompt tokens; longer prompts are cut from the left (counted in `prompts_truncated`).
    max_action_tokens: the action budget per turn.
    temperature, top_k, top_p, greedy: sampling, as in `sampling.sample`.
    min_bucket: the smallest padded row count.
    pad_id: fills the sampled tokens after the end; default the tokenizer's pad id, else 0.
  """

  def __init__(self, params, config, tokenizer, *, max_prompt_len: int, max_action_tokens: int,
               temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
               min_bucket: int = 8, pad_id: int | None = None):
    self.params, self.config, self.tokenizer = params, config, tokenizer
    self.max_prompt_len, self.max_action_tokens = max_prompt_len, max_action_tokens
    self.sample_kwargs = dict(temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy)
    self.min_bucket = min_bucket
    self.prompts_truncated = 0
    self.rows_sampled = 0  # padded rows, for the cost of the bucketing
    self.pad_id = (tokenizer.pad_token_id or 0) if pad_id is None else pad_id

  def __call__(self, requests: Sequence[PlanRequest], key: jax.Array, num_samples: int = 1) -> list[PlannerOutput]:
    n = len(requests)
    rows = self.rows(n)
    prompts = [r.prompt for r in requests] + [requests[0].prompt] * (rows - n)
    ids = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    self.prompts_truncated += sum(len(x) > self.max_prompt_len for x in ids[:n])
    tokens, mask = batch_lib.pad_left(ids, self.max_prompt_len, self.pad_id)
    out = sampling.sample(self.params, self.config, tokens, mask, key, **self._options(num_samples))
    out_tokens, lengths, truncated = (np.asarray(x) for x in (out.tokens, out.lengths, out.truncated))
    self.rows_sampled += rows * num_samples
    outputs = []
    for i in range(n * num_samples):
      prompt_ids = tuple(ids[i // num_samples][-self.max_prompt_len:])
      action_ids = tuple(int(t) for t in out_tokens[i, :lengths[i]])
      text = self.tokenizer.decode(list(action_ids), skip_special_tokens=True)
      outputs.append(PlannerOutput(text, prompt_ids, action_ids, bool(truncated[i])))
    return outputs


  def rows(self, n: int) -> int:
    """The sampler's rows for `n` requests (`bucket_size`): each count compiles one program."""
    return bucket_size(n, self.min_bucket)

  def program(self, num_samples: int = 1):
    """`(program, static)` that a call with `num_samples` samples a request runs (`sampling.sample_program`):
    ahead of time, `program.trace(params, tokens, mask, key, temperature, None, **static)` with tokens and mask
    `[self.rows(n), max_prompt_len]`."""
    options = self._options(num_samples)
    del options["temperature"]  # traced
    return sampling.sample_program(self.config, **options)

  def _options(self, num_samples: int) -> dict:
    return dict(num_samples=num_samples, max_new_tokens=self.max_action_tokens, pad_id=self.pad_id,
                **self.sample_kwargs)


class ScriptedPlanner:
  """Plays fixed action texts: `scripts[i][t - 1]` for trajectory i at turn t ("" past the script's end).

  With a `tokenizer`, each output also carries the token ids a model planner's would: the prompt's (cut from the
  left to `max_prompt_len`, as `SamplerPlanner` cuts them) and the action's followed by the end token, so the
  turns of a script can be trained on (`turn_rows`): a teacher's trajectories as training rows.
  """

  def __init__(self, scripts: Sequence[Sequence[str]], tokenizer=None, max_prompt_len: int | None = None):
    self.scripts = [list(s) for s in scripts]
    self.tokenizer, self.max_prompt_len = tokenizer, max_prompt_len

  def __call__(self, requests: Sequence[PlanRequest], key: jax.Array, num_samples: int = 1) -> list[PlannerOutput]:
    del key
    outputs = []
    for request in requests:
      for g in range(num_samples):
        script = self.scripts[request.trajectory + g]
        outputs.append(self._output(request.prompt, script[request.turn - 1] if request.turn <= len(script) else ""))
    return outputs

  def _output(self, prompt: str, text: str) -> PlannerOutput:
    if self.tokenizer is None:
      return PlannerOutput(text)
    encode = lambda s: self.tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    prompt_ids = encode(prompt)
    if self.max_prompt_len is not None:
      prompt_ids = prompt_ids[-self.max_prompt_len:]
    return PlannerOutput(text, tuple(prompt_ids), tuple(encode(text)) + (self.tokenizer.eos_token_id,))
