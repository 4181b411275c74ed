"""Multi-process runs (distributed.py): two processes with 4 CPU devices each, gloo collectives."""

import os
import pathlib
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from grpo_jax import distributed
from grpo_jax import logprobs
from grpo_jax import losses
from grpo_jax import models
from grpo_jax import sampling
from grpo_jax import partitioning
from grpo_jax import training
from grpo_jax.training import update as update_lib
from tests.conftest import HANG_GUARD_S

CONFIG = models.ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, eos_token_ids=(1,),
                            pad_token_id=0)
PROMPTS = np.array([[5, 6, 7, 8], [0, 9, 10, 11], [0, 0, 12, 13], [14, 15, 16, 17]], np.int32)
GROUP, NEW_TOKENS, STEPS = 2, 6, 3


def _grpo_steps(mesh_spec: str | None, rules_name: str = "fsdp_tp"):
  """A few GRPO steps (sample, score, reference log-probs, update) on one device or on a global mesh.

  Each process contributes its own rows of the prompts; the samples come back to every process.
  """
  key = jax.random.key(0)
  optimizer = training.make_optimizer(1e-2, eps=1e-3)  # eps >> |g|: Adam does not amplify rounding
  objective = update_lib.bind(training.grpo_objective, config=CONFIG, use_reference=True, chunk_size=4,
                              loss_kwargs=dict(epsilon=0.2, beta=0.04))
  if mesh_spec is None:
    mesh = rules = None
    params = partitioning.init_params(CONFIG, key, partitioning.single_device_mesh(),
                                      partitioning.get_rules(rules_name))
    state = training.init_train_state(params, optimizer)
    step = training.make_train_step(objective, optimizer)
    rows = lambda tree: tree
  else:
    mesh, rules = partitioning.make_mesh(mesh_spec), partitioning.get_rules(rules_name)
    params = partitioning.init_params(CONFIG, key, mesh, rules)
    state, shardings = partitioning.init_train_state(params, optimizer, mesh, rules)
    batch_sharding = partitioning.batch_sharding(mesh, rules)
    step = training.make_train_step(objective, optimizer, state_shardings=shardings, batch_shardings=batch_sharding,
                                    mesh=mesh, rules=rules)
    rows = lambda tree: distributed.global_batch(
        jax.tree.map(lambda x: x[distributed.process_rows(len(x), batch_sharding)], tree), batch_sharding)
  reference = jax.tree.map(jnp.copy, params)
  ref_logprobs = logprobs.jit_token_logprobs(CONFIG, mesh=mesh, rules=rules, chunk_size=4)
  all_tokens = []
  for t in range(STEPS):
    prompts = rows({"tokens": PROMPTS, "mask": PROMPTS != 0})
    samples = sampling.sample(state.params, CONFIG, prompts["tokens"], prompts["mask"], jax.random.fold_in(key, t),
                              num_samples=GROUP, max_new_tokens=NEW_TOKENS, mesh=mesh, rules=rules)
    samples = distributed.all_gather(samples)  # host copies on every process
    rewards = (samples.tokens % 2 == 0).sum(-1).astype(np.float32)  # a toy rule reward: even token ids
    advantages = np.asarray(losses.group_advantages(rewards.reshape(-1, GROUP))).reshape(-1)
    tokens, mask = map(np.asarray, logprobs.sequences_from_samples(samples))
    ref = distributed.all_gather(ref_logprobs(reference, *rows((tokens, mask))))[:, PROMPTS.shape[1]:]
    batch = training.batch_from_samples(samples, jnp.asarray(samples.mask), jnp.asarray(samples.logprobs),
                                        jnp.asarray(ref), jnp.asarray(advantages))
    state, metrics = step(state, rows(jax.tree.map(np.asarray, batch)))
    all_tokens.append(samples.tokens)
  return state, np.stack(all_tokens), float(metrics["loss"])


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _spawn(mode: str, out: pathlib.Path, port: int) -> list[subprocess.Popen]:
  procs = []
  for pid in range(2):
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[2]), JAX_PLATFORMS="cpu",
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(pid), XLA_FLAGS=" ".join(
                   [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=4"]))
    procs.append(subprocess.Popen([sys.executable, __file__, mode, str(out)], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True))
  return procs


def test_two_processes_end_with_the_single_process_params(tmp_path):
  procs = _spawn("grpo", tmp_path, _free_port())
  expected_state, expected_tokens, expected_loss = _grpo_steps(None)
  expected_params = expected_state.params
  logs = [p.communicate(timeout=HANG_GUARD_S)[0] for p in procs]
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-4000:]
  results = [np.load(tmp_path / f"process_{i}.npz") for i in range(2)]
  for name in results[0].files:  # every process holds the same global result
    np.testing.assert_array_equal(results[0][name], results[1][name])
  np.testing.assert_array_equal(results[0]["tokens"], expected_tokens)
  np.testing.assert_allclose(results[0]["loss"], expected_loss, rtol=1e-5, atol=1e-6)
  leaves = jax.tree.leaves(expected_params)
  assert len(leaves) == len(results[0].files) - 2
  for i, leaf in enumerate(leaves):
    np.testing.assert_allclose(results[0][f"param_{i}"], leaf, rtol=1e-5, atol=1e-5)
  # The checkpoint the two processes saved together restores here, on one device.
  restored, meta = training.Checkpointer(tmp_path / "ckpt").restore(expected_state)
  assert meta == {"step": STEPS}
  for i, leaf in enumerate(jax.tree.leaves(restored.params)):
    np.testing.assert_array_equal(leaf, results[0][f"param_{i}"])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), restored, expected_state)


