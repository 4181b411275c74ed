"""The runners' optimiser: AdamW with warm-up, then the configured schedule, as every stage-2 method and the
reward-model trainer build it (the same rule for a run too short to decay)."""

import optax

from experiments.runner import config as config_lib
from grpo_jax import training


def make_optimizer(optim: config_lib.OptimConfig, learning_rate: float, total_updates: int,
                   warmup: int) -> optax.GradientTransformation:
  """AdamW at peak `learning_rate` with `warmup` linear warm-up steps, then `--lr_schedule` over `total_updates`
  (constant when the run is too short to decay: `total_updates <= warmup + 1`); `--weight_decay` and
  `--max_grad_norm` (0: no clipping) from `optim`."""
  return training.make_optimizer(
      learning_rate, warmup_steps=warmup, total_steps=total_updates,
      schedule=optim.lr_schedule if total_updates > warmup + 1 else "constant",
      weight_decay=optim.weight_decay, max_grad_norm=optim.max_grad_norm or None)
