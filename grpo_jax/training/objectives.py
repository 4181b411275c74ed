"""Training objectives beyond GRPO and SFT: PPO with a critic, the paradigm's coefficient loss, DPO.

Each is a pure function `(params, batch, totals, **static) -> (loss, metrics)` for
`make_train_step`; `totals` carries the minibatch's sequence and token counts so the losses
normalise globally and gradient accumulation is exact. Bind the static keywords with `bind`.
"""

from typing import Any

import jax
import jax.numpy as jnp

from grpo_jax import length_buckets
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import losses
from grpo_jax.models import ModelConfig
from grpo_jax.models import heads
from grpo_jax.training import update as update_lib

Params = Any


def token_values(value_params: Params, config: ModelConfig, tokens: jax.Array, attention_mask: jax.Array) -> jax.Array:
  """V(s_t) aligned with tokens, `[N, L]` float32: the critic's value of the state token t is drawn from.

  The scalar head reads position t − 1 (the context o_<t), the same position whose logits give
  log π(o_t), so values, log-probs and per-token rewards line up index for index.
  """
  v = heads.scalar_apply(value_params, config, tokens, attention_mask=attention_mask)
  return jnp.concatenate([jnp.zeros_like(v[:, :1]), v[:, :-1]], axis=1)


def prefixed_completion_values(value_params: Params, config: ModelConfig, prefix: logprobs_lib.PromptPrefix,
                               completions: jax.Array, completion_mask: jax.Array) -> jax.Array:
  """V(s_t) [N, T] of completions after their own prompt's `PromptPrefix` row of the value backbone (in its blocks
  with `prefix.blocks`): `token_values`' completion columns, the head on the hidden state of the position before
  each token (the prompt's last for token 0), up to float rounding; 0 where the token or that position is padding
  (`token_values` leaves the head's value of the last token in the column after a completion's end)."""
  head = lambda h, tokens, valid: jnp.where(valid, heads.scalar_head(value_params["head"], h), 0.0)  # noqa: E731
  return logprobs_lib.prefixed_completion_readout(value_params["backbone"], config, prefix, completions,
                                                  completion_mask, head)


def bucketed_completion_values(value_params: Params, config: ModelConfig, prompt_tokens: jax.Array,
                               prompt_mask: jax.Array, completions: jax.Array, completion_mask: jax.Array, *,
                               group_size: int, buckets: length_buckets.Buckets) -> jax.Array:
  """`prefixed_completion_values` [N, T] of the N = B·G completions of B prompts (groups of G), in length-sorted
  micro-batches (`logprobs.bucketed_completions`): each prompt once through the value backbone, each micro-batch in
  the fewest blocks of `buckets.block` columns that hold it."""
  return logprobs_lib.bucketed_completions(
      value_params["backbone"], config, prompt_tokens, prompt_mask, completions, completion_mask,
      group_size=group_size, buckets=buckets,
      run=lambda own, tokens, mask: prefixed_completion_values(value_params, config, own, tokens, mask))


def ppo_prefill(params: Params, config: ModelConfig, prompt_tokens: jax.Array, prompt_mask: jax.Array) -> dict:
  """The prompts' `PromptPrefix` of both PPO models, `{"policy", "value"}` (the length-bucketed update:
  `update.BucketedRows.prefill`)."""
  return {"policy": logprobs_lib.prefill(params["policy"], config, prompt_tokens, prompt_mask),
          "value": logprobs_lib.prefill(params["value"]["backbone"], config, prompt_tokens, prompt_mask)}


