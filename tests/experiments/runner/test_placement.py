"""The runner on a device mesh and across processes gives the single-device result.

Each case runs `python -m experiments.grpo_math` in child processes: one CPU device; 8 fake CPU devices on
a (2, 2, 2) data/fsdp/tensor mesh; two processes with 4 CPU devices each joined by `jax.distributed`
(gloo collectives, a loopback coordinator), each providing its own rows of the prompts and batches.
"""

import json
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments.runner import config as config_lib
from experiments.runner import placement as placement_lib
from grpo_jax import models
from grpo_jax import partitioning
from grpo_jax import sampling
from tests.conftest import HANG_GUARD_S, with_cpu_devices

REPO = pathlib.Path(__file__).resolve().parents[3]
FLAGS = ["--max_prompt_len=16", "--max_new_tokens=16", "--num_train=200", "--num_test=8", "--batch_size=4",
         "--group_size=4", "--eval_batch_size=8", "--tensorboard=false", "--eval_every=0", "--steps=2",
         "--learning_rate=1e-3", "--overlong_buffer=12", "--save_every=1"]  # length shaping: varied rewards
MESH = ["--mesh=data:2,fsdp:2,tensor:2", "--sharding_rules=fsdp_tp"]


def _cli(work_dir, policy, *args, devices=1, env=None, background=False):
  cmd = [sys.executable, "-m", "experiments.grpo_math", f"--work_dir={work_dir}", f"--init_checkpoint={policy}",
         *FLAGS, *args]
  env = with_cpu_devices(devices, env)
  if background:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
  root = tmp_path_factory.mktemp("placement")
  policy = models.build_default_checkpoint(root / "policy", seed=2, num_hidden_layers=1, hidden_size=64,
                                           intermediate_size=128)
  result = _cli(root / "one", policy)
  assert result.returncode == 0, result.stderr[-3000:]
  return policy, root / "one"


def _rewards(work_dir):
  lines = (pathlib.Path(work_dir) / "metrics.jsonl").read_text().splitlines()
  return [(r["train/reward_mean"], r["train/reward_std"]) for r in map(json.loads, lines) if "train/loss" in r]


def _assert_same_run(expected_dir, actual_dir):
  assert _rewards(actual_dir) == _rewards(expected_dir)  # the same samples and rewards at every step
  expected = models.load_hf(expected_dir / "final_policy")[0]
  actual = models.load_hf(actual_dir / "final_policy")[0]
  start = models.load_hf(expected_dir.parent / "policy")[0]
  moved = max(float(np.abs(a - s).max()) for a, s in zip(jax.tree.leaves(expected), jax.tree.leaves(start)))
  assert moved > 1e-4
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), expected, actual)


def test_eight_devices_match_one(single, tmp_path):
  policy, one = single
  result = _cli(tmp_path / "eight", policy, *MESH, devices=8)
  assert result.returncode == 0, result.stderr[-3000:]
  _assert_same_run(one, tmp_path / "eight")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_match_one(single, tmp_path):
  policy, one = single
  port = _free_port()
  procs = [_cli(tmp_path / "two", policy, *MESH, f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                f"--process_id={i}", devices=4, background=True) for i in range(2)]
  logs = [p.communicate(timeout=HANG_GUARD_S)[0] for p in procs]
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-3000:]
  _assert_same_run(one, tmp_path / "two")
  assert (tmp_path / "two" / "checkpoints" / "2").is_dir()  # saved together by both processes


def _records(work_dir):
  """metrics.jsonl without its timings."""
  lines = (pathlib.Path(work_dir) / "metrics.jsonl").read_text().splitlines()
  # The mismatch metrics measure the sampler's log-probs against the trainer's: float rounding, which depends on
  # how the sampler's rows are split over devices (the same tokens, log-probs equal up to rounding).
  return [{k: v for k, v in json.loads(l).items()
           if "time" not in k and k != "train/tokens_per_s" and not k.startswith("train/mismatch_")} for l in lines]


def test_sampler_over_two_cpu_devices_gives_the_same_run(single, tmp_path):
  """No --mesh on a CPU presented as two devices: the sampler splits its rows over them and the rest runs on the
  first, and every record (rewards, losses, held-out accuracy) and every final weight equal one device's."""
  policy, one = single
  result = _cli(tmp_path / "split", policy, devices=2)
  assert result.returncode == 0, result.stderr[-3000:]
  assert len(_records(one)) > 2 and _records(tmp_path / "split") == _records(one)
  expected, actual = models.load_hf(one / "final_policy")[0], models.load_hf(tmp_path / "split" / "final_policy")[0]
  jax.tree.map(np.testing.assert_array_equal, expected, actual)


@pytest.mark.devices(2)
def test_cpu_sampler_mesh_splits_whole_prompt_batches_and_returns_uncommitted_to_the_default_device():
  placement = placement_lib.Placement.from_config(config_lib.MeshConfig())
  assert placement.mesh is None and placement.sampler_mesh.size == 2
  assert placement.sample_kwargs(4)["mesh"] is placement.sampler_mesh and placement.sample_kwargs(3) == {}
  assert placement_lib.Placement(partitioning.make_mesh("data:2"), partitioning.get_rules("dp"),
                                 sampler_mesh=placement.sampler_mesh).sampler_mesh is None  # a run's mesh wins
  config = models.tiny_config(hidden_size=64, intermediate_size=128)
  params = models.init_params(config, jax.random.key(0))
  tokens = np.arange(4 * 6, dtype=np.int32).reshape(4, 6) % (config.vocab_size - 4) + 4
  mask = np.ones_like(tokens, bool)
  kw = dict(num_samples=2, max_new_tokens=8, temperature=1.0)
  split, host = placement.sampled(sampling.sample(params, config, tokens, mask, jax.random.key(1),
                                                  **placement.sample_kwargs(4), **kw))
  assert all(isinstance(h, np.ndarray) for h in host)
  jax.tree.map(np.testing.assert_array_equal, host, jax.device_get(split))
  whole = sampling.sample(params, config, tokens, mask, jax.random.key(1), **kw)
  # On the default device and uncommitted, as the run's other arrays: a committed batch would make the update
  # return a committed state, and its next call compile again.
  assert all(a.sharding.device_set == {jax.devices()[0]} and not a.committed for a in split)
  for name in ("prompt_tokens", "tokens", "mask", "lengths", "truncated"):  # the same draws, row for row
    np.testing.assert_array_equal(getattr(split, name), getattr(whole, name))
  np.testing.assert_allclose(split.logprobs, whole.logprobs, atol=1e-5)  # each device's own reductions


