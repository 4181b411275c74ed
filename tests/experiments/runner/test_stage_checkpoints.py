"""A stage's checkpoints (`experiments/runner/stage_checkpoints.py`), on a small tree: a save records the step, the
flags and the metrics offset; a restore checks the flags (and the caller's check) before it rewinds the logs; a
save after a stop signal raises `preemption.Interrupted` naming the stage and the directory."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from experiments.runner import preemption
from experiments.runner import stage_checkpoints
from grpo_jax import training


class _Signals:
  signum = 15

  def __init__(self, stop):
    self.stop = stop

  def stop_requested(self):
    return self.stop


def _jsonl_steps(directory):
  return [json.loads(line)["step"] for line in (directory / "metrics.jsonl").read_text().splitlines()]


def test_save_restore_and_interrupt(tmp_path, capsys):
  logger = training.MetricsLogger(tmp_path, 4, tensorboard=False)
  checked = []
  check = lambda flags, step: checked.append((flags, step))  # noqa: E731
  tree = {"w": jnp.arange(3.0)}
  with stage_checkpoints.StageCheckpoints(tmp_path / "ckpt", 2, logger, {"seed": 1}, check, "stage-2",
                                          _Signals(False)) as ckpt:
    assert ckpt.latest_step() is None and not ckpt.stop_requested()
    logger.log(1, {"loss": 1.0})
    ckpt.save(1, tree, {"data_position": 7})
    logger.log(2, {"loss": 2.0})  # after the checkpoint: dropped on restore
  assert _jsonl_steps(tmp_path) == [1, 2]
  logger.close()

  logger = training.MetricsLogger(tmp_path, 4, tensorboard=False)
  seen = []
  with stage_checkpoints.StageCheckpoints(tmp_path / "ckpt", 2, logger, {"seed": 1}, check, "stage-2") as ckpt:
    assert ckpt.latest_step() == 1 and not ckpt.stop_requested()  # no signals: never stopped
    restored, meta = ckpt.restore({"w": jnp.zeros(3)}, check=seen.append)
  np.testing.assert_array_equal(restored["w"], [0.0, 1.0, 2.0])
  assert meta["step"] == 1 and meta["data_position"] == 7 and meta["flags"] == {"seed": 1}
  assert seen == [meta] and checked == [({"seed": 1}, 1)]
  assert capsys.readouterr().err.strip().endswith(
      f"resumed from step 1 in {tmp_path / 'ckpt'} (1 metrics.jsonl records of later steps dropped)")
  logger.close()
  assert _jsonl_steps(tmp_path) == [1]

  logger = training.MetricsLogger(tmp_path, 4, tensorboard=False)
  with stage_checkpoints.StageCheckpoints(tmp_path / "ckpt", 2, logger, {"seed": 1}, check, "SFT",
                                          _Signals(True)) as ckpt:
    assert ckpt.stop_requested()
    with pytest.raises(preemption.Interrupted) as stopped:
      ckpt.save(2, tree, {}, interrupted=True)
    assert ckpt.latest_step() == 2
  logger.close()
  assert (stopped.value.step, stopped.value.stage, stopped.value.saved) == (2, "SFT", tmp_path / "ckpt")


def test_a_refused_checkpoint_leaves_the_logs(tmp_path):
  """The caller's check (e.g. LoRA's base) refuses before the metrics are rewound."""
  logger = training.MetricsLogger(tmp_path, 4, tensorboard=False)
  with stage_checkpoints.StageCheckpoints(tmp_path / "ckpt", 1, logger, {}, lambda *_: None, "stage-2") as ckpt:
    ckpt.save(1, {"w": jnp.ones(2)}, {})
    logger.log(2, {"loss": 2.0})

    def refuse(meta):
      raise ValueError(f"not step {meta['step']}")

    with pytest.raises(ValueError, match="not step 1"):
      ckpt.restore({"w": jnp.zeros(2)}, check=refuse)
  logger.close()
  assert _jsonl_steps(tmp_path) == [2]
