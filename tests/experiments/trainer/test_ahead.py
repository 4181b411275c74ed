"""Compiling the first step's programs ahead (`experiments/trainer/ahead.py`): the run's own calls then compile none
of them, on one device, on a mesh, with LoRA and for PPO; a program that fails ahead is left to the run's call."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.methods import program as program_lib
from experiments.runner import config as config_lib
from experiments.trainer import ahead as ahead_lib
from experiments.trainer import loop
from tests.experiments.trainer.test_loop import TINY
from tests.scripts.test_aot_compile import _Lowerings


class _Compiles(_Lowerings):
  """The names of the programs XLA compiles while it is entered, outside the compile-ahead threads (JAX's debug log
  of each backend compile), in `seen`."""

  LOGGER = "jax._src.dispatch"

  def emit(self, record):
    message = record.getMessage()
    if message.startswith("Finished XLA compilation of ") and not record.threadName.startswith("compile-ahead"):
      self.seen.append(message.split()[4])


def test_the_calls_after_compiling_ahead_compile_nothing_and_a_failure_is_left_to_the_call(capsys):
  def tanh_layers(w, x):
    for _ in range(3):
      x = jnp.tanh(x @ w)
    return x

  good = jax.jit(tanh_layers)
  bad = jax.jit(lambda w, x: w @ x)  # [7, 5] @ [3, 5]: the shapes do not agree
  w, x = jnp.ones((5, 5)), jnp.ones((3, 5))
  ahead = ahead_lib.CompileAhead({
      "good": program_lib.Program(good, program_lib.abstract((w, x)), "a program", per_step=1),
      "bad": program_lib.Program(bad, (jax.ShapeDtypeStruct((7, 5), jnp.float32), program_lib.abstract(x)), "", 1)})
  ahead.wait()
  assert ahead.done() and set(ahead.seconds) == {"good", "bad"} and list(ahead.failed) == ["bad"]
  assert "compile ahead: bad failed (" in capsys.readouterr().err
  with _Compiles() as compiles:
    np.testing.assert_allclose(good(w, x), tanh_layers(w, x), rtol=1e-6)
  assert "jit(tanh_layers)" not in compiles.seen
  with pytest.raises(TypeError):  # the run's own call raises where it would have
    bad(jnp.ones((7, 5)), x)
  ahead.wait("no such program")  # returns at once


def test_a_waiting_step_compiles_what_no_thread_has_taken_in_a_thread_of_its_own():
  import threading  # pylint: disable=import-outside-toplevel
  started, release = threading.Event(), threading.Event()

  class Held:  # a program whose compile holds the only thread until released
    def trace(self, *args, **kwargs):
      started.set()
      release.wait()
      return jax.jit(lambda x: x + 1).trace(*args, **kwargs)

  x = jnp.ones((3,))
  ahead = ahead_lib.CompileAhead({
      "held": program_lib.Program(Held(), program_lib.abstract((x,)), "held", per_step=1),
      "next": program_lib.Program(jax.jit(lambda x: x * 2), program_lib.abstract((x,)), "next", per_step=1)},
      threads=1)
  assert started.wait(60)
  ahead.wait("next")  # the one thread is held: `next` compiles in the wait's own thread
  assert ahead.compiled_by == {"held": "compile-ahead-0", "next": "compile-ahead-wait"}
  assert not ahead.done()
  release.set()
  ahead.wait()
  assert ahead.done() and not ahead.failed


def _first_step(tmp_path, monkeypatch, base: config_lib.Config | None = None, **flags):
  """A one-step tiny run with `flags` (over `base`, default the tiny GRPO run): `(its CompileAhead, the names of what
  its first step compiled)`."""
  made, compiles = [], _Compiles()

  class Recorded(ahead_lib.CompileAhead):
    def __init__(self, programs):
      super().__init__(programs)
      made.append(self)

  step = loop._Steps.step  # pylint: disable=protected-access

  def recorded(self, *args):
    with compiles:
      return step(self, *args)

  monkeypatch.setattr(ahead_lib, "CompileAhead", Recorded)
  monkeypatch.setattr(loop._Steps, "step", recorded)  # pylint: disable=protected-access
  base = config_lib.Config().replace(**TINY) if base is None else base
  config = base.replace(**(dict(steps=1, batch_size=2, group_size=2, beta=0.04) | flags), work_dir=str(tmp_path),
                        compilation_cache_dir="")
  jax.clear_caches()  # an earlier test's programs of these shapes would be compiled already
  loop.run(config)
  assert len(made) == 1 and made[0].done() and not made[0].failed, made[0].failed
  return made[0], compiles.seen


# The names of the programs JAX compiles: the engine, the π_ref forward, GRPO's batch, the update.
NAMES = {"sampler": "jit(_engine_impl)", "logprobs": "jit(chunked)", "batch": "jit(step_batch)", "update": "jit(step)"}


@pytest.mark.parametrize("flags, programs", [
    ({}, ["sampler"]),  # padded: the widths follow the completions
    (dict(sampler="static"), ["sampler"]),  # the static sampler too
    (dict(token_layout="buckets", bucket_micro_batches=2), ["update", "sampler", "logprobs", "batch"]),
    (dict(token_layout="buckets", bucket_micro_batches=2, lora_rank=2), ["update", "sampler", "logprobs", "batch"]),
])
def test_the_first_step_compiles_none_of_the_programs_compiled_ahead(tmp_path, monkeypatch, flags, programs):
  ahead, compiled = _first_step(tmp_path, monkeypatch, **flags)
  assert list(ahead.programs) == programs
  names = NAMES | ({"sampler": "jit(_sample_impl)"} if flags.get("sampler") == "static" else {})
  assert not {names[p] for p in programs} & set(compiled), compiled
  if "update" not in programs:  # the padded update compiles in the step: the record sees what a step compiles
    assert NAMES["update"] in compiled


@pytest.mark.devices(2)
@pytest.mark.parametrize("mesh", ["", "data:2"])
def test_the_static_sampler_on_a_mesh_compiles_ahead_too(tmp_path, monkeypatch, mesh):
  # Without --mesh the 2 CPU devices are the sampler's own mesh; with it, the run's.
  ahead, compiled = _first_step(tmp_path, monkeypatch, sampler="static", mesh=mesh)
  assert list(ahead.programs) == ["sampler"]
  assert "jit(_sample_impl)" not in compiled, compiled


@pytest.mark.devices(2)
@pytest.mark.parametrize("algo, mesh", [("grpo", "fsdp:2"), ("ppo", "data:2")])
def test_on_a_mesh_and_for_ppo_the_first_step_compiles_none_of_them(tmp_path, monkeypatch, algo, mesh):
  ahead, compiled = _first_step(tmp_path, monkeypatch, algo=algo, mesh=mesh, token_layout="buckets",
                                bucket_micro_batches=2)
  assert {"sampler", "update"} <= set(ahead.programs)
  assert not {NAMES[p] for p in ("sampler", "update")} & set(compiled), compiled
  assert "batch" not in ahead.programs  # its host arguments are placed by the call
  assert "jit(chunked)" not in compiled


def test_a_failure_to_list_the_programs_is_one_note_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
  def broken(*args):
    raise KeyError("no such leaf")

  monkeypatch.setattr(ahead_lib, "first_step_programs", broken)
  summary = loop.run(config_lib.Config().replace(**(TINY | dict(steps=1)), work_dir=str(tmp_path)))
  assert summary["final_accuracy"] is not None
  notes = [l for l in capsys.readouterr().err.splitlines() if l.startswith("compile ahead:")]
  assert notes == ["compile ahead: off (KeyError: 'no such leaf'); the first step compiles its programs"]


def test_without_compile_ahead_nothing_compiles_ahead(tmp_path, monkeypatch):
  made = []
  monkeypatch.setattr(ahead_lib, "CompileAhead", lambda programs: made.append(programs))
  loop.run(config_lib.Config().replace(**(TINY | dict(steps=1)), work_dir=str(tmp_path), compile_ahead=False))
  assert not made


def test_distillation_compiles_its_teacher_forward_ahead(tmp_path, monkeypatch):
  from tests.experiments.methods.test_distill import _teacher  # pylint: disable=import-outside-toplevel
  teacher = _teacher(tmp_path / "teacher", hidden_size=64)
  ahead, compiled = _first_step(tmp_path / "run", monkeypatch, algo="distill", teacher_checkpoint=str(teacher),
                                token_layout="buckets", bucket_micro_batches=2)
  assert "teacher_logprobs" in ahead.programs and "update" in ahead.programs
  assert not {"jit(chunked)", "jit(step)", "jit(_engine_impl)"} & set(compiled), compiled


def test_flow_grpo_compiles_its_planner_turns_forwards_and_update_ahead(tmp_path, monkeypatch):
  # Flow-GRPO's turn rows are one count whatever a step's turns, so its π_old / π_ref forward and the update are
  # known before the first step, beside the planner's first turn and its later ones at the widest bucket.
  flow = config_lib.Config().replace(**config_lib.PRESETS["flow_grpo"]).replace(
      tiny_layers=1, tiny_hidden_size=32, num_train=120, num_test=4, eval_batch_size=4, max_turns=2,
      planner_prompt_len=40, action_tokens=8, memory_budget=28, min_bucket=4, sft_steps=0, eval_every=0,
      save_every=0, tensorboard=False)
  ahead, compiled = _first_step(tmp_path, monkeypatch, flow)
  assert list(ahead.programs) == ["update", "sampler", "sampler_turns", "logprobs"]
  assert not {"jit(step)", "jit(chunked)"} & set(compiled), compiled