def _dp_samples(mesh_spec: str | None):
  """8 prompts x G 2 sampled with the weights whole on every device (`dp`): each data shard runs its own loop."""
  prompts = np.concatenate([PROMPTS, np.where(PROMPTS != 0, PROMPTS + 10, 0)])
  key, rules = jax.random.key(5), partitioning.get_rules("dp")
  kwargs = dict(num_samples=GROUP, max_new_tokens=NEW_TOKENS, temperature=0.8)
  if mesh_spec is None:
    params = partitioning.init_params(CONFIG, jax.random.key(0), partitioning.single_device_mesh(), rules)
    out = sampling.sample(params, CONFIG, prompts, prompts != 0, key, **kwargs)
  else:
    mesh = partitioning.make_mesh(mesh_spec)
    params = partitioning.init_params(CONFIG, jax.random.key(0), mesh, rules)
    sharding = partitioning.batch_sharding(mesh, rules)
    rows = distributed.global_batch({"tokens": prompts[distributed.process_rows(8, sharding)],
                                     "mask": (prompts != 0)[distributed.process_rows(8, sharding)]}, sharding)
    out = distributed.all_gather(sampling.sample(params, CONFIG, rows["tokens"], rows["mask"], key, mesh=mesh,
                                                 rules=rules, **kwargs))
  return {name: np.asarray(getattr(out, name)) for name in ("tokens", "logprobs", "lengths")}


def test_two_processes_sample_as_one_device_with_whole_weights(tmp_path):
  """The sampler's per-shard loops (`shard_map`, weights whole) over two processes: one device's samples."""
  procs = _spawn("sample", tmp_path, _free_port())
  expected = _dp_samples(None)
  logs = [p.communicate(timeout=HANG_GUARD_S)[0] for p in procs]
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-4000:]
  for i in range(2):
    got = np.load(tmp_path / f"samples_{i}.npz")
    np.testing.assert_array_equal(got["tokens"], expected["tokens"])
    np.testing.assert_array_equal(got["lengths"], expected["lengths"])
    np.testing.assert_allclose(got["logprobs"], expected["logprobs"], atol=1e-5)
  assert expected["tokens"].shape == (16, NEW_TOKENS) and len(np.unique(expected["tokens"])) > 4  # really sampled


EXPORT_CONFIG = CONFIG.replace(num_hidden_layers=2, scan_layers=True, qkv_bias=True)


def test_two_processes_export_tensor_by_tensor(tmp_path):
  """`policy.export` over two processes (fsdp x tensor, stacked layers): the file one process writes is the one a
  single process writes, and each collective gathers one tensor (a layer's slice), never the whole model."""
  procs = _spawn("export", tmp_path, _free_port())
  params = partitioning.init_params(EXPORT_CONFIG, jax.random.key(3), partitioning.single_device_mesh(),
                                    partitioning.get_rules("fsdp_tp"))
  models.save_hf(params, EXPORT_CONFIG, tmp_path / "single")
  logs = [p.communicate(timeout=HANG_GUARD_S)[0] for p in procs]
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-4000:]
  written = (tmp_path / "exported" / "model.safetensors").read_bytes()
  assert written == (tmp_path / "single" / "model.safetensors").read_bytes()
  tensors = safetensors.numpy.load_file(tmp_path / "single" / "model.safetensors")
  largest = max(t.nbytes for t in tensors.values())
  for i in range(2):
    gathers = np.load(tmp_path / f"gathers_{i}.npy")
    assert len(gathers) == len(tensors) and gathers.max() == largest, gathers  # one tensor a gather
  whole = sum(x.nbytes for x in jax.tree.leaves(params))
  assert largest < whole / 4  # a gather of the whole tree (as before) would fail the line above


