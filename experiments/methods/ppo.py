"""PPO with a critic (DeepSeekMath eq. 1-2): per-token rewards with the KL penalty, GAE, clipped
policy and value losses.

Models by role: the policy and the value model are trained (one pytree `{"policy", "value"}`,
each with its own optimiser); the reference and the reward are frozen.
"""

import time

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.methods import base
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import losses
from grpo_jax import models
from grpo_jax import training
from grpo_jax.training import objectives
from grpo_jax.training import update as update_lib

FLAGS = flags.FLAGS

flags.DEFINE_float("gamma", 1.0, "PPO: discount γ of GAE.")
flags.DEFINE_float("gae_lambda", 0.95, "PPO: GAE λ.")
flags.DEFINE_float("value_learning_rate", None, "PPO: peak learning rate of the value model; default --learning_rate.")
flags.DEFINE_float("value_clip", 0.2, "PPO: value-loss clip range around the sampling-time values (0: unclipped).")
flags.DEFINE_float("value_coef", 1.0, "PPO: weight of the value loss (separate optimisers, so it only rescales "
                   "the critic's gradient before clipping).")
flags.DEFINE_bool("whiten_advantages", True, "PPO: whiten GAE advantages over the batch's completion tokens.")
flags.DEFINE_string("value_init", "policy", "PPO: the value model's backbone: 'policy' (the start policy's) or an "
                    "HF-format checkpoint directory (e.g. a reward model's backbone).")
flags.register_validator("gamma", lambda v: 0 <= v <= 1, message="--gamma must be in [0, 1]")
flags.register_validator("gae_lambda", lambda v: 0 <= v <= 1, message="--gae_lambda must be in [0, 1]")
flags.register_validator("value_learning_rate", lambda v: v is None or v > 0,
                         message="--value_learning_rate must be > 0")
flags.register_validator("value_clip", lambda v: v >= 0, message="--value_clip must be >= 0")


def explained_variance(values: np.ndarray, returns: np.ndarray, mask: np.ndarray) -> float:
  """1 − Var(R − V) / Var(R) over the masked tokens (1: perfect critic, 0: a constant one)."""
  m = np.asarray(mask, bool)
  r, v = np.asarray(returns)[m], np.asarray(values)[m]
  var = np.var(r)
  return float(1.0 - np.var(r - v) / var) if var > 0 else 0.0


class PPO(base.Method):
  name = "ppo"

  @property
  def uses_reference(self):
    return FLAGS.beta > 0

  def __init__(self, config, task, rollouts, reference):
    super().__init__(config, task, rollouts, reference)
    values = jax.jit(lambda params, tokens, mask: objectives.token_values(params, config, tokens, mask))
    place = rollouts.placement
    self.values = lambda params, tokens, mask: place.host(values(params, *place.rows((np.asarray(tokens),
                                                                                      np.asarray(mask)))))

  def init_params(self, policy, key):
    if FLAGS.value_init == "policy":
      backbone = policy
    else:
      backbone, value_config = models.load_hf(FLAGS.value_init, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype)
      if value_config.hidden_size != self.config.hidden_size or value_config.vocab_size != self.config.vocab_size:
        raise ValueError(f"--value_init={FLAGS.value_init}: its hidden/vocab sizes differ from the policy's")
    value = models.init_scalar_params(self.config, key, backbone=backbone, head_scale=0.0)
    return {"policy": policy, "value": value}

  def policy(self, params):
    return params["policy"]

  def optimizer(self, total_updates: int, warmup: int) -> optax.GradientTransformation:
    value_lr = FLAGS.value_learning_rate or FLAGS.learning_rate
    return optax.multi_transform(
        {"policy": base._optimizer(FLAGS.learning_rate, total_updates, warmup),
         "value": base._optimizer(value_lr, total_updates, warmup)},
        {"policy": "policy", "value": "value"})

  def objective(self):
    loss_kwargs = dict(epsilon=FLAGS.epsilon, epsilon_high=FLAGS.epsilon_high, dual_clip=FLAGS.dual_clip,
                       aggregation=FLAGS.loss_aggregation, max_len=FLAGS.max_new_tokens)
    return update_lib.bind(objectives.ppo_objective, config=self.config, loss_kwargs=loss_kwargs,
                           value_clip=FLAGS.value_clip or None, value_coef=FLAGS.value_coef,
                           chunk_size=FLAGS.logprob_chunk, temperature=FLAGS.temperature)

  def collect(self, params, position: int, key):
    b, g = FLAGS.batch_size, FLAGS.group_size
    t0 = time.time()
    examples = [self.task.train_example(position + i) for i in range(b)]
    scored = self.rollouts.sample(params["policy"], examples, key, g)
    samples = scored.samples
    sample_time = time.time() - t0 - scored.score_time

    t1 = time.time()
    loss_mask = samples.mask.copy()
    if FLAGS.mask_truncated:
      loss_mask &= ~samples.truncated[:, None]
    sequences = logprobs_lib.sequences_from_samples(samples)
    completion = lambda full: self.rollouts.completion(full, samples)  # noqa: E731
    old_logp = self.rollouts.old_logprobs(params["policy"], samples)
    ref_logp = completion(self.rollouts.logprobs(self.reference, *sequences)) if FLAGS.beta > 0 else old_logp
    old_values = completion(self.values(params["value"], *sequences))
    mask = jnp.asarray(loss_mask)
    # Eq. 2: the score on the last token, −β·KL(π_old ‖ π_ref) per token; then GAE over the completion.
    token_rewards = losses.kl_penalized_rewards(jnp.asarray(scored.rewards), old_logp, ref_logp, mask,
                                                beta=FLAGS.beta, kl=FLAGS.kl or "k1")
    advantages, returns = losses.gae(token_rewards, old_values, mask, gamma=FLAGS.gamma, lam=FLAGS.gae_lambda)
    raw_advantages = advantages
    if FLAGS.whiten_advantages:
      advantages = losses.whiten(advantages, mask)
    batch = training.batch_from_samples(samples, mask, old_logp, ref_logp, advantages)
    zeros = jnp.zeros(samples.prompt_tokens.shape, jnp.float32)
    full = lambda x: jnp.concatenate([zeros, jnp.where(mask, x, 0.0)], axis=1)  # noqa: E731
    batch = training.PPOBatch(*batch, old_values=full(old_values), returns=full(returns))
    jax.block_until_ready(batch)

    m = np.asarray(loss_mask)
    adv, ret, val = (np.asarray(x) for x in (raw_advantages, returns, old_values))
    kl = np.asarray(losses.kl_divergence(old_logp, ref_logp, "k1", mask))
    stats = self.rollouts.stats(scored)
    stats.update(
        advantage_mean=float(adv[m].mean()) if m.any() else 0.0,
        advantage_std=float(adv[m].std()) if m.any() else 0.0,
        return_mean=float(ret[m].mean()) if m.any() else 0.0,
        value_start_mean=float(val[m].mean()) if m.any() else 0.0,
        explained_variance=explained_variance(val, ret, m),
        kl_reward=float(kl.sum(-1).mean()),  # Σ_t k1 per completion, the penalty's total before β
        non_score_reward=float(-FLAGS.beta * kl.sum(-1).mean()),
        time_sampling=sample_time, time_scoring=scored.score_time + time.time() - t1)
    return batch, stats, position + b
