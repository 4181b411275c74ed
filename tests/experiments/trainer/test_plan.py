"""Stage 2's plan (`experiments/trainer/plan.py`): minibatch rows, optimiser steps per step and the schedule's
length, worked by hand; the one-line refusals of rows a mesh cannot split and of single-device methods."""

import types

import pytest

from experiments.runner import config as config_lib
from experiments.trainer import plan


class _Method:
  """What `update_plan` reads of a method: its config, rows per step and item, layout, optimiser factory."""
  name = "m"

  def __init__(self, config, rows_per_item=1):
    self.config, self.rows_per_item, self.built = config, rows_per_item, None

  def rows_per_step(self):
    return self.config.rows_per_step

  def bucketed_update(self):  # the padded layout: a minibatch splits into --grad_accum_steps whole-item parts
    return None

  def optimizer(self, total_updates, warmup):
    self.built = (total_updates, warmup)
    return "optimizer"


def test_update_plan_by_hand():
  # 4 prompts x 8 samples = 32 rows in minibatches of 8, 2 epochs: 8 optimiser steps a step, 80 in 10 steps;
  # the warm-up (30) fits in half of them (40)
  cfg = config_lib.Config().replace(batch_size=4, group_size=8, minibatch_size=8, num_epochs=2, steps=10,
                                    warmup_steps=30)
  method = _Method(cfg)
  assert plan.update_plan(method) == (8, 8, "optimizer") and method.built == (80, 30)
  # a short run: the warm-up is cut to half of its updates (here 1 step of 1 minibatch: 0), so it still decays
  cfg = config_lib.Config().replace(batch_size=4, group_size=8, steps=1, warmup_steps=30)
  method = _Method(cfg)
  assert plan.update_plan(method) == (32, 1, "optimizer") and method.built == (1, 0)


def test_update_plan_keeps_items_whole():
  cfg = config_lib.Config().replace(batch_size=3, group_size=2, minibatch_size=3)  # 6 rows, minibatches of 3
  with pytest.raises(config_lib.RunError, match="micro-batches of 3 rows split its groups of 2 rows"):
    plan.update_plan(_Method(cfg, rows_per_item=2))


def test_check_divisible_names_the_size():
  cfg = config_lib.Config().replace(batch_size=4, group_size=8, eval_batch_size=8, sampler="static")
  plan.check_divisible(cfg, 1)
  plan.check_divisible(cfg, 4)
  with pytest.raises(config_lib.RunError, match="--batch_size = 4 must be a multiple of the mesh's data-parallel "
                                                "size 8"):
    plan.check_divisible(cfg, 8)


def test_check_placement_refuses_single_device_methods_on_a_mesh():
  mesh = types.SimpleNamespace(mesh=object(), data_parallel=1)
  cfg = config_lib.Config().replace(algo="flow_grpo")
  plan.check_placement(cfg, types.SimpleNamespace(mesh=None, data_parallel=1))  # one device: nothing to refuse
  with pytest.raises(config_lib.RunError, match="--algo=flow_grpo runs on one device"):
    plan.check_placement(cfg, mesh)
