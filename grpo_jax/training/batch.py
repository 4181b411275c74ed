"""From prompts to a training batch: tokenising, left padding, and the `Batch` pytree."""

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.sampling import SampleOutput


class Batch(NamedTuple):
  """A training batch, every array `[N, L]` over prompt + completion (left-padded prompt).

  `loss_mask` marks the tokens the loss trains on (completion tokens); `advantages` is
  per token (outcome-supervision advantages are broadcast over the completion). `sampler_logp`
  holds the sampler's own log-probs of the tokens (`SampleOutput.logprobs`), which the trainer's
  are checked against (`losses.mismatch_metrics`); None in batches not built from samples.
  """
  tokens: jax.Array
  attention_mask: jax.Array
  loss_mask: jax.Array
  old_logp: jax.Array
  ref_logp: jax.Array
  advantages: jax.Array
  sampler_logp: jax.Array | None = None


def pad_left(sequences: Sequence[Sequence[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads (and left-truncates) token lists to `length`: `(tokens, mask)` int32/bool `[B, length]`."""
  tokens = np.full((len(sequences), length), pad_id, np.int32)
  mask = np.zeros((len(sequences), length), bool)
  for i, seq in enumerate(sequences):
    seq = list(seq)[-length:]
    if seq:
      tokens[i, length - len(seq):] = seq
      mask[i, length - len(seq):] = True
  return tokens, mask


def encode_prompts(tokenizer, prompts: Sequence[str], length: int) -> tuple[np.ndarray, np.ndarray, int]:
  """Tokenises prompts without special tokens and left-pads them; returns `(tokens, mask, num_truncated)`."""
  ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
  truncated = sum(len(x) > length for x in ids)
  empty = [i for i, x in enumerate(ids) if not x]
  if empty:
    raise ValueError(f"prompt {empty[0]} tokenises to nothing: {prompts[empty[0]]!r}")
  tokens, mask = pad_left(ids, length, tokenizer.pad_token_id or 0)
  return tokens, mask, truncated


def batch_from_samples(samples: SampleOutput, loss_mask: jax.Array, old_logp: jax.Array, ref_logp: jax.Array,
                       advantages: jax.Array) -> Batch:
  """Assembles a `Batch` from sampler output and per-completion-token arrays `[N, T]`.

  `advantages` may be `[N]` (broadcast over the completion) or `[N, T]`. `sampler_logp` is the
  sampler's `samples.logprobs`.
  """
  prompt_zeros = jnp.zeros(samples.prompt_tokens.shape, jnp.float32)
  if advantages.ndim == 1:
    advantages = jnp.broadcast_to(advantages[:, None], samples.tokens.shape)

  def full(x):
    return jnp.concatenate([prompt_zeros, x.astype(jnp.float32)], axis=1)

  return Batch(
      tokens=jnp.concatenate([samples.prompt_tokens, samples.tokens], axis=1),
      attention_mask=jnp.concatenate([samples.prompt_mask, samples.mask], axis=1),
      loss_mask=jnp.concatenate([jnp.zeros(samples.prompt_mask.shape, bool), loss_mask.astype(bool)], axis=1),
      old_logp=full(old_logp), ref_logp=full(ref_logp), advantages=full(advantages * loss_mask),
      sampler_logp=full(jnp.asarray(samples.logprobs)))


def supervised_batch(prompt_ids: Sequence[Sequence[int]], target_ids: Sequence[Sequence[int]], prompt_len: int,
                     target_len: int, pad_id: int) -> Batch:
  """A teacher-forcing `Batch`: left-padded prompts, right-padded targets, the loss on the targets.

  Targets longer than `target_len` are cut (their end token is lost); other fields are zero.
  """
  prompt, prompt_mask = pad_left(prompt_ids, prompt_len, pad_id)
  target = np.full((len(target_ids), target_len), pad_id, np.int32)
  target_mask = np.zeros((len(target_ids), target_len), bool)
  for i, ids in enumerate(target_ids):
    ids = list(ids)[:target_len]
    target[i, :len(ids)] = ids
    target_mask[i, :len(ids)] = True
  zeros = np.zeros((len(target_ids), prompt_len + target_len), np.float32)
  return Batch(tokens=jnp.asarray(np.concatenate([prompt, target], 1)),
               attention_mask=jnp.asarray(np.concatenate([prompt_mask, target_mask], 1)),
               loss_mask=jnp.asarray(np.concatenate([np.zeros_like(prompt_mask), target_mask], 1)),
               old_logp=jnp.asarray(zeros), ref_logp=jnp.asarray(zeros), advantages=jnp.asarray(zeros))


class PPOBatch(NamedTuple):
  """A PPO training batch: a `Batch`'s fields plus the critic's targets, every array `[N, L]`.

  `advantages` are GAE advantages per token, `old_values` V_ψ at sampling time (aligned with
  the token they precede: the value of the state the token is generated from), `returns` the
  GAE returns R_t = A_t + V_t. `sampler_logp` as in `Batch`.
  """
  tokens: jax.Array
  attention_mask: jax.Array
  loss_mask: jax.Array
  old_logp: jax.Array
  ref_logp: jax.Array
  advantages: jax.Array
  old_values: jax.Array
  returns: jax.Array
  sampler_logp: jax.Array | None = None
