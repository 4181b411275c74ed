"""Training machinery shared by the runners: optimiser, jitted update steps, rollouts, checkpoints, logs."""

from grpo_jax.training.checkpointing import Checkpointer
from grpo_jax.training.logger import MetricsLogger
from grpo_jax.training.optimizer import make_optimizer
from grpo_jax.training.rollout import Batch, PPOBatch, batch_from_samples, encode_prompts, pad_left, supervised_batch
from grpo_jax.training.update import TrainState, grpo_objective, init_train_state, make_train_step, sft_objective

__all__ = (
    "Batch",
    "PPOBatch",
    "Checkpointer",
    "MetricsLogger",
    "TrainState",
    "batch_from_samples",
    "encode_prompts",
    "grpo_objective",
    "init_train_state",
    "make_optimizer",
    "make_train_step",
    "pad_left",
    "sft_objective",
    "supervised_batch",
)
