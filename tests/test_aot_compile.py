"""Ahead-of-time compilation of the runner's programs (scripts/aot_compile.py).

TPU: the tiny model's update step, log-prob forward and sampler compile for a v5e:2x2
topology with the fsdp and fsdp_tp rules (libtpu as the compiler, no TPU; each run in a child process
whose environment is set before libtpu loads). GPU path: the flags a GPU run uses (bfloat16, remat,
a mesh) compile for 8 fake CPU devices at the same shapes. And the FLOP count's loop trip counts.
"""

import dataclasses
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from experiments.runner import config as config_lib
from experiments.runner import policy
from grpo_jax import models

from tests.conftest import FAST_COMPILE_FLAGS, HANG_GUARD_S

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_SCRIPT = _ROOT / "scripts" / "aot_compile.py"
_spec = importlib.util.spec_from_file_location("aot_compile", _SCRIPT)
aot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(aot)

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (pip install -e '.[tpu]'): no TPU compiler")

# The runner's shapes for the tiny model, small enough to compile in seconds.
_WORK = ["--batch_size=4", "--group_size=4", "--max_prompt_len=16", "--max_new_tokens=24", "--grad_accum_steps=2"]


def _run_script(tmp_path, *flags):
  env = {**os.environ, **aot.LIBTPU_ENV, "JAX_PLATFORMS": "cpu"}
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f not in FAST_COMPILE_FLAGS)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
  out = tmp_path / "figures.jsonl"
  result = subprocess.run([sys.executable, str(_SCRIPT), "--model=tiny", f"--json_out={out}", *_WORK, *flags],
                          cwd=_ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
  records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
  return result, records


@needs_libtpu
@pytest.mark.parametrize("mesh, rules, extra", [("fsdp:4", "fsdp", ["--noisolate", "--tiny_layers=1"]),
                                                ("fsdp:2,tensor:2", "fsdp_tp", ["--scan_layers", "--remat",
                                                                                "--noisolate"])])
def test_tiny_programs_compile_for_v5e_2x2(tmp_path, mesh, rules, extra):
  result, records = _run_script(tmp_path, "--topology=v5e:2x2", f"--mesh={mesh}", f"--sharding_rules={rules}",
                                "--dtype=bfloat16", "--programs=update,logprobs,sampler", *extra)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "v5e: 15.75 GiB HBM" in result.stdout and result.stdout.strip().endswith("GiB per chip")
  (record,) = records
  programs = {p["name"]: p for p in record["programs"]}
  assert set(programs) == {"update", "logprobs", "sampler"}
  for p in programs.values():
    assert p["argument"] > 0 and p["code"] > 0 and p["flops"] > 0 and p["peak_bytes"] < 15.75 * 2 ** 30
  assert programs["update"]["alias"] > 0  # the train state is donated
  # Trip counts: the update's FLOPs cover every micro-batch, the sampler's every decode step.
  assert programs["update"]["flops"] > 2 * programs["logprobs"]["flops"]
  assert programs["sampler"]["flops"] > programs["sampler"]["xla_flops"]
  assert record["resident"]["reference params"] > 0 and record["resident"]["reward model"] == 0


@needs_libtpu
def test_does_not_fit_exits_with_one_line(tmp_path):
  # Two programs, each compiled in a child run of the script (--isolate, the default); the parent reports.
  result, records = _run_script(tmp_path, "--topology=v5e:2x2", "--mesh=fsdp:4", "--programs=logprobs,reward",
                                "--reward_model", "--scan_layers", "--hbm_gib=0.0001")
  assert result.returncode != 0
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("DOES NOT FIT: logprobs needs") and "GiB HBM; largest arrays: " in last
  assert [p["name"] for p in records[0]["programs"]] == ["logprobs", "reward"]


def test_tiny_model_is_the_runners():
  # --model=tiny compiles the model the runner builds for the same --tiny_layers / --tiny_hidden_size.
  for layers, hidden in ((4, 128), (1, 32)):
    runner = models.tiny_config(**policy.tiny_overrides(config_lib.ModelConfig(tiny_layers=layers,
                                                                               tiny_hidden_size=hidden)))
    assert aot.model_config("tiny", tiny_layers=layers, tiny_hidden_size=hidden) == runner
    assert runner.num_hidden_layers == layers and runner.hidden_size == hidden
  assert aot.model_config("tiny") == models.tiny_config(**policy.tiny_overrides(config_lib.ModelConfig()))


def test_bad_tiny_shape_is_one_line(tmp_path):
  result, _ = _run_script(tmp_path, "--topology=cpu", "--tiny_hidden_size=36", "--programs=logprobs")
  assert result.returncode != 0
  assert "--tiny_hidden_size must be a positive multiple of 8" in result.stderr, result.stderr[-2000:]
  assert "Traceback" not in result.stderr


def test_bad_topology_is_one_line(tmp_path):
  result, _ = _run_script(tmp_path, "--topology=v9z:2x2", "--programs=logprobs")
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1].startswith("aot_compile: ")


