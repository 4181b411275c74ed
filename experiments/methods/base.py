"""What a method of DeepSeekMath's unified paradigm provides to the runner's training loop.

A method is its data source (offline from the start policy, or online from the current one),
its reward and its gradient coefficient (§5.2.1, Table 10). Everything else (sampler, rewards,
evaluation, optimiser, update step, logging, checkpoints) is the runner's and shared.
"""

import abc

from absl import flags
import optax

from grpo_jax import training

FLAGS = flags.FLAGS


class Method(abc.ABC):
  """Base class: the policy is the whole trained pytree and there is no critic."""

  name = "method"
  rows_per_item = 1  # rows that must stay together in a minibatch (2: DPO's (o⁺, o⁻) pairs)
  uses_reference = False
  reward_updates = None  # iterative RL: a `learned_reward.RewardModelUpdates`, set by the runner

  def __init__(self, config, task, rollouts, reference):
    self.config, self.task, self.rollouts, self.reference = config, task, rollouts, reference

  def rows_per_step(self) -> int:
    return FLAGS.batch_size * FLAGS.group_size

  def init_params(self, policy, key):
    """The pytree the optimiser trains, from the start policy's params."""
    del key
    return policy

  def policy(self, params):
    """The policy's params inside the trained pytree (evaluated and exported)."""
    return params

  def optimizer(self, total_updates: int, warmup: int) -> optax.GradientTransformation:
    return _optimizer(FLAGS.learning_rate, total_updates, warmup)

  def prepare(self, start_policy, key) -> dict:
    """Builds offline data from the start policy; returns stats to log. Online methods do nothing."""
    del start_policy, key
    return {}

  @abc.abstractmethod
  def objective(self):
    """The `(params, batch, totals) -> (loss, metrics)` objective, static keywords bound."""

  @abc.abstractmethod
  def collect(self, params, position: int, key):
    """`(batch, stats, next_position)`: one step's training rows; `position` counts data consumed."""


def _optimizer(learning_rate: float, total_updates: int, warmup: int) -> optax.GradientTransformation:
  return training.make_optimizer(
      learning_rate, warmup_steps=warmup, total_steps=total_updates,
      schedule=FLAGS.lr_schedule if total_updates > warmup + 1 else "constant",
      weight_decay=FLAGS.weight_decay, max_grad_norm=FLAGS.max_grad_norm or None)
