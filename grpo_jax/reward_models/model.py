"""Outcome and process reward models: the policy backbone with a scalar head.

r_φ(q, o_≤t) = w · h_t + b, with h_t the final-normed hidden state of token t of prompt q and
completion o (`grpo_jax.models.scalar_apply`); σ(r_φ) is the probability that the solution (ORM,
read at its last token) or the solution so far (PRM, read at the end token of each step) is
correct (DeepSeekMath §4.1.2-4.1.3, arXiv 2402.03300; Lightman et al., arXiv 2305.20050).

Kinds: "orm" (outcome labels, read at the last token), "prm" (step labels, read at every step end)
and "orm_steps": outcome labels, read at every step end and pooled by a noisy-AND, P(correct) =
Π_j σ(s_j) (`grpo_jax.losses.noisy_and_outcome_loss`), an outcome reward model whose structure
lets it check steps.

Scores ("head" or "loglik"): "head" is the above. "loglik" adds the backbone's own log-likelihood of the
completion (`outcome_logits`),

  s_i = pooled head logit_i + α · Σ_{t ∈ completion_i} log p_backbone(o_t | q, o_<t),

α a trained scalar: a backbone stronger than the policy spots the policy's slips as unlikely tokens, which a
head on the hidden state ranks no better than chance within a problem (docs/reward_models.md).

Params are those of `init_scalar_params`: {"backbone": <policy params without lm_head>,
"head": {"kernel": [E], "bias": []}}, plus "alpha": [] for the "loglik" score. Scores are logits; `jax.nn.sigmoid` makes them
probabilities. Every function is pure over arrays and jits with `config` static.
"""

import chex
import jax
import jax.numpy as jnp

from grpo_jax import logprobs
from grpo_jax.losses import reward as reward_losses
from grpo_jax.models import heads
from grpo_jax.models.config import ModelConfig

Params = heads.Params
KINDS = ("orm", "orm_steps", "prm")
OUTCOME_KINDS = ("orm", "orm_steps")  # trained on outcome labels only
STEP_KINDS = ("orm_steps", "prm")  # scored at every step end
SCORES = ("head", "loglik")


def init_reward_params(policy_params: Params, config: ModelConfig, key: jax.Array, *,
                       head_scale: float = 0.0, score: str = "head", alpha: float = 1.0) -> Params:
  """A reward model started from a policy: its backbone copied, a fresh scalar head.

  Args:
    policy_params: the policy (e.g. the SFT model) params; `lm_head` is dropped.
    config: its ModelConfig.
    key: PRNG key of the head.
    head_scale: the head kernel is normal(0, head_scale / sqrt(E)); the default 0 starts every
      score at the bias, 0, so σ = 1/2 and the BCE is log 2 before training.
    score: "head", or "loglik" (adds "alpha", started at `alpha`; needs a backbone whose output layer is
      its embedding table, `tie_word_embeddings`, since the reward model keeps no lm_head).

  Returns:
    {"backbone": ..., "head": {"kernel": [E], "bias": []}} (and "alpha": [] for "loglik").
  """
  if score not in SCORES:
    raise ValueError(f"unknown reward model score {score!r}; expected one of {SCORES}")
  if score == "loglik" and not config.tie_word_embeddings:
    raise ValueError("the loglik score needs a backbone with tied word embeddings (the reward model keeps no lm_head)")
  params = heads.init_scalar_params(config, key, backbone=policy_params, head_scale=head_scale)
  if score == "loglik":
    params["alpha"] = jnp.asarray(alpha, jnp.float32)
  return params


def score_of(params: Params) -> str:
  """"loglik" if the params carry α, else "head"."""
  return "loglik" if "alpha" in params else "head"


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


def completion_loglik(params: Params, config: ModelConfig, tokens: jax.Array, attention_mask: jax.Array,
                      completion_start: jax.Array) -> jax.Array:
  """`[N]` Σ_{t ≥ start_i, mask} log p_backbone(tokens_t | tokens_<t): the backbone's log-likelihood of each
  completion (`logprobs.token_logprobs` of the backbone as a language model, its output layer the embeddings).

  Args:
    completion_start: `[N]` int position of each completion's first token (the padded prompt length).
  """
  chex.assert_rank([tokens, attention_mask], 2)
  logp = logprobs.token_logprobs(params["backbone"], config, tokens, attention_mask)
  columns = jnp.arange(tokens.shape[1])[None, :]
  completion = jnp.asarray(attention_mask, bool) & (columns >= jnp.asarray(completion_start)[:, None])
  return jnp.sum(jnp.where(completion, logp, 0.0), axis=1)


def outcome_logits(params: Params, config: ModelConfig, tokens: jax.Array, attention_mask: jax.Array,
                   step_end_positions: jax.Array, step_mask: jax.Array, completion_start: jax.Array, *,
                   kind: str) -> jax.Array:
  """`[N]` outcome logit of an outcome reward model, σ(s_i) = P(completion i is right):

    s_i = pooled_i + α · completion_loglik_i   ("loglik" score; "head": s_i = pooled_i),

  pooled_i the "orm" score at its one scored position (`step_end_positions[:, 0]`, its last token) or the
  "orm_steps" noisy-AND Π_j σ(s_ij) over the step ends as a logit (`losses.noisy_and_logits`).
  """
  if kind not in OUTCOME_KINDS:
    raise ValueError(f"no outcome logit for reward model kind {kind!r}; expected one of {OUTCOME_KINDS}")
  scores = step_scores(params, config, tokens, attention_mask, step_end_positions, step_mask)
  pooled = scores[:, 0] if kind == "orm" else reward_losses.noisy_and_logits(scores, step_mask)
  if "alpha" in params:
    pooled = pooled + params["alpha"] * completion_loglik(params, config, tokens, attention_mask, completion_start)
  return pooled