@pytest.mark.devices(8)
def test_gpu_path_flags_compile_for_cpu_at_the_same_shapes():
  """--dtype=bfloat16 --remat with a mesh: the update, log-prob and sampler programs compile for 8 (fake CPU)
  devices at the TPU test's shapes."""
  work = aot.Work(batch_size=4, group_size=4, max_prompt_len=16, max_new_tokens=24, grad_accum_steps=2)
  cpu = aot.target("cpu")
  assert len(cpu.devices) == 8 and cpu.chip is None
  # One of the tiny model's four layers: the flags, not the depth, are what this checks (compiling 4 took 31 s).
  config = dataclasses.replace(aot.model_config("tiny", dtype="bfloat16", remat=True, remat_policy="dots_no_batch"),
                               num_hidden_layers=1)
  mesh = "data:2,fsdp:2,tensor:2"
  results, resident = aot.compile_programs(config, cpu, mesh, "fsdp_tp", work, ("update", "logprobs", "sampler"),
                                           log=lambda s: None)
  assert [r.name for r in results] == ["update", "logprobs", "sampler"]
  assert all(r.flops > 0 and r.argument > 0 and not r.error for r in results)
  assert resident["policy params + AdamW"] > 0 and resident["reference params"] > 0
  assert aot.report(config, cpu, mesh, "fsdp_tp", work, results, resident, None)[-1].startswith("fits")
  assert aot.report(config, cpu, mesh, "fsdp_tp", work, results, resident, 1e-6)[-1].startswith("DOES NOT FIT")


def test_matmul_flops_count_loops_at_their_trip_counts():
  w, x = jnp.ones((5, 8, 8)), jnp.ones((4, 8))

  def f(w, x):
    x = jax.lax.scan(lambda c, wi: (c @ wi, None), x, w)[0]  # 5 x 2*4*8*8
    x = jax.lax.fori_loop(0, 3, lambda i, c: c @ w[0], x)  # static bounds: a scan of 3
    x = jax.checkpoint(lambda c: c @ w[1])(x)  # 1 x
    return jax.lax.cond(x.sum() > 0, lambda c: c @ w[2] @ w[3], lambda c: c, x)  # the larger branch: 2 x

  def g(w, x):  # a while loop of unknown trip count: counted `while_trips` times
    return jax.lax.while_loop(lambda c: c[1].sum() < 1e9, lambda c: (c[0] @ w[0], c[1] + 1), (x, x))[0]

  one = 2 * 4 * 8 * 8
  assert aot.matmul_flops(jax.make_jaxpr(f)(w, x).jaxpr) == (5 + 3 + 1 + 2) * one
  assert aot.matmul_flops(jax.make_jaxpr(g)(w, x).jaxpr, while_trips=7) == 7 * one
  # Forward and backward: each matmul and its two transposes (the checkpointed matmul's recomputation is
  # dead code here: a matmul's transposes need its inputs, not its output).
  grad = jax.make_jaxpr(jax.grad(lambda w: f(w, x).sum()))(w).jaxpr
  assert aot.matmul_flops(grad) == 3 * 11 * one
