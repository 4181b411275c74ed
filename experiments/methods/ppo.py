"""PPO with a critic (DeepSeekMath eq. 1-2): per-token rewards with the KL penalty, GAE, clipped
policy and value losses.

Models by role: the policy and the value model are trained (one pytree `{"policy", "value"}`,
each with its own optimiser); the reference and the reward are frozen.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.methods import base
from experiments.methods import program as program_lib
from experiments.runner import optimizer as optimizer_lib
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import losses
from grpo_jax import partitioning
from grpo_jax import placed
from grpo_jax import row_chunks
from grpo_jax import models
from grpo_jax.models import lora
from grpo_jax import training
from grpo_jax.training import objectives
from grpo_jax.training import update as update_lib



def explained_variance(values: np.ndarray, returns: np.ndarray, mask: np.ndarray) -> float:
  """1 − Var(R − V) / Var(R) over the masked tokens (1: perfect critic, 0: a constant one)."""
  m = np.asarray(mask, bool)
  r, v = np.asarray(returns)[m], np.asarray(values)[m]
  var = np.var(r)
  return float(1.0 - np.var(r - v) / var) if var > 0 else 0.0


class PPO(base.Method):
  name = "ppo"

  def __init__(self, config, model_config, task, rollouts, reference):
    super().__init__(config, model_config, task, rollouts, reference)
    place = rollouts.placement

    def values(params, tokens, mask):  # V(s_t) of every row, in the placement's row chunks (chosen per shape)
      return row_chunks.map_rows(lambda t, m: objectives.token_values(params, model_config, t, m), (tokens, mask),
                                 place.forward_chunk(model_config, *tokens.shape))

    # On a mesh, traced inside its axis rules, as the policy's forwards are (a Pallas attention kernel runs per shard).
    values = jax.jit(values) if place.mesh is None else partitioning.jit_with_rules(values, place.mesh, place.rules)
    # `.program()`: the program itself (ahead of time: `experiments.trainer.programs`)
    self.values = placed.Placed(lambda params, tokens, mask: values(params, *place.device((tokens, mask))),
                                lambda: values)

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
    model."""
    n, width = self.scoring_shape()
    value = shapes.trained["value"]
    return super().step_programs(shapes) | {"values": program_lib.Program(
        self.values.program(), (value, shapes.rows(jnp.int32, n, width), shapes.rows(jnp.bool_, n, width)),
        f"the value forward V_ψ of the {n} rows", per_step=1)}

  def objective(self):
    algo = self.config.algorithm
    loss_kwargs = dict(epsilon=algo.epsilon, epsilon_high=algo.epsilon_high, dual_clip=algo.dual_clip,
                       aggregation=algo.loss_aggregation, max_len=self.config.rollout.max_new_tokens)
    return update_lib.bind(objectives.ppo_objective, config=self.model_config, loss_kwargs=loss_kwargs,
                           value_clip=algo.value_clip or None, value_coef=algo.value_coef,
                           chunk_size=self.config.model.logprob_chunk, temperature=self.config.rollout.temperature,
                           correction_kwargs=base.correction_kwargs(algo))

  def collect(self, params, position: int, key):
    algo, rollout = self.config.algorithm, self.config.rollout
    b, g = rollout.batch_size, rollout.group_size
    t0 = time.time()
    examples = [self.task.train_example(position + i) for i in range(b)]
    scored = self.rollouts.sample(params["policy"], examples, key, g)
    samples = self.rollouts.trim(scored.samples, scored.host.lengths)  # the columns up to the longest completion
    sample_time = time.time() - t0 - scored.score_time

    t1 = time.time()
    mask = jnp.asarray(samples.mask)
    if rollout.mask_truncated:
      mask &= ~jnp.asarray(samples.truncated)[:, None]
    sequences = logprobs_lib.sequences_from_samples(samples)
    completion = lambda full: self.rollouts.completion(full, samples)  # noqa: E731
    old_logp = self.rollouts.old_logprobs(params["policy"], samples)
    ref_logp = (completion(self.rollouts.logprobs(self.reference, *sequences)) if "π_ref" in self.scoring_forwards()
                else old_logp)
    old_values = completion(self.values(params["value"], *sequences))
    # Eq. 2: the score on the last token, −β·KL(π_old ‖ π_ref) per token; then GAE over the completion.
    token_rewards = losses.kl_penalized_rewards(jnp.asarray(scored.rewards), old_logp, ref_logp, mask,
                                                beta=algo.beta, kl=algo.kl or "k1")
    advantages, returns = losses.gae(token_rewards, old_values, mask, gamma=algo.gamma, lam=algo.gae_lambda)
    raw_advantages = advantages
    if algo.whiten_advantages:
      advantages = losses.whiten(advantages, mask)
    batch = training.batch_from_samples(samples, mask, old_logp, ref_logp, advantages)
    zeros = jnp.zeros(samples.prompt_tokens.shape, jnp.float32)
    full = lambda x: jnp.concatenate([zeros, jnp.where(mask, x, 0.0)], axis=1)  # noqa: E731
    batch = training.PPOBatch(**batch._asdict(), old_values=full(old_values), returns=full(returns))

    # The statistics, in one transfer (it waits for the forwards: `time_scoring` includes them).
    m, adv, ret, val, kl = jax.device_get((mask, raw_advantages, returns, old_values,
                                           losses.kl_divergence(old_logp, ref_logp, "k1", mask)))
    m = np.asarray(m, bool)
    stats = self.rollouts.stats(scored)
    stats.update(
        advantage_mean=float(adv[m].mean()) if m.any() else 0.0,
        advantage_std=float(adv[m].std()) if m.any() else 0.0,
        return_mean=float(ret[m].mean()) if m.any() else 0.0,
        value_start_mean=float(val[m].mean()) if m.any() else 0.0,
        explained_variance=explained_variance(val, ret, m),
        kl_reward=float(kl.sum(-1).mean()),  # Σ_t k1 per completion, the penalty's total before β
        non_score_reward=float(-algo.beta * kl.sum(-1).mean()),
        time_sampling=sample_time, time_scoring=scored.score_time + time.time() - t1)
    return batch, stats, position + b
