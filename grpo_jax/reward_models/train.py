"""Training and scoring of reward models: the objective, the jitted step, a resumable fit loop.

  step = make_reward_train_step(config, optimizer, kind="prm")
  state = training.init_train_state(init_reward_params(policy, config, key), optimizer)
  state, history = fit(state, step, data, steps=300, batch_size=64, seed=0)
  metrics = evaluate(state.params, config, held_out, kind="prm")

The step is `grpo_jax.training.make_train_step` with `reward_objective`; the micro-batch totals
count the scored positions (`RewardData.loss_mask`), so gradient accumulation stays exact for the
BCE losses.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax.losses import reward as reward_losses
from grpo_jax.models.config import ModelConfig
from grpo_jax.reward_models import adapters
from grpo_jax.reward_models import metrics as metrics_lib
from grpo_jax.reward_models import model
from grpo_jax.reward_models.data import RewardData, num_rows, take
from grpo_jax.train_state import TrainState
from grpo_jax.training import update

LOSSES = ("bce", "pairwise")


def pooled_outcome_logits(scores, loss_mask, kind: str):
  """`[N]` outcome logits of an outcome reward model from the `[N, K]` scores of `step_scores`: ORM its one
  score, "orm_steps" the noisy-AND over the step ends (`losses.noisy_and_logits`)."""
  if kind == "orm":
    return scores[:, 0]
  if kind == "orm_steps":
    return reward_losses.noisy_and_logits(scores, loss_mask)
  raise ValueError(f"no pooled outcome logit for reward model kind {kind!r}; expected one of {model.OUTCOME_KINDS}")


def _starts(tokens, prompt_len: int):
  """`[N]` the completions' first position: the padded prompt length, which the "loglik" score needs."""
  if prompt_len < 1:
    raise ValueError("a reward model with the loglik score needs prompt_len (the padded prompt length) >= 1")
  return jnp.full((tokens.shape[0],), prompt_len, jnp.int32)


def reward_objective(params, batch: RewardData, totals: dict, *, config: ModelConfig, kind: str, loss: str = "bce",
                     pairs_within_problem: bool = True, prompt_len: int = 0, freeze_backbone: bool = False):
  """The reward-model loss of a (micro-)batch of `RewardData`.

  "bce": `outcome_bce_loss` on the last token (ORM), `step_bce_loss` on every segment end (PRM),
  normalised by the minibatch's count of scored positions, or `noisy_and_outcome_loss` on the
  segment ends ("orm_steps"), normalised by its count of completions. "pairwise" (ORM, "orm_steps"):
  the Bradley-Terry loss over every (right, wrong) pair of completions of the micro-batch
  (`within_problem_pairwise_loss`: of one problem when `pairs_within_problem`) on the outcome logit
  (`pooled_outcome_logits`), normalised by the micro-batch's pair count.

  With the "loglik" score (params with "alpha") both losses apply to `model.outcome_logits` (the pooled
  logit + α · the completion's backbone log-likelihood; `prompt_len` the padded prompt length); BCE then on
  that one logit per completion. `freeze_backbone`: no gradient reaches the backbone. With adapters
  (`config.lora_rank` > 0, `adapters.add`) no gradient reaches the backbone's base weights.
  """
  if freeze_backbone:
    params = {**params, "backbone": jax.lax.stop_gradient(params["backbone"])}
  elif config.lora_rank:
    params = adapters.stop_base_gradient(params)
  if "alpha" in params:
    if kind not in model.OUTCOME_KINDS:
      raise ValueError(f"the loglik score is for outcome reward models, not kind {kind!r}")
    logits = model.outcome_logits(params, config, batch.tokens, batch.attention_mask, batch.positions,
                                  batch.loss_mask, _starts(batch.tokens, prompt_len), kind=kind)
    valid = jnp.any(batch.loss_mask, axis=1)
    if loss == "bce":
      return reward_losses.outcome_bce_loss(logits, batch.outcome, valid, num_examples=totals["num_sequences"])
    groups = batch.group if pairs_within_problem else jnp.zeros_like(batch.group)
    return reward_losses.within_problem_pairwise_loss(logits, batch.outcome, groups, valid)
  scores = model.step_scores(params, config, batch.tokens, batch.attention_mask, batch.positions, batch.loss_mask)
  if loss == "bce":
    if kind == "orm":
      return reward_losses.outcome_bce_loss(scores[:, 0], batch.labels[:, 0], batch.loss_mask[:, 0],
                                            num_examples=totals["num_tokens"])
    if kind == "orm_steps":
      return reward_losses.noisy_and_outcome_loss(scores, batch.labels[:, 0], batch.loss_mask,
                                                  num_examples=totals["num_sequences"])
    return reward_losses.step_bce_loss(scores, batch.labels, batch.loss_mask, num_steps=totals["num_tokens"])
  if loss != "pairwise" or kind not in model.OUTCOME_KINDS:
    raise ValueError(f"unknown reward loss {loss!r} for kind {kind!r}; the pairwise loss is for outcome kinds")
  valid = jnp.any(batch.loss_mask, axis=1)
  groups = batch.group if pairs_within_problem else jnp.zeros_like(batch.group)
  return reward_losses.within_problem_pairwise_loss(pooled_outcome_logits(scores, batch.loss_mask, kind),
                                                    batch.outcome, groups, valid)


