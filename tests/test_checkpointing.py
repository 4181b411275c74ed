import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax import training
from grpo_jax.training import checkpointing


def _state(value):
  params = {"w": jnp.full((3,), value), "b": jnp.zeros((2,))}
  return training.init_train_state(params, optax.adam(0.1))


def test_round_trip_and_keep_last(tmp_path):
  ckpt = training.Checkpointer(tmp_path / "ckpt", max_to_keep=2)
  for step in (1, 2, 3):
    ckpt.save(step, _state(float(step)), {"step": step, "data_position": 10 * step, "key": [0, step]})
  assert ckpt.latest_step() == 3
  assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit()) == ["2", "3"]
  state, meta = ckpt.restore(_state(0.0))
  np.testing.assert_array_equal(state.params["w"], [3.0, 3.0, 3.0])
  assert meta == {"step": 3, "data_position": 30, "key": [0, 3]}
  state2, _ = ckpt.restore(_state(0.0), step=2)
  np.testing.assert_array_equal(state2.params["w"], [2.0, 2.0, 2.0])
  ckpt.close()


def test_refuses_non_finite_state_and_keeps_the_good_one(tmp_path):
  ckpt = training.Checkpointer(tmp_path / "ckpt")
  ckpt.save(1, _state(1.0), {"step": 1})
  with pytest.raises(FloatingPointError, match="NaN or inf"):
    ckpt.save(2, _state(float("nan")), {"step": 2})
  assert ckpt.latest_step() == 1
  state, _ = ckpt.restore(_state(0.0))
  np.testing.assert_array_equal(state.params["w"], [1.0, 1.0, 1.0])


def test_restore_errors(tmp_path):
  ckpt = training.Checkpointer(tmp_path / "empty")
  with pytest.raises(checkpointing.CheckpointError, match="no checkpoint to resume from"):
    ckpt.restore(_state(0.0))
  ckpt.save(1, _state(1.0), {"step": 1})
  wrong = training.init_train_state({"w": jnp.zeros((5,))}, optax.adam(0.1))
  with pytest.raises(checkpointing.CheckpointError, match="does not match this run"):
    ckpt.restore(jax.tree.map(lambda x: x, wrong))
