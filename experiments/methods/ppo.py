"""PPO with a critic (DeepSeekMath eq. 1-2): per-token rewards with the KL penalty, GAE, clipped
policy and value losses.

Models by role: the policy and the value model are trained (one pytree `{"policy", "value"}`,
each with its own optimiser); the reference and the reward are frozen.
"""

import functools
import time

import jax
import jax.numpy as jnp
import optax

from experiments.methods import base
from experiments.methods import program as program_lib
from experiments.runner import optimizer as optimizer_lib
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import losses
from grpo_jax import partitioning
from grpo_jax import placed
from grpo_jax import row_chunks
from grpo_jax import sampling
from grpo_jax import models
from grpo_jax.models import lora
from grpo_jax import training
from grpo_jax.training import objectives
from grpo_jax.training import update as update_lib



def explained_variance(values, returns, mask):
  """1 − Var(R − V) / Var(R) over the masked tokens (1: perfect critic, 0: a constant one; 0 where Var(R) = 0)."""
  m = jnp.asarray(mask, bool)
  count = jnp.maximum(m.sum(), 1)

  def var(x):
    mean = jnp.sum(jnp.where(m, x, 0.0)) / count
    return jnp.sum(jnp.where(m, (x - mean) ** 2, 0.0)) / count

  r, v = jnp.asarray(returns, jnp.float32), jnp.asarray(values, jnp.float32)
  var_r = var(r)
  return jnp.where(var_r > 0, 1.0 - var(r - v) / jnp.where(var_r > 0, var_r, 1.0), 0.0)


def step_batch(samples: sampling.SampleOutput, rewards, old_logp, ref_logp, old_values, *, mask_truncated: bool,
               beta: float, kl: str, gamma: float, lam: float, whiten: bool):
  """A PPO step's training batch and its statistics, as one program: `(training.PPOBatch, stats)`.

  DeepSeekMath eq. 2: the score on the last token, −β·KL(π_old ‖ π_ref) (the `kl` estimate) on every token; GAE(γ,
  λ) over the completion against the value forward's V(s_t); the advantages whitened over the completion tokens
  with `whiten`. The mask is the sampler's, less the truncated completions with `mask_truncated`. The stats are
  device scalars over the masked tokens (the trainer reads them with the update's metrics).
  """
  mask = jnp.asarray(samples.mask)
  if mask_truncated:
    mask &= ~jnp.asarray(samples.truncated)[:, None]
  token_rewards = losses.kl_penalized_rewards(jnp.asarray(rewards), old_logp, ref_logp, mask, beta=beta, kl=kl)
  advantages, returns = losses.gae(token_rewards, old_values, mask, gamma=gamma, lam=lam)
  batch = training.batch_from_samples(samples, mask, old_logp, ref_logp,
                                      losses.whiten(advantages, mask) if whiten else advantages)
  zeros = jnp.zeros(samples.prompt_tokens.shape, jnp.float32)
  full = lambda x: jnp.concatenate([zeros, jnp.where(mask, x, 0.0)], axis=1)  # noqa: E731
  batch = training.PPOBatch(**batch._asdict(), old_values=full(old_values), returns=full(returns))

  count = jnp.maximum(mask.sum(), 1)
  mean = lambda x: jnp.sum(jnp.where(mask, x, 0.0)) / count  # noqa: E731
  kl_total = losses.kl_divergence(old_logp, ref_logp, "k1", mask).sum(-1).mean()  # Σ_t k1 a completion
  stats = dict(advantage_mean=mean(advantages),
               advantage_std=jnp.sqrt(mean((advantages - mean(advantages)) ** 2)),
               return_mean=mean(returns), value_start_mean=mean(old_values),
               explained_variance=explained_variance(old_values, returns, mask),
               kl_reward=kl_total,  # the penalty's total before β
               non_score_reward=-beta * kl_total)
  return batch, stats