def make_reward_train_step(config: ModelConfig, optimizer: optax.GradientTransformation, *, kind: str,
                           loss: str = "bce", num_micro_batches: int = 1, pairs_within_problem: bool = True,
                           donate: bool = True, prompt_len: int = 0, freeze_backbone: bool = False):
  """Jitted `step(TrainState, RewardData batch) -> (TrainState, metrics)` of a reward model (`prompt_len`,
  `freeze_backbone`: see `reward_objective`; pair a frozen backbone with `frozen_backbone_optimizer`, adapters
  (`config.lora_rank` > 0) with `adapters.optimizer`)."""
  if kind not in model.KINDS:
    raise ValueError(f"unknown reward model kind {kind!r}; expected one of {model.KINDS}")
  if loss not in LOSSES or (loss == "pairwise" and kind not in model.OUTCOME_KINDS):
    raise ValueError(f"reward loss {loss!r} is not available for kind {kind!r} (bce: all; pairwise: "
                     f"{', '.join(model.OUTCOME_KINDS)})")
  objective = update.bind(reward_objective, config=config, kind=kind, loss=loss,
                          pairs_within_problem=pairs_within_problem, prompt_len=prompt_len,
                          freeze_backbone=freeze_backbone)
  return update.make_train_step(objective, optimizer, num_micro_batches, donate=donate)


