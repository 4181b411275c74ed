"""Jitted update steps: one optimiser step over a minibatch, with exact gradient accumulation.

`make_train_step(objective, optimizer, num_micro_batches)` returns `step(state, batch) ->
(state, metrics)`. The objective is a pure function `(params, micro_batch, totals) -> (loss,
metrics)`; `totals` carries the minibatch's sequence and token counts so that the losses'
aggregation weights, and so the accumulated gradient, equal those of the whole minibatch.
"""

import functools
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from grpo_jax import length_buckets
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import losses
from grpo_jax import partitioning
from grpo_jax import placed as placed_lib
from grpo_jax.models import ModelConfig
from grpo_jax.models import transformer
from grpo_jax.models.logical_axes import axis_rules, constrain
from grpo_jax.train_state import TrainState

Params = Any
Objective = Callable[[Params, Any, dict], tuple[jax.Array, dict]]
# Metrics that are sums over micro-batches (the losses, with global normalisers); others are averaged.
_ADDITIVE = ("loss", "pg_loss", "kl_loss", "entropy_loss")


# optax >= 0.2.5 has optax.tree.norm; global_norm is its deprecated older name.
_global_norm = optax.tree.norm if hasattr(optax, "tree") and hasattr(optax.tree, "norm") else optax.global_norm


def _totals(loss_mask: jax.Array) -> dict:
  mask = loss_mask.astype(jnp.float32)
  return {"num_sequences": jnp.maximum(jnp.sum(jnp.any(loss_mask, axis=-1)), 1).astype(jnp.float32),
          "num_tokens": jnp.maximum(jnp.sum(mask), 1.0)}


class BucketedRows(NamedTuple):
  """The length-bucketed layout of an update (`make_train_step`'s `bucketed`): a minibatch of sampler rows, groups
  of `group_size` completions after a `prompt_len`-column prompt, is cut into `buckets`' length-sorted
  micro-batches; each prompt runs once for every micro-batch its completions fall in.

  `prefill(params, config, prompt_tokens, prompt_mask)`: the prompts' prefixes that the objective's `prefix=`
  receives, a pytree of `logprobs.PromptPrefix` (None: `logprobs.prefill` of the params, one prefix; PPO's
  policy and value models: `objectives.ppo_prefill`, one each)."""
  buckets: length_buckets.Buckets
  config: ModelConfig
  group_size: int
  prompt_len: int
  prefill: Callable | None = None