@pytest.mark.parametrize("algo,layout", [("sft", "two processes"), ("ppo", "eight devices")])
def test_other_methods_train_on_a_mesh(single, tmp_path, algo, layout):
  """SFT's batches come from host data (each process contributes its rows), PPO's from the sampler and a critic:
  both train under a mesh, on one host or two."""
  policy, _ = single
  args = [*MESH, f"--algo={algo}", *(["--group_size=1", "--batch_size=8"] if algo == "ppo" else [
      "--overlong_buffer=0"])]  # SFT has no rewards to shape
  if layout == "two processes":
    port = _free_port()
    procs = [_cli(tmp_path, policy, *args, f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                  f"--process_id={i}", devices=4, background=True) for i in range(2)]
    for p, log in zip(procs, [p.communicate(timeout=HANG_GUARD_S)[0] for p in procs]):
      assert p.returncode == 0, log[-3000:]
  else:
    result = _cli(tmp_path, policy, *args, devices=8)
    assert result.returncode == 0, result.stderr[-3000:]
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines() if "train/loss" in l]
  assert [r["step"] for r in records] == [1, 2] and all(np.isfinite(r["train/loss"]) for r in records)
  final, start = models.load_hf(tmp_path / "final_policy")[0], models.load_hf(policy)[0]
  assert not np.array_equal(final["embed"]["embedding"], start["embed"]["embedding"])


@pytest.mark.parametrize("args,message", [
    (["--mesh=data:3"], "mesh"),
    (["--mesh=data:8", "--sampler=static"], "--batch_size = 4 must be a multiple of the mesh's data-parallel size 8"),
])
def test_bad_mesh_is_one_clear_line(single, tmp_path, args, message):
  policy, _ = single
  result = _cli(tmp_path / "bad", policy, *args, devices=8)
  assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]
  assert "Traceback" not in result.stderr


def test_the_engine_samples_any_batch_on_a_mesh(single, tmp_path):
  """--batch_size=4 and --eval_batch_size=8 prompts on 16 data shards (the static sampler refuses them, above):
  the engine pads each batch with one-token completions, and the run is one device's."""
  policy, one = single
  result = _cli(tmp_path / "sixteen", policy, "--mesh=data:16", devices=16)
  assert result.returncode == 0, result.stderr[-3000:]
  _assert_same_run(one, tmp_path / "sixteen")


def test_row_chunks_of_the_forwards_and_the_sampler():
  """`--forward_rows` as given; else rows and prompts from the budget (`row_chunks`), and on a CPU's default
  budget the default run's forwards (256 rows of 56 tokens) and sampler (32 prompts x 8) run in one chunk."""
  from grpo_jax import row_chunks  # pylint: disable=import-outside-toplevel
  config = models.tiny_config(num_hidden_layers=4, hidden_size=128, intermediate_size=384)
  default = placement_lib.Placement.from_config(config_lib.MeshConfig(cpu_devices=1))
  assert default.forward_budget == row_chunks.CPU_BUDGET_BYTES
  assert default.forward_chunk(config, 256, 56, logits_chunk=128, cached=True) == 256
  assert default.sampler_chunk(config, 32, 16, 8, 40) == 0
  given = placement_lib.Placement.from_config(config_lib.MeshConfig(forward_rows=64))
  assert given.forward_chunk(config, 256, 56) == 64
  row = row_chunks.forward_row_bytes(config, 56)
  prompt = row_chunks.sampler_prompt_bytes(config, 16, 8, 40)
  assert placement_lib.Placement(forward_budget=3 * row).forward_chunk(config, 256, 56) == 3  # 86 chunks
  assert placement_lib.Placement(forward_budget=3 * prompt).sampler_chunk(config, 32, 16, 8, 40) == 2  # divides 32


@pytest.mark.devices(2)
def test_sampler_chunks_on_a_mesh_count_the_rows_each_device_holds():
  """A per-shard sampler (params whole) chunks each shard's prompts; one GSPMD loop (params split) splits a chunk's
  rows over the devices, so the same budget takes twice the prompts."""
  from grpo_jax import row_chunks  # pylint: disable=import-outside-toplevel
  config = models.tiny_config(num_hidden_layers=4, hidden_size=128, intermediate_size=384)
  budget = 3 * row_chunks.sampler_prompt_bytes(config, 16, 8, 40)  # 3 prompts per device
  per_shard = placement_lib.Placement(partitioning.make_mesh("data:2"), partitioning.get_rules("dp"),
                                      forward_budget=budget)
  assert per_shard.sampler_chunk(config, 32, 16, 8, 40) == 2  # of each shard's 16: the most <= 3 that divide 16
  gspmd = placement_lib.Placement(partitioning.make_mesh("fsdp:2"), partitioning.get_rules("fsdp"),
                                  forward_budget=budget)
  assert gspmd.sampler_chunk(config, 32, 16, 8, 40) == 4  # 6 fit (3 a device): the most <= 6 that divide 32
