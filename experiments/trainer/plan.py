"""The shape of stage 2 before anything runs: how a step's rows form minibatches and optimiser steps, and which
configs a placement can run. Pure functions of the config, the method and the mesh (RunError with one line); the
loop runs by them and `programs` compiles by them."""

import jax

from experiments import methods as methods_lib
from experiments.runner import config as config_lib
from experiments.runner import placement as placement_lib

RunError = config_lib.RunError


def update_plan(method: methods_lib.Method):
  """`(minibatch rows, optimiser steps per step, optimiser)` of stage 2: the schedule spans the run's updates."""
  cfg = method.config
  algo = cfg.algorithm
  rows = method.rows_per_step()
  minibatch = algo.minibatch_size or rows  # divides the rows, and by grad_accum_steps (`config.check`)
  # Length buckets cut a minibatch by length, not into --grad_accum_steps whole-group parts (`bucketed_update`)
  if method.bucketed_update() is None and minibatch % (method.rows_per_item * algo.grad_accum_steps):
    raise RunError(f"--algo={method.name}: micro-batches of {minibatch // algo.grad_accum_steps} rows split its "
                   f"groups of {method.rows_per_item} rows")
  updates_per_step = algo.num_epochs * rows // minibatch
  total_updates = cfg.optim.steps * updates_per_step
  warmup = min(cfg.optim.warmup_steps, total_updates // 2)  # short runs (smoke tests) still warm up and decay
  return minibatch, updates_per_step, method.optimizer(total_updates, warmup)


def check_divisible(config: config_lib.Config, data_parallel: int) -> None:
  """Rows split evenly over the mesh's data axes (data x fsdp)."""
  if data_parallel == 1:
    return
  algo = config.algorithm
  minibatch = algo.minibatch_size or config.rows_per_step
  # The engine fills its slots from any number of prompts in one process (several provide their own rows).
  prompts = {} if config.rollout.sampler == "engine" and jax.process_count() == 1 else {
      "--batch_size": config.rollout.batch_size, "--eval_batch_size": config.eval.eval_batch_size}
  sizes = {**prompts,
           "rows per micro-batch (minibatch / grad_accum_steps)": minibatch // algo.grad_accum_steps,
           "SFT rows per micro-batch (sft_batch_size / grad_accum_steps)":
               config.sft.sft_batch_size // algo.grad_accum_steps}
  for name, size in sizes.items():
    if size % data_parallel:
      raise RunError(f"{name} = {size} must be a multiple of the mesh's data-parallel size {data_parallel}")


def check_placement(config: config_lib.Config, placement: placement_lib.Placement) -> None:
  """What runs on one device only is refused, with one line, on a mesh or several processes."""
  if placement.mesh is None:
    return
  if config.algorithm.algo == "flow_grpo":
    raise RunError("--algo=flow_grpo runs on one device: its agent loop samples turn by turn outside the mesh; "
                   "leave --mesh empty and run one process")
  if config.reward_model.iterations > 1 and jax.process_count() > 1:
    raise RunError("--iterations > 1 (reward-model retraining) runs in one process only for now")
  check_divisible(config, placement.data_parallel)