def make_train_step(objective: Objective, optimizer: optax.GradientTransformation, num_micro_batches: int = 1,
                    donate: bool = True, *, state_shardings: Any = None, batch_shardings: Any = None,
                    mesh: Mesh | None = None, rules: Mapping | None = None, combine: Callable | None = None,
                    frozen_shardings: Any = None, bucketed: BucketedRows | None = None, skip_empty: bool = False):
  """Builds the jitted `step(state, batch) -> (state, metrics)`.

  The batch (a pytree of arrays with leading dimension N, including a `loss_mask`) is split
  into `num_micro_batches` equal parts whose gradients are summed in a `lax.scan`; the sum is
  the minibatch gradient because the objective normalises by the minibatch totals.

  Sharded (all optional; see `grpo_jax.partitioning`):
    state_shardings: TrainState of shardings (`partitioning.init_train_state`'s second
      result): the step's input and output placement of the state.
    batch_shardings: a Batch of shardings, or one sharding for every leaf (e.g.
      `partitioning.batch_sharding(mesh, rules)`); the batch is re-sharded to it before
      the call, so batches of any placement are accepted.
    mesh: the mesh (default: that of `state_shardings`); metrics come back replicated on it.
    rules: logical-axis rules; the model's `constrain` hook is active in the trace.

  Frozen weights (LoRA, `grpo_jax.models.lora`): with `combine`, the step is `step(state, batch, frozen)`, the
  objective sees `combine(state.params, frozen)` and only `state.params` is differentiated and optimised;
  `frozen` (placed by `frozen_shardings` on a mesh) is neither donated nor returned.

  Length buckets (`bucketed`, a `BucketedRows`): the minibatch's micro-batches are its rows sorted by completion
  length, each run at the narrowest width that holds it (`bucketed_gradients`), in place of `num_micro_batches`
  equal ones; the objective must take a `prefix=` keyword (`grpo_objective`, `distill_objective`,
  `objectives.ppo_objective` with `bucketed.prefill`).

  Empty micro-batches (`skip_empty`): a micro-batch without a loss token skips its forward and backward (a
  `lax.cond`; its gradient is zero anyway), and the metrics are averaged over the micro-batches by their loss
  tokens. A batch padded with empty rows to one fixed row count (Flow-GRPO's turns) then compiles once and costs
  its real rows, rounded up to a micro-batch.
  """
  if mesh is None and state_shardings is not None:
    mesh = getattr(jax.tree.leaves(state_shardings)[0], "mesh", None)
  sharded = mesh is not None and rules is not None

  def step(state: TrainState, batch, frozen=None) -> tuple[TrainState, dict]:
    totals = _totals(batch.loss_mask)
    trained_objective = objective if combine is None else (
        lambda params, micro_batch, totals, **kw: objective(combine(params, frozen), micro_batch, totals, **kw))
    grad_fn = jax.value_and_grad(trained_objective, has_aux=True)

    def accumulate(grads, micro_batch):
      (_, metrics), g = grad_fn(state.params, micro_batch, totals)
      return jax.tree.map(jnp.add, grads, g), metrics

    def accumulate_nonempty(grads, micro_batch):
      tokens = jnp.sum(micro_batch.loss_mask, dtype=jnp.float32)
      skip = lambda grads, micro_batch: (grads, jax.tree.map(
          jnp.zeros_like, jax.eval_shape(lambda: accumulate(grads, micro_batch)[1])))
      grads, metrics = jax.lax.cond(tokens > 0, accumulate, skip, grads, micro_batch)
      return grads, (metrics, tokens)

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    if state_shardings is not None:
      zeros = jax.lax.with_sharding_constraint(zeros, state_shardings.params)
    weights = None
    if bucketed is not None:
      joined = (lambda p: p) if combine is None else (lambda p: combine(p, frozen))
      grads, metrics, weights = bucketed_gradients(trained_objective, state.params, batch, totals, bucketed, zeros,
                                                   joined=joined, sharded=sharded)
    else:
      micro = jax.tree.map(lambda x: x.reshape(num_micro_batches, x.shape[0] // num_micro_batches, *x.shape[1:]),
                           batch)
      if sharded:  # Every micro-batch spread over the data axes.
        micro = jax.tree.map(lambda x: constrain(x, (None, "batch") + (None,) * (x.ndim - 2)), micro)
      if skip_empty:
        grads, (metrics, weights) = jax.lax.scan(accumulate_nonempty, zeros, micro)
      else:
        grads, metrics = jax.lax.scan(accumulate, zeros, micro)
    metrics = {k: reduce_metric(k, v, weights) for k, v in metrics.items()}
    metrics["grad_norm"] = _global_norm(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(state.step + 1, params, opt_state), metrics

  donate_argnums = (0,) if donate else ()
  if mesh is None:
    program = jax.jit(step, donate_argnums=donate_argnums)
    return placed_lib.Placed(program, lambda: program)

  @functools.wraps(step)  # the program keeps the name `step`, sharded or not (profiles, compile logs)
  def traced(state, batch, *frozen):
    if not sharded:
      return step(state, batch, *frozen)
    with axis_rules(mesh, rules):
      return step(state, batch, *frozen)

  in_shardings = (state_shardings, batch_shardings) + ((frozen_shardings,) if combine is not None else ())
  jitted = jax.jit(traced, donate_argnums=donate_argnums, in_shardings=in_shardings,
                   out_shardings=(state_shardings, NamedSharding(mesh, PartitionSpec())))
  if batch_shardings is None:
    return placed_lib.Placed(jitted, lambda: jitted)

  def call(state: TrainState, batch, *frozen) -> tuple[TrainState, dict]:
    return jitted(state, partitioning.put(batch, batch_shardings), *frozen)

  return placed_lib.Placed(call, lambda: jitted)


def bucketed_gradients(objective: Objective, params: Params, batch, totals: dict, bucketed: BucketedRows, zeros, *,
                       joined: Callable = lambda p: p, sharded: bool = False):
  """(gradient, metrics [K], loss tokens [K]) of `objective` summed over the length-sorted micro-batches of
  `bucketed` (the tokens weigh the micro-batches' means: micro-batches of short rows hold fewer).

  The prompts run once for the whole minibatch (`bucketed.prefill` of `joined(params)`, under `jax.vjp`); each
  micro-batch's completions run at their width (`length_buckets.Buckets.scan`: one `lax.switch` branch per width,
  holding only the forward and backward; the gathers and the sums are outside it, once) against their prompts'
  rows, and its gradient with respect to those rows is added back onto the prompts (`length_buckets.add_at`); one
  pull-back through the prompts' forward ends the sum. The gradient is the padded minibatch's (the objective normalises by the minibatch's `totals`) up to float
  rounding; each token's forward and backward run once.
  """
  buckets, g, p = bucketed.buckets, bucketed.group_size, bucketed.prompt_len
  n, width = batch.tokens.shape[0], batch.tokens.shape[1] - p
  buckets.check(n, width, g)
  prompt_tokens, prompt_mask = batch.tokens[::g, :p], batch.attention_mask[::g, :p].astype(bool)
  is_prefix = lambda x: isinstance(x, logprobs_lib.PromptPrefix)
  # The prefixes' arrays (keys, values, last hidden states) without their masks, which take no gradient.
  with_mask = lambda tree, mask: jax.tree.map(lambda x: x._replace(mask=mask), tree, is_leaf=is_prefix)
  prefill = lambda q: with_mask((bucketed.prefill or logprobs_lib.prefill)(
      joined(q), bucketed.config, prompt_tokens, prompt_mask), None)
  prefix, pull_back = jax.vjp(prefill, params)
  kv_axis = lambda x: 0 if x.ndim == 2 else transformer.cache_batch_axis(x)
  lengths = jnp.sum(batch.attention_mask[:, p:], axis=1, dtype=jnp.int32)

  def at_width(w):
    def grad(micro, own, mask):
      cut = lambda x: x[:, :p + w] if x.ndim >= 2 and x.shape[1] == p + width else x
      micro = jax.tree.map(cut, micro)
      loss_of = lambda q, own: objective(q, micro, totals, prefix=with_mask(own, mask))
      (_, metrics), (dq, d_own) = jax.value_and_grad(loss_of, argnums=(0, 1), has_aux=True)(params, own)
      return dq, d_own, metrics
    return grad

  branches = [at_width(w) for w in buckets.widths]

  def step(carry, rows, width_index):
    # The gathers and the sums outside the widths' branches: one copy of them in the program.
    grads, d_prefix = carry
    micro = jax.tree.map(lambda x: length_buckets.take(x, rows, buckets.shards), batch)
    if sharded:
      micro = jax.tree.map(lambda x: constrain(x, ("batch",) + (None,) * (x.ndim - 1)), micro)
    prompts = rows // g
    own = jax.tree.map(lambda x: length_buckets.take(x, prompts, buckets.shards, kv_axis(x)), prefix)
    mask = length_buckets.take(prompt_mask, prompts, buckets.shards)
    dq, d_own, metrics = jax.lax.switch(width_index, branches, micro, own, mask)
    d_prefix = jax.tree.map(lambda acc, d: length_buckets.add_at(acc, prompts, d, buckets.shards, kv_axis(acc)),
                            d_prefix, d_own)
    return (jax.tree.map(jnp.add, grads, dq), d_prefix), (metrics, jnp.sum(micro.loss_mask, dtype=jnp.float32))

  (grads, d_prefix), (metrics, tokens), _ = buckets.scan(step, (zeros, jax.tree.map(jnp.zeros_like, prefix)), lengths)
  (d_params,) = pull_back(d_prefix)
  return jax.tree.map(jnp.add, grads, d_params), metrics, tokens


def reduce_metric(name: str, values, weights=None):
  """Combines one metric over micro-batches: sums for the globally normalised losses, min/max for
  `*_min`/`*_max`, the mean otherwise; with `weights` (e.g. the micro-batches' loss tokens) the mean is weighted
  by them and min/max leave out the micro-batches of weight 0 (unless all are)."""
  values = jnp.asarray(values)
  if name in _ADDITIVE:
    return jnp.sum(values)
  counted = jnp.ones(values.shape, bool) if weights is None else jnp.asarray(weights) > 0  # with loss tokens
  counted = counted | ~jnp.any(counted)  # none has any: all
  if name.endswith("_min"):
    return jnp.min(jnp.where(counted, values, jnp.inf))
  if name.endswith("_max"):
    return jnp.max(jnp.where(counted, values, -jnp.inf))
  if weights is not None:
    return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1e-9)
  return jnp.mean(values)


def sft_objective(params: Params, batch, totals: dict, *, config: ModelConfig, chunk_size: int = 128):
  """Token-mean negative log-likelihood of the target tokens (GC = 1 in the paradigm, §5.2.1)."""
  logp = logprobs_lib.token_logprobs(params, config, batch.tokens, batch.attention_mask, chunk_size=chunk_size)
  loss = losses.aggregate(-logp, batch.loss_mask, "token-mean", num_tokens=totals["num_tokens"])
  return loss, {"loss": loss}


def policy_logprobs(params: Params, batch, *, config: ModelConfig, chunk_size: int = 128, temperature: float = 1.0,
                    group_size: int = 1, prompt_len: int | None = None, prefix=None):
  """(logp, entropy) [N, L] of a `Batch`'s tokens under `params`, at `temperature`.

  With `group_size` G > 1 and `prompt_len` P the batch's rows are sampler rows in groups of G that share their
  first P columns (the prompt), and each prompt runs through the model once
  (`logprobs.grouped_completion_logprobs`): the prompt columns come back 0 (no loss is taken there), the
  completion columns equal the ungrouped values up to float rounding (~1e-6).

  With `prefix`, a `logprobs.PromptPrefix` of each row's prompt (the length-bucketed update, `bucketed_gradients`),
  only the completion columns after `prompt_len` run, against it.
  """
  if prefix is not None:
    p = prompt_len
    out = logprobs_lib.prefixed_completion_logprobs(params, config, prefix, batch.tokens[:, p:],
                                                    batch.attention_mask[:, p:], chunk_size=chunk_size,
                                                    return_entropy=True, temperature=temperature)
    return jax.tree.map(lambda x: jnp.pad(x, ((0, 0), (p, 0))), out)
  if group_size <= 1:
    return logprobs_lib.token_logprobs(params, config, batch.tokens, batch.attention_mask, chunk_size=chunk_size,
                                       return_entropy=True, temperature=temperature)
  if prompt_len is None:
    raise ValueError("policy_logprobs: group_size > 1 needs prompt_len")
  n = batch.tokens.shape[0]
  if n % group_size:
    raise ValueError(f"policy_logprobs: {n} rows (per micro-batch) are not whole groups of {group_size}")
  tokens, mask, p = batch.tokens, batch.attention_mask, prompt_len
  out = logprobs_lib.grouped_completion_logprobs(
      params, config, tokens[::group_size, :p], mask[::group_size, :p], tokens[:, p:], mask[:, p:],
      group_size=group_size, chunk_size=chunk_size, return_entropy=True, temperature=temperature)
  return jax.tree.map(lambda x: jnp.pad(x, ((0, 0), (p, 0))), out)


def rollout_correction(logp: jax.Array, old_logp: jax.Array, batch, *, correction: str = "none",
                       lower: float = 0.5, upper: float = 2.0) -> tuple[jax.Array | None, dict]:
  """The rollout-trainer mismatch of a batch that carries the sampler's log-probs (`batch.sampler_logp`), and the
  weights that correct for it: `(weights or None, metrics)`.

  The mismatch metrics (`losses.mismatch_metrics`) compare the sampler's log-probs with `logp`, this forward's π_θ,
  which is the trainer's π_old on a step's first update (the loop logs them from that one). The weights of
  `correction` ("token_tis", "seq_tis", "token_mis", "seq_mis"; "none": no weights) compare them with `old_logp`,
  the trainer's π_old. A batch without `sampler_logp` gives (None, {}).
  """
  if batch.sampler_logp is None:
    return None, {}
  sg = jax.lax.stop_gradient
  metrics = losses.mismatch_metrics(batch.sampler_logp, sg(logp), batch.loss_mask)
  if correction == "none":
    return None, metrics
  weights = losses.rollout_correction_weights(batch.sampler_logp, sg(old_logp), batch.loss_mask, correction,
                                              lower=lower, upper=upper)
  return weights, {**metrics, **losses.weight_metrics(weights, batch.loss_mask)}


def grpo_objective(params: Params, batch, totals: dict, *, config: ModelConfig, loss_kwargs: dict,
                   use_reference: bool, chunk_size: int = 128, temperature: float = 1.0, group_size: int = 1,
                   prompt_len: int | None = None, on_policy: bool = False, correction_kwargs: dict | None = None,
                   prefix=None):
  """The GRPO loss (`losses.grpo_loss`, given the policy's per-token entropy for its entropy options) of a `Batch`,
  plus the policy's mean token entropy.

  The policy is π(·) ∝ exp(logits / temperature), the distribution the rollouts were sampled from, so
  `batch.old_logp`, `batch.ref_logp` and `batch.sampler_logp` must be log-probs at the same temperature.

  Rollout-trainer mismatch (`rollout_correction`, with `correction_kwargs`): logged when the batch carries the
  sampler's log-probs; with a correction its weights multiply the policy term.

  Speed options (same loss up to float rounding):
    group_size, prompt_len: rows in groups of G samples of one prompt of P columns (the sampler's
      layout): each prompt runs once (`policy_logprobs`); micro-batches must hold whole groups.
    on_policy: π_old is the current policy (one epoch, one minibatch: the update's params are those that
      sampled), so π_old = stop_gradient(π_θ) exactly and `batch.old_logp` is not read (it need not be
      computed): ρ = 1 and the gradient is that of the clipped surrogate at ρ = 1.
    prefix: the rows' prompts run ahead (`policy_logprobs`; the length-bucketed update).
  """
  logp, entropy = policy_logprobs(params, batch, config=config, chunk_size=chunk_size, temperature=temperature,
                                  group_size=group_size, prompt_len=prompt_len, prefix=prefix)
  old_logp = jax.lax.stop_gradient(logp) if on_policy else batch.old_logp
  weights, mismatch = rollout_correction(logp, old_logp, batch, **(correction_kwargs or {}))
  loss, metrics = losses.grpo_loss(
      logp, old_logp, batch.ref_logp if use_reference else None, batch.advantages, batch.loss_mask,
      num_sequences=totals["num_sequences"], num_tokens=totals["num_tokens"], entropy=entropy,
      rollout_weights=weights, **loss_kwargs)
  metrics["entropy"] = jax.lax.stop_gradient(losses.masked_mean(entropy, batch.loss_mask))
  return loss, {**metrics, **mismatch}


def distill_objective(params: Params, batch, totals: dict, *, config: ModelConfig, loss_kwargs: dict,
                      chunk_size: int = 128, temperature: float = 1.0, group_size: int = 1,
                      prompt_len: int | None = None, on_policy: bool = False, prefix=None):
  """On-policy distillation's loss (`losses.distill_loss`) of a `Batch` whose `ref_logp` holds the frozen teacher's
  log-probs of the sampled tokens, plus the policy's mean token entropy; the options are `grpo_objective`'s."""
  logp, entropy = policy_logprobs(params, batch, config=config, chunk_size=chunk_size, temperature=temperature,
                                  group_size=group_size, prompt_len=prompt_len, prefix=prefix)
  old_logp = jax.lax.stop_gradient(logp) if on_policy else batch.old_logp
  loss, metrics = losses.distill_loss(logp, old_logp, batch.ref_logp, batch.loss_mask,
                                      num_sequences=totals["num_sequences"], num_tokens=totals["num_tokens"],
                                      **loss_kwargs)
  metrics["entropy"] = jax.lax.stop_gradient(losses.masked_mean(entropy, batch.loss_mask))
  return loss, metrics


def bind(objective: Callable, **kwargs) -> Objective:
  """Binds the static keyword arguments of an objective."""
  return functools.partial(objective, **kwargs)
