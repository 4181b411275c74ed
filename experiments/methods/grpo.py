"""GRPO (DeepSeekMath eq. 3): G samples per prompt from π_old, group-normalised outcome rewards,
the clipped surrogate with the k3 KL to the frozen reference in the loss; DAPO/Dr. GRPO/GSPO knobs, and
the critic-free advantage estimators that replace the group normalisation (`--advantage_estimator`):
RLOO's leave-one-out baseline, and REINFORCE++ (KL in the per-token reward, batch-whitened returns)."""

import time

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from experiments.methods import base
from experiments.methods import rollouts as rollouts_lib
from grpo_jax import evaluation
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import losses
from grpo_jax import sampling
from grpo_jax import training
from grpo_jax.training import update as update_lib

FLAGS = flags.FLAGS

flags.DEFINE_enum("advantage_estimator", "group", ["group", "rloo", "reinforce_pp"],
                  "GRPO's advantages: group (normalised within the G samples of a prompt, --advantage_scale), rloo "
                  "(r_i minus the mean of the other G-1 rewards, unscaled), or reinforce_pp (REINFORCE++: the KL "
                  "penalty β·--kl (default k1) in every token's reward instead of the loss, returns whitened over "
                  "the batch).")


class GRPO(base.Method):
  name = "grpo"

  @property
  def uses_reference(self):
    return FLAGS.beta > 0

  def on_policy(self) -> bool:
    """Whether π_old is exactly the policy being updated: one epoch over one minibatch (the params that
    sampled are the params the single optimiser step differentiates), so the objective uses
    stop_gradient(π_θ) and no π_old forward runs. `--recompute_old_logprobs` keeps the explicit forward."""
    return (FLAGS.num_epochs == 1 and FLAGS.minibatch_size in (0, self.rows_per_step())
            and not FLAGS.recompute_old_logprobs)

  def objective(self):
    kl_in_loss = FLAGS.advantage_estimator != "reinforce_pp"  # REINFORCE++ puts the KL in the reward
    loss_kwargs = dict(epsilon=FLAGS.epsilon, epsilon_high=FLAGS.epsilon_high,
                       beta=FLAGS.beta if kl_in_loss else 0.0, kl=FLAGS.kl or "k3",
                       aggregation=FLAGS.loss_aggregation, importance=FLAGS.importance,
                       dual_clip=FLAGS.dual_clip, max_len=FLAGS.max_new_tokens)
    # The policy trained is the sampling distribution π ∝ exp(logits / T): old, reference and new log-probs
    # all use T.
    return update_lib.bind(training.grpo_objective, config=self.config, loss_kwargs=loss_kwargs,
                           use_reference=FLAGS.beta > 0 and kl_in_loss, chunk_size=FLAGS.logprob_chunk,
                           temperature=FLAGS.temperature, on_policy=self.on_policy())

  def collect(self, params, position: int, key):
    b, g = FLAGS.batch_size, FLAGS.group_size
    rounds, round_examples, kept, spare = [], [], [], []
    score_time = 0.0
    t0 = time.time()
    for r in range(FLAGS.dynamic_sampling_max_rounds if FLAGS.dynamic_sampling else 1):
      examples = [self.task.train_example(position + i) for i in range(b)]
      scored = self.rollouts.sample(params, examples, jax.random.fold_in(key, r), g)
      position += b
      score_time += scored.score_time
      rounds.append(scored)
      round_examples.append(examples)
      varied = np.ptp(scored.rewards.reshape(b, g), axis=1) > 0
      for i in range(b):
        (kept if varied[i] or not FLAGS.dynamic_sampling else spare).append((r, i))
      if len(kept) >= b:
        break
    # DAPO dynamic sampling: fill a short batch with zero-variance groups, left out of the loss, so shapes
    # stay fixed.
    chosen = kept[:b]
    dropped = spare[:b - len(chosen)]
    rows = [(r, i * g + j) for r, i in chosen + dropped for j in range(g)]
    samples = sampling.SampleOutput(*[np.stack([np.asarray(getattr(rounds[r].samples, f))[row] for r, row in rows])
                                      for f in sampling.SampleOutput._fields])
    rewards = np.asarray([rounds[r].rewards[row] for r, row in rows], np.float32)
    correct = np.asarray([rounds[r].correct[row] for r, row in rows], np.float32)
    scored = rollouts_lib.Scored(samples, rewards, correct, score_time)
    sample_time = time.time() - t0 - score_time

    t1 = time.time()
    loss_mask = samples.mask.copy()
    loss_mask[len(chosen) * g:] = False
    if FLAGS.mask_truncated:
      loss_mask &= ~samples.truncated[:, None]
    if self.on_policy() and FLAGS.advantage_estimator != "reinforce_pp":  # REINFORCE++'s reward reads π_old
      old_logp = jnp.zeros(samples.tokens.shape, jnp.float32)  # not read: the objective uses sg(π_θ)
    else:
      old_logp = self.rollouts.old_logprobs(params, samples)
    if FLAGS.beta > 0:
      sequences = logprobs_lib.sequences_from_samples(samples)
      ref_logp = self.rollouts.completion(self.rollouts.logprobs(self.reference, *sequences), samples)
    else:
      ref_logp = jnp.zeros(samples.tokens.shape, jnp.float32)
    if FLAGS.supervision == "process":  # GRPO+PS: PRM rewards per step, normalised over the group's steps
      row_examples = [round_examples[r][row // g] for r, row in rows]
      step_rewards, ends, step_mask = self.rollouts.reward_model.steps(
          samples, evaluation.decode(self.task.tokenizer, samples), row_examples)
      k, t = step_rewards.shape[1], samples.tokens.shape[1]
      advantages = losses.process_advantages(
          step_rewards.reshape(b, g, k), jnp.asarray(ends.reshape(b, g, k)), step_mask.reshape(b, g, k),
          samples.mask.reshape(b, g, t), scale="none" if FLAGS.advantage_scale == "none" else "group",
          center_tokens=FLAGS.process_center_tokens, eps=FLAGS.advantage_eps).reshape(b * g, t)
    elif FLAGS.advantage_estimator == "rloo":
      advantages = losses.rloo_advantages(jnp.asarray(rewards.reshape(b, g))).reshape(-1)
    elif FLAGS.advantage_estimator == "reinforce_pp":
      token_rewards = losses.kl_penalized_rewards(jnp.asarray(rewards), old_logp, ref_logp, jnp.asarray(loss_mask),
                                                  FLAGS.beta, kl=FLAGS.kl or "k1")
      advantages = losses.reinforce_pp_advantages(token_rewards, jnp.asarray(loss_mask))
    else:
      advantages = losses.group_advantages(rewards.reshape(b, g), scale=FLAGS.advantage_scale,
                                           eps=FLAGS.advantage_eps).reshape(-1)
    batch = training.batch_from_samples(samples, jnp.asarray(loss_mask), old_logp, ref_logp, advantages)
    jax.block_until_ready(batch)
    stats = self.rollouts.stats(scored, g)
    stats.update(zero_variance_groups=float(np.mean(np.ptp(rewards.reshape(b, g), axis=1) == 0)),
                 sampling_rounds=float(len(rounds)), time_sampling=sample_time,
                 time_scoring=score_time + time.time() - t1)
    return batch, stats, position
