"""Training machinery shared by the runners: optimiser, jitted update steps, rollouts, checkpoints, logs."""

from grpo_jax.train_state import TrainState, init_train_state
from grpo_jax.training.atomic_dir import atomic_directory, atomic_write_text
from grpo_jax.training.checkpointing import Checkpointer
from grpo_jax.training.logger import MetricsLogger, end_progress_line
from grpo_jax.training.optimizer import make_optimizer
from grpo_jax.training.batch import Batch, PPOBatch, batch_from_samples, encode_prompts, pad_left, supervised_batch
from grpo_jax.training.update import distill_objective, grpo_objective, make_train_step, sft_objective
from grpo_jax.training import wandb_run

__all__ = (
    "Batch",
    "PPOBatch",
    "Checkpointer",
    "MetricsLogger",
    "TrainState",
    "atomic_directory",
    "atomic_write_text",
    "batch_from_samples",
    "encode_prompts",
    "end_progress_line",
    "distill_objective",
    "grpo_objective",
    "init_train_state",
    "make_optimizer",
    "make_train_step",
    "pad_left",
    "sft_objective",
    "supervised_batch",
    "wandb_run",
)
