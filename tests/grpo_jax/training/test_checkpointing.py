import os
import pathlib
import shutil
import subprocess
import sys
import threading

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


def _trained_state(value):
  """`_state(value)` after one Adam step on the gradient `value` everywhere: step 1, moments m = 0.1·value and
  v = 0.001·value², none of them the template's zeros."""
  state = _state(value)
  grads = jax.tree.map(lambda x: jnp.full_like(x, value), state.params)
  updates, opt_state = optax.adam(0.1).update(grads, state.opt_state, state.params)
  return state._replace(step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state)


def test_round_trip_and_keep_last(tmp_path):
  ckpt = training.Checkpointer(tmp_path / "ckpt", max_to_keep=2)
  for step in (1, 2, 3):
    ckpt.save(step, _trained_state(float(step)), {"step": step, "data_position": 10 * step, "key": [0, step]})
  assert ckpt.latest_step() == 3
  assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit()) == ["2", "3"]
  state, meta = ckpt.restore(_state(0.0))
  jax.tree.map(np.testing.assert_array_equal, state, _trained_state(3.0))  # step, params and Adam's moments
  np.testing.assert_allclose(state.params["w"], [2.9, 2.9, 2.9], rtol=1e-6)  # 3 − lr·m̂/√v̂ = 3 − 0.1
  np.testing.assert_allclose(state.opt_state[0].mu["w"], [0.3, 0.3, 0.3], rtol=1e-6)  # (1 − β1)·3
  assert int(state.step) == 1
  assert meta == {"step": 3, "data_position": 30, "key": [0, 3]}
  state2, _ = ckpt.restore(_state(0.0), step=2)
  jax.tree.map(np.testing.assert_array_equal, state2, _trained_state(2.0))
  ckpt.close()


def test_refuses_non_finite_state_and_keeps_the_good_one(tmp_path):
  ckpt = training.Checkpointer(tmp_path / "ckpt")
  ckpt.save(1, _state(1.0), {"step": 1})
  with pytest.raises(FloatingPointError, match="NaN or inf"):
    ckpt.save(2, _state(float("nan")), {"step": 2})
  assert ckpt.latest_step() == 1
  state, _ = ckpt.restore(_state(0.0))
  np.testing.assert_array_equal(state.params["w"], [1.0, 1.0, 1.0])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("bad", [float("nan"), float("-inf"), float("inf")])
