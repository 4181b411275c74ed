"""Monte Carlo rollouts from a policy, for Math-Shepherd step labels (`step_labels.monte_carlo_values`)."""

from collections.abc import Sequence

import jax
import numpy as np

from grpo_jax import sampling
from grpo_jax.data.step_labels import RolloutFn
from grpo_jax.evaluation.generate import decode
from grpo_jax.models.config import ModelConfig
from grpo_jax.training import batch as batch_lib


def policy_rollout(params, config: ModelConfig, tokenizer, *, num_rollouts: int, max_prefix_len: int,
                   max_new_tokens: int, batch_size: int = 64, temperature: float = 1.0) -> RolloutFn:
  """A `RolloutFn` that samples `num_rollouts` continuations of each prefix from the policy.

  Prefixes are left-padded (cut from the left) to `max_prefix_len` and sampled in batches of
  `batch_size` with `sampling.sample`; the last batch is padded with copies, so every call has
  one shape and compiles once.

  Args:
    params: policy params.
    config: its ModelConfig.
    tokenizer: its tokenizer (decodes the continuations, skipping special tokens).
    num_rollouts: k, continuations per prefix.
    max_prefix_len: prompt plus completion-prefix tokens kept.
    max_new_tokens: continuation budget.
    batch_size: prefixes per sampler call.
    temperature: sampling temperature.

  Returns:
    `rollout(prefixes, key) -> per prefix, its k continuation texts`.
  """
  if num_rollouts < 1 or batch_size < 1:
    raise ValueError(f"num_rollouts and batch_size must be >= 1, got {num_rollouts}, {batch_size}")
  pad_id = tokenizer.pad_token_id or 0

  def rollout(prefixes: Sequence[Sequence[int]], key: jax.Array) -> list[list[str]]:
    out = []
    for start in range(0, len(prefixes), batch_size):
      chunk = [list(p) for p in prefixes[start:start + batch_size]]
      real = len(chunk)
      chunk += [chunk[0]] * (batch_size - real)
      tokens, mask = batch_lib.pad_left(chunk, max_prefix_len, pad_id)
      samples = sampling.sample(params, config, tokens, mask, jax.random.fold_in(key, start),
                                num_samples=num_rollouts, max_new_tokens=max_new_tokens, temperature=temperature)
      texts = decode(tokenizer, jax.tree.map(np.asarray, samples))
      out.extend(texts[i * num_rollouts:(i + 1) * num_rollouts] for i in range(real))
    return out

  return rollout