def test_a_dead_process_stops_the_other(tmp_path):
  procs = _spawn("die", tmp_path, _free_port())
  logs = [p.communicate(timeout=HANG_GUARD_S)[0] for p in procs]
  assert procs[1].returncode == 3, logs[1][-3000:]
  assert procs[0].returncode not in (0, None), logs[0][-3000:]  # an error, not a hang or a success
  assert "survivor finished" not in logs[0]  # stopped within its 600 s loop (the heartbeat timeout is 5 s)


def test_initialize_arguments(monkeypatch):
  for name in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES, distributed.ENV_PROCESS_ID):
    monkeypatch.delenv(name, raising=False)
  assert distributed.initialize() is False  # single process: nothing to join
  assert distributed.initialize(num_processes=1) is False
  with pytest.raises(ValueError, match="needs a coordinator address"):
    distributed.initialize(num_processes=2, process_id=0)
  with pytest.raises(ValueError, match="is not 'host:port'"):
    distributed.initialize("localhost", 2, 0)
  with pytest.raises(ValueError, match=r"process_id must be in \[0, 2\)"):
    distributed.initialize("localhost:1234", 2, 2)
  monkeypatch.setenv(distributed.ENV_NUM_PROCESSES, "two")
  with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two' is not an integer"):
    distributed.initialize()
  assert distributed.is_main_process()
  assert distributed.process_rows(8) == slice(0, 8)
  assert distributed.process_slice(list("abcd")) == list("abcd")
  batch = {"x": np.arange(6).reshape(3, 2)}
  placed = distributed.global_batch(batch, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
  np.testing.assert_array_equal(distributed.local_rows(placed)["x"], batch["x"])
  np.testing.assert_array_equal(distributed.all_gather(placed)["x"], batch["x"])


def _worker(mode: str, out: pathlib.Path):
  """One of the two processes."""
  distributed.initialize(initialization_timeout_s=60, heartbeat_timeout_s=5, shutdown_timeout_s=10)
  assert jax.process_count() == 2 and jax.device_count() == 8 and jax.local_device_count() == 4
  index = jax.process_index()
  if mode == "sample":
    np.savez(out / f"samples_{index}.npz", **_dp_samples("data:8"))
    distributed.shutdown()
    return
  if mode == "grpo":
    state, tokens, loss = _grpo_steps("data:2,fsdp:2,tensor:2")
    params = distributed.all_gather(state.params)
    arrays = {f"param_{i}": x for i, x in enumerate(jax.tree.leaves(params))}
    np.savez(out / f"process_{index}.npz", tokens=tokens, loss=loss, **arrays)
    ckpt = training.Checkpointer(out / "ckpt")  # every process saves its shards; orbax synchronises
    ckpt.save(STEPS, state, {"step": STEPS})
    restored, _ = ckpt.restore(jax.eval_shape(lambda: state), shardings=jax.tree.map(lambda x: x.sharding, state))
    jax.tree.map(np.testing.assert_array_equal, distributed.all_gather(restored), distributed.all_gather(state))
    ckpt.close()
    distributed.barrier("saved")
    distributed.shutdown()
    return
  if mode == "export":
    from experiments.runner import policy as policy_lib  # pylint: disable=import-outside-toplevel
    mesh, rules = partitioning.make_mesh("data:2,fsdp:2,tensor:2"), partitioning.get_rules("fsdp_tp")
    params = partitioning.init_params(EXPORT_CONFIG, jax.random.key(3), mesh, rules)
    assert not all(x.is_fully_addressable for x in jax.tree.leaves(params))  # really split over the processes
    gathers, gather = [], distributed.all_gather

    def recorded(tree):
      host = gather(tree)
      gathers.append(sum(np.asarray(x).nbytes for x in jax.tree.leaves(host)))
      return host

    distributed.all_gather = recorded
    policy_lib.export(params, EXPORT_CONFIG, out / "no_tokenizer", out / "exported")
    np.save(out / f"gathers_{index}.npy", np.array(gathers))
    distributed.shutdown()
    return
  mesh = partitioning.make_mesh("data:-1")
  total = jax.jit(lambda x: x.sum(), out_shardings=partitioning.replicated(mesh))
  x = distributed.global_batch(np.ones((4,), np.float32), partitioning.batch_sharding(mesh, partitioning.RULES["dp"]))
  print("first sum", float(total(x).addressable_data(0)), flush=True)
  if index == 1:
    os._exit(3)  # dies without a word to the others
  time.sleep(2)
  for _ in range(600):  # collectives with a dead peer: an error, then the service stops this process
    total(x).block_until_ready()
    time.sleep(1)
  print("survivor finished", flush=True)


if __name__ == "__main__":
  _worker(sys.argv[1], pathlib.Path(sys.argv[2]))