def frozen_backbone_optimizer(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
  """`optimizer` on everything but "backbone", which never moves (no update, no weight decay, no moments)."""
  def labels(params):
    return {name: jax.tree.map(lambda _: "frozen" if name == "backbone" else "trained", value)
            for name, value in params.items()}
  return optax.multi_transform({"trained": optimizer, "frozen": optax.set_to_zero()}, labels)


def batch_indices(num_rows_: int, batch_size: int, step: int, seed: int, block: int = 1) -> np.ndarray:
  """Row indices of minibatch `step` (0-based): positions [step·B, (step+1)·B) of an endless stream
  of per-epoch permutations of blocks of `block` consecutive rows (`default_rng([seed, epoch])`).

  `block` = G keeps the G samples of a prompt (prompt-major rows) together, which the pairwise
  loss needs. Depends only on its arguments, so a resumed run draws the same batches.
  """
  if num_rows_ < 1 or block < 1 or num_rows_ % block:
    raise ValueError(f"cannot draw blocks of {block} rows from {num_rows_} reward-model training rows")
  pos = np.arange(step * batch_size, (step + 1) * batch_size)
  epochs, offsets = np.divmod(pos, num_rows_)
  out = np.empty(batch_size, np.int64)
  for epoch in np.unique(epochs):
    blocks = np.random.default_rng([seed, int(epoch)]).permutation(num_rows_ // block)
    order = (blocks[:, None] * block + np.arange(block)[None]).reshape(-1)
    out[epochs == epoch] = order[offsets[epochs == epoch]]
  return out


def fit(state: TrainState, train_step, data: RewardData, *, steps: int, batch_size: int, seed: int,
        start: int = 0, block: int = 1, log_every: int = 0, log=None):
  """Runs `steps` optimiser steps from step `start` on minibatches drawn by `batch_indices`
  (`block`: rows kept together, e.g. the G samples of a prompt for the pairwise loss).

  Returns:
    (state, history): history a list of (step, metrics as floats) every `log_every` steps and at
    the last step; `log(step, metrics)` is called with each entry.

  Raises:
    FloatingPointError: on a non-finite loss.
  """
  history = []
  n = num_rows(data)
  for step in range(start, start + steps):
    batch = jax.tree.map(jnp.asarray, take(data, batch_indices(n, batch_size, step, seed, block)))
    state, metrics = train_step(state, batch)
    last = step == start + steps - 1
    if (log_every and (step + 1) % log_every == 0) or last:
      values = {k: float(v) for k, v in metrics.items()}
      if not np.isfinite(values["loss"]):
        raise FloatingPointError(f"reward model step {step + 1}: non-finite loss")
      history.append((step + 1, values))
      if log is not None:
        log(step + 1, values)
  return state, history


@functools.partial(jax.jit, static_argnums=1)
def _scores(params, config, tokens, attention_mask, positions, mask):
  return model.step_scores(params, config, tokens, attention_mask, positions, mask)


@functools.partial(jax.jit, static_argnums=1)
def _loglik(params, config, tokens, attention_mask, starts):
  return model.completion_loglik(params, config, tokens, attention_mask, starts)


def completion_logliks(params, config: ModelConfig, data: RewardData, *, prompt_len: int,
                       batch_size: int = 256) -> np.ndarray:
  """`[N]` `model.completion_loglik` of every row of `data`, in fixed-shape batches (`score`)."""
  n = num_rows(data)
  out = []
  for start in range(0, n, batch_size):
    b = take(data, np.arange(start, start + batch_size) % n)
    ll = _loglik(params, config, jnp.asarray(b.tokens), jnp.asarray(b.attention_mask),
                 _starts(b.tokens, prompt_len))
    out.append(np.asarray(ll)[:min(batch_size, n - start)])
  return np.concatenate(out, axis=0)


def score(params, config: ModelConfig, data: RewardData, *, batch_size: int = 256) -> np.ndarray:
  """`[N, K]` logits at every scored position of `data` (0 where `loss_mask` is False), in fixed-shape
  batches (the last one padded), so scoring compiles once."""
  n = num_rows(data)
  out = []
  for start in range(0, n, batch_size):
    index = np.arange(start, start + batch_size) % n
    b = take(data, index)
    s = _scores(params, config, jnp.asarray(b.tokens), jnp.asarray(b.attention_mask), jnp.asarray(b.positions),
                jnp.asarray(b.loss_mask))
    out.append(np.asarray(s)[:min(batch_size, n - start)])
  return np.concatenate(out, axis=0)


def noisy_and_from_steps(step_logits: np.ndarray, step_mask: np.ndarray) -> np.ndarray:
  """An "orm_steps" model's outcome logit (`losses.noisy_and_logits`); -inf for a completion without
  segments."""
  pooled = np.asarray(reward_losses.noisy_and_logits(jnp.asarray(step_logits), jnp.asarray(step_mask)))
  return np.where(np.any(step_mask, axis=1), pooled, -np.inf)


def outcome_from_steps(step_logits: np.ndarray, step_mask: np.ndarray) -> np.ndarray:
  """A PRM's outcome score: the minimum step logit, σ(min s) = min σ(s) (Math-Shepherd's aggregate);
  -inf for a completion without segments."""
  lowest = np.min(np.where(step_mask, step_logits, np.inf), axis=1)
  return np.where(np.any(step_mask, axis=1), lowest, -np.inf)


def evaluate(params, config: ModelConfig, data: RewardData, *, kind: str, batch_size: int = 256,
             step_labels: np.ndarray | None = None, prompt_len: int = 0) -> dict[str, float]:
  """Held-out accuracy and AUC of a reward model on labelled rows.

  "outcome/*": the completion-level verdict against the final answer's correctness (ORM: its score;
  "orm_steps": its noisy-AND over the step scores; PRM: its minimum step score), with
  "outcome/group_auc" its AUC within problems (`group_auc`) and "outcome/group_pairs" the number
  of (right, wrong) pairs behind it. PRM also "step/*": every segment score against its step label;
  "orm_steps" the same against `step_labels` (`[N, K]`, e.g. exact labels it never trained on) if given.
  The "loglik" score (params with "alpha", `prompt_len` the padded prompt length) adds α · the completion's
  backbone log-likelihood to the outcome verdict (`model.outcome_logits`).
  """
  logits = score(params, config, data, batch_size=batch_size)
  if "alpha" in params:
    if kind not in model.OUTCOME_KINDS:
      raise ValueError(f"the loglik score is for outcome reward models, not kind {kind!r}")
    result = {}
    if kind == "orm_steps" and step_labels is not None:
      result = metrics_lib.summarize(logits, step_labels, data.loss_mask, prefix="step/")
    pooled = logits[:, 0] if kind == "orm" else np.asarray(reward_losses.noisy_and_logits(
        jnp.asarray(logits), jnp.asarray(data.loss_mask)))
    outcome = pooled + float(params["alpha"]) * completion_logliks(params, config, data, prompt_len=prompt_len,
                                                                   batch_size=batch_size)
    result.update(metrics_lib.summarize(outcome, data.outcome, prefix="outcome/"))
  elif kind == "orm":
    result = metrics_lib.summarize(logits[:, 0], data.outcome, data.loss_mask[:, 0], prefix="outcome/")
    outcome = np.where(data.loss_mask[:, 0], logits[:, 0], -1e9)
  else:
    result = {}
    if kind == "prm":
      result = metrics_lib.summarize(logits, data.labels, data.loss_mask, prefix="step/")
      outcome = outcome_from_steps(logits, data.loss_mask)
    else:
      if step_labels is not None:
        result = metrics_lib.summarize(logits, step_labels, data.loss_mask, prefix="step/")
      outcome = noisy_and_from_steps(logits, data.loss_mask)
    outcome = np.where(np.isfinite(outcome), outcome, -1e9)
    result.update(metrics_lib.summarize(outcome, data.outcome, prefix="outcome/"))
  auc, pairs = metrics_lib.group_auc(outcome, data.outcome, data.group)
  result.update({"outcome/group_auc": auc, "outcome/group_pairs": float(pairs)})
  return result