def test_one_non_finite_element_anywhere_is_refused(tmp_path, dtype, bad):
  ckpt = training.Checkpointer(tmp_path / "ckpt")
  big = jnp.full((1000,), 3.0e38 if dtype == jnp.float32 else -3.0e38, dtype)  # finite, the dtype's largest range
  assert checkpointing._all_finite({"a": big, "b": jnp.zeros((0,), dtype), "n": jnp.arange(3)})
  with pytest.raises(FloatingPointError, match="NaN or inf"):
    ckpt.save(1, {"a": big, "b": jnp.ones((7,), dtype).at[5].set(bad)}, {"step": 1})
  assert ckpt.all_steps() == []


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
  env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[3]), JAX_PLATFORMS="cpu",
             XLA_FLAGS=" ".join([os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"]))
  child = subprocess.run([sys.executable, __file__, str(tmp_path / "ckpt")], env=env, capture_output=True,
                         text=True, timeout=HANG_GUARD_S)
  assert child.returncode == 0, child.stderr[-4000:]
  state, meta = ckpt.restore(_model_state(0.0), step=2)
  assert meta == {"step": 2}
  expected = jax.tree.map(lambda x: x + 1, _model_state(1.0))
  jax.tree.map(np.testing.assert_array_equal, state, expected)
  assert state.params["embed"]["embedding"].sharding == _model_state(0.0).params["embed"]["embedding"].sharding


REPO = pathlib.Path(__file__).resolve().parents[3]


def _child_env():
  env = dict(os.environ, PYTHONPATH=str(REPO))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the child's only writes are the checkpoint's
  return env


_OVER_THE_LIMIT = """
import resource, signal, sys
import numpy as np
from grpo_jax.training import checkpointing
ckpt = checkpointing.Checkpointer(sys.argv[1])
ckpt.save(1, {"w": np.ones(1000, np.float32)}, {"step": 1})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
  ckpt.save(2, {"w": np.random.default_rng(0).standard_normal(2**20).astype(np.float32)}, {"step": 2})
except checkpointing.CheckpointSaveError as err:
  print(err)
"""


def test_a_failed_write_is_one_line_and_leaves_the_previous_step_alone(tmp_path):
  """A real write failure (a 4 MiB array past a 1 MiB file-size limit: EFBIG from the kernel) in orbax's writer
  threads: one line naming the directory, the cause and the free space; no traceback from any thread; the
  temporary directory removed; step 1 intact."""
  directory = tmp_path / "ckpt"
  child = subprocess.run([sys.executable, "-c", _OVER_THE_LIMIT, str(directory)], cwd=REPO, env=_child_env(),
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
  assert child.returncode == 0 and child.stderr == "", child.stderr[-3000:]
  usage = shutil.disk_usage(tmp_path)
  assert child.stdout.startswith(f"cannot save checkpoint step 2 in {directory}: File too large [EFBIG] (")
  assert child.stdout.endswith(f" MiB free of {usage.total / 2**20:,.1f} MiB there); checkpoint step 1 is intact\n")
  assert sorted(p.name for p in directory.iterdir()) == ["1"]
  state, meta = training.Checkpointer(directory).restore({"w": np.zeros(1000, np.float32)})
  np.testing.assert_array_equal(state["w"], np.ones(1000, np.float32))
  assert meta == {"step": 1}


def test_a_killed_saves_temporary_directory_is_removed_on_start(tmp_path):
  ckpt = training.Checkpointer(tmp_path / "ckpt")
  ckpt.save(1, _state(1.0), {"step": 1})
  ckpt.close()
  partial = tmp_path / "ckpt" / "2.orbax-checkpoint-tmp"  # orbax's name for step 2 being written
  (partial / "state").mkdir(parents=True)
  (partial / "state" / "half_written").write_bytes(b"x" * 1000)
  ckpt = training.Checkpointer(tmp_path / "ckpt")
  assert not partial.exists() and ckpt.all_steps() == [1]
  ckpt.close()


def _unshare_works() -> bool:
  try:
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=60).returncode == 0
  except (OSError, subprocess.SubprocessError):
    return False


_READ_ONLY = """
import subprocess, sys
import numpy as np
from grpo_jax.training import checkpointing
ckpt = checkpointing.Checkpointer(sys.argv[1] + "/ckpt")
ckpt.save(1, {"w": np.ones(1000, np.float32)}, {"step": 1})
subprocess.run(["mount", "-o", "remount,ro", sys.argv[1]], check=True)
try:
  ckpt.save(2, {"w": np.ones(1000, np.float32)}, {"step": 2})
except checkpointing.CheckpointSaveError as err:
  print(err)
print(sorted(p.name for p in ckpt.directory.iterdir()))
"""


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -rm` (user and mount namespaces) for a tmpfs")
def test_a_work_dir_made_read_only_is_one_line(tmp_path):
  """A tmpfs (in a mount namespace of its own) remounted read-only between two saves."""
  (tmp_path / "mnt").mkdir()
  script = 'mount -t tmpfs -o size=4m tmpfs "$MNT" && "$PYTHON" -c "$CODE" "$MNT"'
  env = dict(_child_env(), MNT=str(tmp_path / "mnt"), PYTHON=sys.executable, CODE=_READ_ONLY)
  child = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=HANG_GUARD_S)
  assert child.returncode == 0 and child.stderr == "", child.stderr[-3000:]
  assert child.stdout == (f"cannot save checkpoint step 2 in {tmp_path / 'mnt' / 'ckpt'}: Read-only file system "
                          f"[EROFS] (4.0 MiB free of 4.0 MiB there); checkpoint step 1 is intact\n['1']\n")


_FULL_DISK_RUN = r"""
set -u
mount -t tmpfs -o size=8m tmpfs "$MNT"
run() { "$PYTHON" -m experiments.grpo_math $ARGS --work_dir="$MNT/run" "$@"; }
run --stop_after=2 2> "$OUT/first.err" || { echo "first run failed"; exit 1; }
"$PYTHON" -c "$FILL" "$MNT"
run --resume 2> "$OUT/second.err"
echo $? > "$OUT/second.code"
cp -r "$MNT/run" "$OUT/run"
"""


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -rm` (user and mount namespaces) for a tmpfs")
def test_a_run_whose_disk_fills_up_stops_with_one_line(tmp_path):
  """The runner on a real 8 MiB tmpfs (in a mount namespace of its own), filled up to 96 KiB after a run saved
  step 2: the resumed run's save of step 4 fails; one line, exit status 1, step 2 intact, no temporary directory."""
  from grpo_jax import models  # pylint: disable=import-outside-toplevel
  policy = models.build_default_checkpoint(tmp_path / "policy", num_hidden_layers=1, hidden_size=32,
                                           intermediate_size=96)
  args = ["--max_prompt_len=16", "--max_new_tokens=16", "--num_train=200", "--num_test=8", "--batch_size=4",
          "--group_size=4", "--eval_batch_size=8", "--tensorboard=false", "--steps=4", "--save_every=2",
          "--eval_every=0", f"--init_checkpoint={policy}"]
  (tmp_path / "mnt").mkdir()
  fill = ("import os, sys; s = os.statvfs(sys.argv[1]); "
          "open(sys.argv[1] + '/filler', 'wb').write(b'0' * (s.f_bavail * s.f_frsize - 96 * 1024))")
  env = dict(_child_env(), MNT=str(tmp_path / "mnt"), OUT=str(tmp_path), PYTHON=sys.executable, ARGS=" ".join(args),
             FILL=fill)
  result = subprocess.run(["unshare", "-rm", "sh", "-c", _FULL_DISK_RUN], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)
  assert result.returncode == 0, result.stdout + result.stderr + (tmp_path / "first.err").read_text()[-3000:]
  err = (tmp_path / "second.err").read_text()
  assert (tmp_path / "second.code").read_text().strip() == "1", err[-3000:]
  assert "Traceback" not in err and "ERROR:absl" not in err, err[-3000:]
  last = err.strip().splitlines()[-1]
  where = tmp_path / "mnt" / "run" / "checkpoints"
  assert last.startswith(f"grpo_math: error: cannot save checkpoint step 4 in {where}: No space left on device "
                         f"[ENOSPC] ("), last
  assert last.endswith(" MiB free of 8.0 MiB there); checkpoint step 2 is intact"), last
  checkpoints = tmp_path / "run" / "checkpoints"
  assert sorted(p.name for p in checkpoints.iterdir()) == ["2"]  # no step 4, no temporary directory
  meta = training.Checkpointer(checkpoints).metadata(2)
  assert meta["step"] == 2


if __name__ == "__main__":
  _on_eight_devices(sys.argv[1])


def test_a_save_copies_at_most_host_transfer_gb_to_the_host_at_once(tmp_path, monkeypatch):
  """The state goes device -> host in batches of at most `host_transfer_gb` (an array larger than it alone), each
  written before the next is copied; the default orbax path copies all of it at once. Restores bit-identical."""
  from orbax.checkpoint._src.serialization import replica_slices  # pylint: disable=import-outside-toplevel
  batches = []
  transfer = replica_slices.transfer_arrays_to_host

  def recording(arrays, *args, **kwargs):
    batches.append(sorted(int(a.nbytes) for a in arrays))
    return transfer(arrays, *args, **kwargs)

  monkeypatch.setattr(replica_slices, "transfer_arrays_to_host", recording)
  mib = 2**20 // 4  # float32 elements in 1 MiB
  tree = {"a": jnp.arange(3 * mib, dtype=jnp.float32), **{f"w{i}": jnp.full((mib,), i, jnp.float32) for i in range(6)},
          "replay": np.arange(5, dtype=np.int64)}
  ckpt = training.Checkpointer(tmp_path / "ckpt", host_transfer_gb=2.5 * 2**20 / 1e9)
  ckpt.save(1, tree, {"step": 1})
  arrays = sorted(b for batch in batches for b in batch)
  assert arrays == [2**20] * 6 + [3 * 2**20]  # every jax.Array once (the NumPy leaf is written from the host)
  assert [3 * 2**20] in batches  # alone: larger than the bound
  assert max(sum(b) for b in batches if b != [3 * 2**20]) <= 2.5 * 2**20 and len(batches) >= 4
  template = jax.tree.map(lambda x: np.zeros_like(x) if isinstance(x, np.ndarray) else jnp.zeros_like(x), tree)
  restored, meta = ckpt.restore(template)
  jax.tree.map(np.testing.assert_array_equal, restored, tree)
  assert isinstance(restored["w0"], jax.Array) and isinstance(restored["replay"], np.ndarray)
  assert meta == {"step": 1}
  ckpt.close()


def test_restores_checkpoints_written_with_standard_save(tmp_path):
  """Checkpoints of earlier versions (orbax's StandardSave) restore bit-identical, and the new ones restore with
  StandardRestore: the files are the same."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  state = {"train": _trained_state(2.0), "replay": {"size": np.asarray(3, np.int64)}}
  options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False)
  manager = ocp.CheckpointManager(tmp_path / "ckpt", options=options)
  manager.save(4, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                          metadata=ocp.args.JsonSave({"step": 4})), force=True)
  manager.wait_until_finished()
  manager.close()
  ckpt = training.Checkpointer(tmp_path / "ckpt")
  restored, meta = ckpt.restore({"train": _state(0.0), "replay": {"size": np.asarray(0, np.int64)}})
  jax.tree.map(np.testing.assert_array_equal, restored, state)
  assert meta == {"step": 4} and int(restored["replay"]["size"]) == 3
  ckpt.save(5, restored, {"step": 5})  # and the new saves go on beside it, in the same format
  assert ckpt.all_steps() == [4, 5]
  ckpt.close()
  manager = ocp.CheckpointManager(tmp_path / "ckpt", options=options)
  back = manager.restore(5, args=ocp.args.Composite(state=ocp.args.StandardRestore(state)))["state"]
  jax.tree.map(np.testing.assert_array_equal, back, state)
  manager.close()


def test_a_save_quiets_orbax_writer_threads_before_it_writes(tmp_path, monkeypatch):
  """A writer thread can fail before the save that started it reports the failure (CI once caught such a traceback
  ahead of a full disk's one line, on a loaded machine): the hook that drops it is in place when orbax starts
  writing, not only after a failed save."""
  monkeypatch.setattr(threading, "excepthook", lambda args: None)  # Python's own, in effect: not quiet
  ckpt = training.Checkpointer(tmp_path / "ckpt")
  quiet_at_write = []
  write = ckpt._manager.save  # pylint: disable=protected-access

  def save(*args, **kwargs):
    quiet_at_write.append(getattr(threading.excepthook, "quiets_orbax", False))
    return write(*args, **kwargs)

  monkeypatch.setattr(ckpt._manager, "save", save)  # pylint: disable=protected-access
  ckpt.save(1, {"w": jnp.ones(3)}, {"step": 1})
  ckpt.close()
  assert quiet_at_write == [True]


def test_after_a_failed_save_orbax_writer_threads_end_quietly(monkeypatch):
  """A full disk fails every one of orbax's writer threads: after the save's one line, a thread that ends with an
  exception inside orbax prints nothing (CI once caught such a traceback after the one line); any other thread's
  exception still reaches the hook there was before."""
  seen = []
  monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(str(args.exc_value)))
  namespace = {}
  exec(compile("def write():\n  raise ValueError('RESOURCE_EXHAUSTED: disk full')\n",  # noqa: S102  (our own code)
               os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "writer.py"), "exec"), namespace)

  def elsewhere():
    raise ValueError("a bug elsewhere")

  def run(target):
    thread = threading.Thread(target=target)
    thread.start()
    thread.join()

  run(namespace["write"])
  assert seen == ["RESOURCE_EXHAUSTED: disk full"]  # before any save: reported as Python does
  checkpointing._quiet_failed_writer_threads()
  checkpointing._quiet_failed_writer_threads()  # installed once
  run(namespace["write"])
  run(elsewhere)
  assert seen == ["RESOURCE_EXHAUSTED: disk full", "a bug elsewhere"]