class PPO(base.Method):
  name = "ppo"

  def __init__(self, config, model_config, task, rollouts, reference):
    super().__init__(config, model_config, task, rollouts, reference)
    place = rollouts.placement
    buckets, g, p = self.scoring_buckets(), config.rollout.group_size, config.task.max_prompt_len

    def values(params, tokens, mask):  # V(s_t) of every row [N, P + T]
      if buckets is None:  # in the placement's row chunks (chosen per shape)
        return row_chunks.map_rows(lambda t, m: objectives.token_values(params, model_config, t, m), (tokens, mask),
                                   place.forward_chunk(model_config, *tokens.shape))
      # in the π_old / π_ref forwards' length buckets, each prompt once per group (0 at the prompt's columns)
      out = objectives.bucketed_completion_values(params, model_config, tokens[::g, :p], mask[::g, :p], tokens[:, p:],
                                                  mask[:, p:], group_size=g, buckets=buckets)
      return jnp.pad(out, ((0, 0), (p, 0)))

    # On a mesh, traced inside its axis rules, as the policy's forwards are (a Pallas attention kernel runs per shard).
    values = jax.jit(values) if place.mesh is None else partitioning.jit_with_rules(values, place.mesh, place.rules)
    # `.program()`: the program itself (ahead of time: `experiments.trainer.programs`)
    self.values = placed.Placed(lambda params, tokens, mask: values(params, *place.device((tokens, mask))),
                                lambda: values)
    # π_old / π_ref: the rollouts' forward (each row its own prompt), or each prompt once per group in length buckets
    self.group_logprobs = rollouts.logprobs if buckets is None else place.logprobs(
        model_config, chunk_size=config.model.logprob_chunk, temperature=config.rollout.temperature,
        **self.forward_layout())
    algo = config.algorithm
    self.step_batch = jax.jit(functools.partial(
        step_batch, mask_truncated=config.rollout.mask_truncated, beta=algo.beta, kl=algo.kl or "k1",
        gamma=algo.gamma, lam=algo.gae_lambda, whiten=algo.whiten_advantages))  # the step's batch, one program

  def init_params(self, policy, key):
    value_init, dtype = self.config.algorithm.value_init, self.config.model.dtype
    if value_init == "policy":
      backbone = policy
    else:
      backbone, value_config = models.load_hf(value_init, dtype=dtype, param_dtype=dtype)
      policy = self.model_config
      if value_config.hidden_size != policy.hidden_size or value_config.vocab_size != policy.vocab_size:
        raise ValueError(f"--value_init={value_init}: its hidden/vocab sizes differ from the policy's")
    if not self.model_config.lora_rank:
      value = models.init_scalar_params(self.model_config, key, backbone=backbone, head_scale=0.0)
      return {"policy": policy, "value": value}
    # LoRA: the value model is the frozen base (the policy's own arrays when --value_init=policy, not a copy) with
    # its own adapters and a fully trained head.
    adapters, base = lora.split(models.backbone(backbone), lora.is_adapter)
    if value_init != "policy":
      adapters = lora.init_adapters(self.model_config, jax.random.fold_in(key, 1))
    value = models.init_scalar_params(self.model_config, key, backbone=adapters, head_scale=0.0)
    value["backbone"] = lora.join(value["backbone"], base)
    return {"policy": policy, "value": self.rollouts.placement.put_params(value)}

  def policy(self, params):
    return params["policy"]

  @property
  def rows_per_item(self) -> int:
    """G with length buckets, whose micro-batches hold whole groups (each prompt once per group); 1 otherwise."""
    return self.config.rollout.group_size if self.config.rollout.token_layout == "buckets" else 1

  def forward_layout(self) -> dict:
    """With `--token_layout=buckets`, the π_old / π_ref forwards' layout (`Placement.logprobs` keywords): each
    prompt once per group of G, in the length buckets of `scoring_buckets` (the value forward takes the same)."""
    buckets = self.scoring_buckets()
    if buckets is None:
      return {}
    return dict(group_size=self.config.rollout.group_size, prompt_len=self.config.task.max_prompt_len,
                buckets=buckets)

  def scoring_logprobs(self):
    return self.group_logprobs

  def bucketed_update(self) -> update_lib.BucketedRows | None:
    """The update's length-bucketed layout (`Method.bucketed_rows`), the policy's and the value model's prompt
    prefixes both (`objectives.ppo_prefill`); None when padded."""
    return self.bucketed_rows(objectives.ppo_prefill)

  def optimizer(self, total_updates: int, warmup: int) -> optax.GradientTransformation:
    optim = self.config.optim
    value_lr = self.config.algorithm.value_learning_rate or optim.learning_rate
    return optax.multi_transform(
        {"policy": optimizer_lib.make_optimizer(optim, optim.learning_rate, total_updates, warmup),
         "value": optimizer_lib.make_optimizer(optim, value_lr, total_updates, warmup)},
        {"policy": "policy", "value": "value"})

  def abstract_batch(self, rows):
    batch = super().abstract_batch(rows)
    return training.PPOBatch(**batch._asdict(), old_values=batch.advantages, returns=batch.advantages)

  def scoring_forwards(self) -> tuple[str, ...]:
    """π_old unless the sampler's log-probs are it (`Rollouts.old_forward`); π_ref with the KL reward (β > 0).
    The value forward V_ψ runs every step besides."""
    return ((("π_old",) if self.rollouts.old_forward() else ())
            + (("π_ref",) if self.config.algorithm.beta > 0 else ()))

  def step_programs(self, shapes):
    """The π_old / π_ref forward of `scoring_forwards`, then the value forward V_ψ over the train state's value
    model, then the step's batch (`step_batch`)."""
    n, width = self.scoring_shape()
    value = shapes.trained["value"]
    t = self.config.rollout.max_new_tokens
    logp = shapes.rows(jnp.float32, n, t)
    buckets = self.scoring_buckets()
    how = "" if buckets is None else (f", in {buckets.num_micro_batches} length-sorted micro-batches in blocks of "
                                      f"{buckets.block} columns, each prompt once per group of "
                                      f"{self.config.rollout.group_size}")
    return super().step_programs(shapes) | {
        "values": program_lib.Program(
            self.values.program(), (value, shapes.rows(jnp.int32, n, width), shapes.rows(jnp.bool_, n, width)),
            f"the value forward V_ψ of the {n} rows{how}", per_step=1),
        "batch": program_lib.Program(
            self.step_batch, (program_lib.samples(shapes, n, width - t, t), shapes.rows(jnp.float32, n), logp, logp,
                              logp), f"the training batch of the {n} rows (KL rewards, GAE, statistics)",
            per_step=1, resident_args=())}

  def objective(self):
    algo = self.config.algorithm
    loss_kwargs = dict(epsilon=algo.epsilon, epsilon_high=algo.epsilon_high, dual_clip=algo.dual_clip,
                       aggregation=algo.loss_aggregation, max_len=self.config.rollout.max_new_tokens)
    return update_lib.bind(objectives.ppo_objective, config=self.model_config, loss_kwargs=loss_kwargs,
                           value_clip=algo.value_clip or None, value_coef=algo.value_coef,
                           chunk_size=self.config.model.logprob_chunk, temperature=self.config.rollout.temperature,
                           correction_kwargs=base.correction_kwargs(algo),
                           **(dict(prompt_len=self.config.task.max_prompt_len)  # the bucketed update's prefixes
                              if self.config.rollout.token_layout == "buckets" else {}))

  def collect(self, params, position: int, key):
    rollout = self.config.rollout
    b, g = rollout.batch_size, rollout.group_size
    t0 = time.time()
    examples = [self.task.train_example(position + i) for i in range(b)]
    scored = self.rollouts.sample(params["policy"], examples, key, g)
    samples = self.rollouts.trim(scored.samples, scored.host.lengths)  # the columns up to the longest completion
    sample_time = time.time() - t0 - scored.score_time

    # SCORE: π_old, π_ref and the values, then the batch in one program (not awaited: the update's metrics are the
    # step's sync, with this step's statistics)
    t1 = time.time()
    sequences = logprobs_lib.sequences_from_samples(samples)
    completion = lambda full: self.rollouts.completion(full, samples)  # noqa: E731
    old_logp = self.rollouts.old_logprobs(params["policy"], samples, self.group_logprobs)
    ref_logp = (completion(self.group_logprobs(self.reference, *sequences)) if "π_ref" in self.scoring_forwards()
                else old_logp)
    old_values = completion(self.values(params["value"], *sequences))
    batch, batch_stats = self.step_batch(samples, scored.rewards, old_logp, ref_logp, old_values)
    stats = self.rollouts.stats(scored) | batch_stats
    stats.update(time_sampling=sample_time, time_scoring=scored.score_time + time.time() - t1)
    return batch, stats, position + b
