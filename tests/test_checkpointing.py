import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax import training
from grpo_jax.training import checkpointing
from tests.conftest import HANG_GUARD_S


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
  with pytest.raises(checkpointing.CheckpointError, match="saved by a different run"):
    ckpt.restore(jax.tree.map(lambda x: x, wrong))


# Across device counts: saved on 1 device, restored on a (2, 2, 2) mesh of 8 (a child process), saved
# there and restored on 1 again.

_MODEL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8)


def _model_state(shift: float):
  from grpo_jax import models
  params = models.init_params(models.ModelConfig(**_MODEL), jax.random.key(0))
  state = training.init_train_state(params, optax.adam(0.1))
  return jax.tree.map(lambda x: x + shift if jnp.issubdtype(x.dtype, jnp.floating) else x, state)


def _on_eight_devices(directory: str):
  """Child: restore step 1 onto the mesh, check, save step 2 from the mesh."""
  from grpo_jax import partitioning
  assert jax.device_count() == 8
  mesh, rules = partitioning.make_mesh("data:2,fsdp:2,tensor:2"), partitioning.get_rules("fsdp_tp")
  abstract = jax.eval_shape(lambda: _model_state(1.0))
  shardings = partitioning.state_shardings(mesh, rules, abstract)
  ckpt = training.Checkpointer(directory)
  state, meta = ckpt.restore(abstract, step=1, shardings=shardings)
  assert meta == {"step": 1}
  jax.tree.map(np.testing.assert_array_equal, state, _model_state(1.0))
  embedding = state.params["embed"]["embedding"]
  assert embedding.sharding == shardings.params["embed"]["embedding"]
  assert embedding.addressable_shards[0].data.shape == (32, 16)
  ckpt.save(2, jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), out_shardings=shardings)(state), {"step": 2})
  ckpt.close()


def test_restore_across_device_counts(tmp_path):
  ckpt = training.Checkpointer(tmp_path / "ckpt")
  ckpt.save(1, _model_state(1.0), {"step": 1})
  env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1]), JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join(
      [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"]))
  child = subprocess.run([sys.executable, __file__, str(tmp_path / "ckpt")], env=env, capture_output=True,
                         text=True, timeout=HANG_GUARD_S)
  assert child.returncode == 0, child.stderr[-4000:]
  state, meta = ckpt.restore(_model_state(0.0), step=2)
  assert meta == {"step": 2}
  expected = jax.tree.map(lambda x: x + 1, _model_state(1.0))
  jax.tree.map(np.testing.assert_array_equal, state, expected)
  assert state.params["embed"]["embedding"].sharding == _model_state(0.0).params["embed"]["embedding"].sharding


if __name__ == "__main__":
  _on_eight_devices(sys.argv[1])
