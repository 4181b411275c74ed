"""A run's metric logs: `metrics.jsonl`, TensorBoard and W&B (`training.MetricsLogger`), opened the same way by
every runner. `check` runs before the run writes anything, so that a missing wandb package or a damaged
`wandb_run_id` file is one line and nothing is written; `start` starts (or, on `--resume`, continues) the W&B run
on the main process and returns the logger."""

import os

from experiments.runner import config as config_lib
from grpo_jax import distributed
from grpo_jax import training


def check(directory: str | os.PathLike, run: config_lib.RunConfig) -> None:
  """Before anything is written: wandb importable, and on `--resume` the stored run id readable (ValueError with
  one line)."""
  if run.wandb_project and distributed.is_main_process():
    try:
      training.wandb_run.check_installed()
    except training.wandb_run.NotInstalledError as err:
      raise config_lib.RunError(f"{err}, or leave --wandb_project empty") from None
    if run.resume:
      training.wandb_run.stored_run_id(directory)


def start(directory: str | os.PathLike, run: config_lib.RunConfig, record: dict,
          total_steps: int) -> training.MetricsLogger:
  """The run's logger in `directory`, with W&B when `--wandb_project` is set (main process only): the run's config
  `record` attached, and on `--resume` the W&B run whose id `directory` holds continued."""
  wandb = None
  if run.wandb_project and distributed.is_main_process():
    try:
      wandb = training.wandb_run.start(directory, run.wandb_project, record, resume=run.resume,
                                       mode=run.wandb_mode, entity=run.wandb_entity, name=run.wandb_run_name)
    except training.wandb_run.StartError as err:  # the library's advice, in this runner's flags
      raise config_lib.RunError(f"W&B could not start the run ({err.cause}); log in (wandb login), or log offline "
                                "with --wandb_mode=offline and upload later with `wandb sync`") from None
  return training.MetricsLogger(directory, total_steps, tensorboard=run.tensorboard, wandb_run=wandb)
