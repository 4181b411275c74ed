"""Outcome and process reward models: the policy backbone with a scalar head.

r_φ(q, o_≤t) = w · h_t + b, with h_t the final-normed hidden state of token t of prompt q and
completion o (`grpo_jax.models.scalar_apply`); σ(r_φ) is the probability that the solution (ORM,
read at its last token) or the solution so far (PRM, read at the end token of each step) is
correct (DeepSeekMath §4.1.2-4.1.3, arXiv 2402.03300; Lightman et al., arXiv 2305.20050).

Kinds: "orm" (outcome labels, read at the last token), "prm" (step labels, read at every step end)
and "orm_steps": outcome labels, read at every step end and pooled by a noisy-AND, P(correct) =
Π_j σ(s_j) (`grpo_jax.losses.noisy_and_outcome_loss`), an outcome reward model whose structure
lets it check steps.

Params are those of `init_scalar_params`: {"backbone": <policy params without lm_head>,
"head": {"kernel": [E], "bias": []}}. Scores are logits; `jax.nn.sigmoid` makes them
probabilities. Every function is pure over arrays and jits with `config` static.
"""

import chex
import jax
import jax.numpy as jnp

from grpo_jax.models import heads
from grpo_jax.models.config import ModelConfig

Params = heads.Params
KINDS = ("orm", "orm_steps", "prm")
OUTCOME_KINDS = ("orm", "orm_steps")  # trained on outcome labels only
STEP_KINDS = ("orm_steps", "prm")  # scored at every step end


def init_reward_params(policy_params: Params, config: ModelConfig, key: jax.Array, *,
                       head_scale: float = 0.0) -> Params:
  """A reward model started from a policy: its backbone copied, a fresh scalar head.

  Args:
    policy_params: the policy (e.g. the SFT model) params; `lm_head` is dropped.
    config: its ModelConfig.
    key: PRNG key of the head.
    head_scale: the head kernel is normal(0, head_scale / sqrt(E)); the default 0 starts every
      score at the bias, 0, so σ = 1/2 and the BCE is log 2 before training.

  Returns:
    {"backbone": ..., "head": {"kernel": [E], "bias": []}}.
  """
  return heads.init_scalar_params(config, key, backbone=policy_params, head_scale=head_scale)


def last_token_index(attention_mask: jax.Array) -> jax.Array:
  """`[N]` int32 index of the last True of each row of `[N, L]` (0 for an all-False row)."""
  chex.assert_rank(attention_mask, 2)
  length = attention_mask.shape[1]
  flipped = jnp.argmax(jnp.flip(jnp.asarray(attention_mask, bool), axis=1), axis=1)
  return jnp.where(jnp.any(attention_mask, axis=1), length - 1 - flipped, 0).astype(jnp.int32)


def token_scores(params: Params, config: ModelConfig, tokens: jax.Array, attention_mask: jax.Array) -> jax.Array:
  """`[N, L]` float32 score r_φ(q, o_≤t) at every token (0 at padding)."""
  return heads.scalar_apply(params, config, tokens, attention_mask=attention_mask)


def outcome_scores(params: Params, config: ModelConfig, tokens: jax.Array, attention_mask: jax.Array,
                   last_index: jax.Array | None = None) -> jax.Array:
  """ORM scores: s_i = r_φ(q_i, o_i) read at the last token of completion i.

  Args:
    params: reward-model params.
    config: the backbone's ModelConfig (static under jit).
    tokens: `[N, L]` ids, left-padded prompt then right-padded completion.
    attention_mask: `[N, L]` bool, False at padding.
    last_index: `[N]` int position of the scored token (the completion's end token, or its
      last token when truncated); default `last_token_index(attention_mask)`.

  Returns:
    `[N]` float32 logits; σ(s_i) = P(completion i is correct).
  """
  chex.assert_rank([tokens, attention_mask], 2)
  if last_index is None:
    last_index = last_token_index(attention_mask)
  chex.assert_rank(last_index, 1)
  values = token_scores(params, config, tokens, attention_mask)
  return jnp.take_along_axis(values, jnp.asarray(last_index, jnp.int32)[:, None], axis=1)[:, 0]


def step_scores(params: Params, config: ModelConfig, tokens: jax.Array, attention_mask: jax.Array,
                step_end_positions: jax.Array, step_mask: jax.Array) -> jax.Array:
  """PRM scores: s_ij = r_φ(q_i, o_i[:index(j)]) at the end token index(j) of step j.

  Args:
    params: reward-model params.
    config: the backbone's ModelConfig (static under jit).
    tokens: `[N, L]` ids, left-padded prompt then right-padded completion.
    attention_mask: `[N, L]` bool.
    step_end_positions: `[N, K]` int positions in `tokens` of the steps' end tokens (for a
      completion-relative index, add the padded prompt length).
    step_mask: `[N, K]` true for real steps.

  Returns:
    `[N, K]` float32 logits, 0 where `step_mask` is False.
  """
  chex.assert_rank([tokens, attention_mask, step_end_positions, step_mask], 2)
  chex.assert_equal_shape([step_end_positions, step_mask])
  values = token_scores(params, config, tokens, attention_mask)
  index = jnp.clip(jnp.asarray(step_end_positions, jnp.int32), 0, tokens.shape[1] - 1)
  scores = jnp.take_along_axis(values, index, axis=1)
  return jnp.where(jnp.asarray(step_mask, bool), scores, 0.0)
