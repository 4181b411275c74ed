"""Batched generation of text completions for a list of prompts, with fixed shapes (one compile)."""

from typing import Sequence

import jax
import numpy as np

from grpo_jax import distributed
from grpo_jax import rollout_engine
from grpo_jax import sampling
from grpo_jax import partitioning
from grpo_jax.models import ModelConfig
from grpo_jax.training import batch as batch_lib


def decode(tokenizer, samples: sampling.SampleOutput) -> list[str]:
  """Completion texts of a SampleOutput, without the end token or padding."""
  tokens = np.asarray(samples.tokens)
  lengths = np.asarray(samples.lengths)
  return tokenizer.batch_decode([t[:n].tolist() for t, n in zip(tokens, lengths)], skip_special_tokens=True)


def generate(params, config: ModelConfig, tokenizer, prompts: Sequence[str], key: jax.Array, *,
             batch_size: int, max_prompt_len: int, max_new_tokens: int, num_samples: int = 1,
             greedy: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             mesh=None, rules=None, prompt_chunk: int = 0, engine: bool = False,
             num_slots: int = 0) -> tuple[list[list[str]], np.ndarray]:
  """Generates `num_samples` completions per prompt in batches of `batch_size` prompts (each batch
  `prompt_chunk` prompts at a time inside the sampler when given: `sampling.sample`; or, with `engine`, by
  `rollout_engine.generate` over `num_slots` slots).

  The last batch is padded with copies of its first prompt, so every call has the same shape (the engine caps
  the copies' completions at one token).
  With `mesh` and `rules` the sampler runs sharded (`sampling.sample`); every process provides its
  rows of each batch and gets all completions back (the engine in one process takes any `batch_size`).

  Returns:
    `(texts, lengths)`: per prompt its list of completions, and token lengths `[len(prompts), num_samples]`.
  """
  texts, lengths = [], []
  for start in range(0, len(prompts), batch_size):
    chunk = list(prompts[start:start + batch_size])
    real = len(chunk)
    chunk += [chunk[0]] * (batch_size - real)
    tokens, mask, _ = batch_lib.encode_prompts(tokenizer, chunk, max_prompt_len)
    if mesh is not None and not (engine and jax.process_count() == 1):
      batch = partitioning.batch_sharding(mesh, rules)
      tokens, mask = distributed.global_batch(
          jax.tree.map(lambda x: x[distributed.process_rows(len(x), batch)], (tokens, mask)), batch)
    common = dict(num_samples=num_samples, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                  top_p=top_p, greedy=greedy, mesh=mesh, rules=rules)
    if engine:
      caps = np.where(np.arange(batch_size * num_samples) < real * num_samples, max_new_tokens, 1)
      out = rollout_engine.generate(params, config, tokens, mask, jax.random.fold_in(key, start),
                                    num_slots=num_slots, max_lengths=caps, **common)
    else:
      out = sampling.sample(params, config, tokens, mask, jax.random.fold_in(key, start), prompt_chunk=prompt_chunk,
                            **common)
    out = distributed.all_gather(out)
    decoded = decode(tokenizer, out)
    for i in range(real):
      texts.append(decoded[i * num_samples:(i + 1) * num_samples])
    lengths.append(np.asarray(out.lengths).reshape(batch_size, num_samples)[:real])
  return texts, np.concatenate(lengths, axis=0)