def ppo_objective(params: Params, batch, totals: dict, *, config: ModelConfig, loss_kwargs: dict,
                  value_clip: float | None = 0.2, value_coef: float = 1.0, chunk_size: int = 128,
                  temperature: float = 1.0, correction_kwargs: dict | None = None, prompt_len: int | None = None,
                  prefix: dict | None = None):
  """PPO's actor and critic losses (DeepSeekMath eq. 1; arXiv 2402.03300 §4.1, 1707.06347).

    L = −J_PPO(θ) + c_v · token-mean ½ max((V_ψ − R)², (clip(V_ψ, V_old ± ε_v) − R)²)

  `params` is `{"policy": ..., "value": ...}`: two pytrees, each receiving only its own term's
  gradient. The KL to the reference lives in the rewards (`losses.kl_penalized_rewards`), not here.
  `batch` is a `PPOBatch`; `loss_kwargs` go to `losses.ppo_loss`. The rollout-trainer mismatch and its correction
  (`correction_kwargs`) as in `update.grpo_objective`.

  With `prefix` (`ppo_prefill`'s, the length-bucketed update: `update.bucketed_gradients`) only the completion
  columns after `prompt_len` run, against each model's prompt prefix (the policy's log-probs as in
  `update.policy_logprobs`, the values as `prefixed_completion_values`); the loss is the same up to float rounding.
  """
  if prefix is None:
    logp, entropy = logprobs_lib.token_logprobs(params["policy"], config, batch.tokens, batch.attention_mask,
                                                chunk_size=chunk_size, return_entropy=True, temperature=temperature)
    values = token_values(params["value"], config, batch.tokens, batch.attention_mask)
  else:
    p = prompt_len
    logp, entropy = update_lib.policy_logprobs(params["policy"], batch, config=config, chunk_size=chunk_size,
                                               temperature=temperature, prompt_len=p, prefix=prefix["policy"])
    values = jnp.pad(prefixed_completion_values(params["value"], config, prefix["value"], batch.tokens[:, p:],
                                                batch.attention_mask[:, p:]), ((0, 0), (p, 0)))
  weights, mismatch = update_lib.rollout_correction(logp, batch.old_logp, batch, **(correction_kwargs or {}))
  pg_loss, metrics = losses.ppo_loss(logp, batch.old_logp, batch.advantages, batch.loss_mask,
                                     num_sequences=totals["num_sequences"], num_tokens=totals["num_tokens"],
                                     rollout_weights=weights, **loss_kwargs)
  metrics.update(mismatch)
  per_token = losses.value_loss(values, batch.old_values, batch.returns, batch.loss_mask, clip=value_clip)
  vf_loss = losses.aggregate(per_token, batch.loss_mask, "token-mean", num_tokens=totals["num_tokens"])
  loss = pg_loss + value_coef * vf_loss
  for name in ("kl", "kl_loss"):  # PPO's KL is in the rewards; the sampling side logs it
    metrics.pop(name, None)
  sg = jax.lax.stop_gradient
  metrics.update(
      loss=sg(loss), pg_loss=sg(pg_loss),
      value_loss=sg(losses.masked_mean(per_token, batch.loss_mask)),  # this micro-batch's token mean
      value_mean=sg(losses.masked_mean(values, batch.loss_mask)),
      entropy=sg(losses.masked_mean(entropy, batch.loss_mask)))
  if value_clip is not None:
    clipped = jnp.abs(values - batch.old_values) > value_clip
    metrics["value_clip_frac"] = sg(losses.masked_mean(clipped.astype(jnp.float32), batch.loss_mask))
  return loss, metrics


def paradigm_objective(params: Params, batch, totals: dict, *, config: ModelConfig,
                       aggregation: str = "seq-mean-token-mean", chunk_size: int = 128, temperature: float = 1.0):
  """The unified paradigm's loss (DeepSeekMath §5.2.1, Table 10) with GC = `batch.advantages`:

    −(1/N) Σ_i (1/|o_i|) Σ_t GC(q, o_i, t) log π_θ(o_{i,t} | q, o_{i,<t}),

  so SFT (GC = 1 on human data), RFT and Online RFT (GC = 1 on correct samples, else 0) are one
  objective that differs only in the batch it is given.
  """
  logp = logprobs_lib.token_logprobs(params, config, batch.tokens, batch.attention_mask, chunk_size=chunk_size,
                                     temperature=temperature)
  loss = losses.paradigm_loss(logp, batch.advantages, batch.loss_mask, aggregation,
                              num_sequences=totals["num_sequences"], num_tokens=totals["num_tokens"])
  selected = jnp.any(batch.loss_mask & (batch.advantages != 0), axis=-1).astype(jnp.float32)
  return loss, {"loss": jax.lax.stop_gradient(loss), "gc_nonzero_frac": jnp.mean(selected),
                "nll": jax.lax.stop_gradient(-losses.masked_mean(logp, batch.loss_mask))}


def dpo_objective(params: Params, batch, totals: dict, *, config: ModelConfig, beta: float = 0.1,
                  nll_coef: float = 0.0, chunk_size: int = 128):
  """DPO (arXiv 2305.18290) over a `Batch` of interleaved pairs: rows 2k (o⁺) and 2k + 1 (o⁻); with `nll_coef`
  α > 0, plus α times o⁺'s length-normalised NLL (Iterative RPO, arXiv 2404.19733; `losses.dpo_loss`).

  `batch.ref_logp` holds the frozen reference's token log-probs. The pair mean is taken over the
  whole minibatch (`totals["num_sequences"] / 2` pairs), so accumulation over micro-batches is exact.
  """
  logp = logprobs_lib.token_logprobs(params, config, batch.tokens, batch.attention_mask, chunk_size=chunk_size)
  mask = batch.loss_mask
  seq = jnp.sum(jnp.where(mask, logp, 0.0), axis=-1)
  ref = jnp.sum(jnp.where(mask, batch.ref_logp, 0.0), axis=-1)
  length = jnp.sum(mask, axis=-1).astype(jnp.float32)
  loss, metrics = losses.dpo_loss(seq[0::2], seq[1::2], ref[0::2], ref[1::2], beta, nll_coef=nll_coef,
                                  chosen_length=length[0::2])
  loss = loss * seq.shape[0] / totals["num_sequences"]  # micro-batch pair mean -> share of the global mean
  metrics["loss"] = jax.lax.stop_gradient(loss)
  return loss, metrics
