"""Ahead-of-time compilation of a run's programs (scripts/aot_compile.py over experiments/trainer/programs.py).

TPU: the tiny model's programs, as `programs(config)` lists them for the runner's flags, compile for a v5e:2x2
topology (libtpu as the compiler, no TPU; in a child process whose environment is set before libtpu loads), and
their figures add up. GPU path: the flags a GPU run uses (bfloat16, remat, a mesh) compile for 8 fake CPU
devices. The runner's flagfile for the paper's setting loads, and its programs are those the runner runs. And
the FLOP count's loop trip counts.
"""

import importlib.util
import json
import logging
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.runner import config as config_lib
from experiments.runner import policy
from grpo_jax import models

from tests.conftest import FAST_COMPILE_FLAGS, HANG_GUARD_S
from tests.known_answers import known_answers  # noqa: F401  (a fixture)

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_SCRIPT = _ROOT / "scripts" / "aot_compile.py"
_spec = importlib.util.spec_from_file_location("aot_compile", _SCRIPT)
aot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(aot)

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (pip install -e '.[tpu]'): no TPU compiler")

# The runner's flags for the tiny model, small enough to compile in seconds.
_RUN = ["--batch_size=4", "--group_size=4", "--max_prompt_len=16", "--max_new_tokens=24", "--grad_accum_steps=2",
        "--eval_batch_size=4", "--num_test=8", "--tiny_layers=1"]
_PAPER = ["--flagfile=experiments/configs/deepseekmath_gsm8k.cfg"]


def _run_script(tmp_path, *flags, run=tuple(_RUN)):
  env = {**os.environ, **aot.LIBTPU_ENV, "JAX_PLATFORMS": "cpu"}
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f not in FAST_COMPILE_FLAGS)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
  out = tmp_path / "figures.jsonl"
  result = subprocess.run([sys.executable, str(_SCRIPT), f"--json_out={out}", *run, *flags],
                          cwd=_ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
  records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
  return result, records


def _tiny_reward_model(path) -> str:
  """A reward-model directory of the tiny policy's shapes (`--tiny_layers=1`), as experiments.train_reward_model
  writes one."""
  from grpo_jax import reward_models  # pylint: disable=import-outside-toplevel
  config = models.tiny_config(**policy.tiny_overrides(config_lib.PolicyConfig(tiny_layers=1)))
  reward_models.save_reward_model(models.init_scalar_params(config, jax.random.key(0)), config, path, kind="orm")
  return str(path)


@needs_libtpu
def test_tiny_programs_compile_for_v5e_2x2(tmp_path):
  # --attention=auto is the Pallas flash kernel on a TPU: on the mesh it runs per shard, in every program that
  # attends over whole sequences (the π_ref/π_old forward, the update, the reward model's scores).
  result, records = _run_script(tmp_path, "--topology=v5e:2x2", "--mesh=fsdp:4", "--dtype=bfloat16",
                                "--recompute_old_logprobs", "--scan_layers", "--remat", "--noisolate", "--reward=orm",
                                f"--reward_model={_tiny_reward_model(tmp_path / 'orm')}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "v5e: 15.75 GiB HBM" in result.stdout and result.stdout.strip().endswith("GiB per chip")
  assert "attention=pallas" in result.stdout
  assert "sampler: its largest loop body: " in result.stdout  # a decode step's instructions on the TPU
  (record,) = records
  programs = {p["name"]: p for p in record["programs"]}
  # With --recompute_old_logprobs the π_old forward runs besides π_ref (else on-policy: stop_gradient(π_θ)).
  assert list(programs) == ["sampler", "reward", "logprobs", "batch", "update", "eval_greedy"]
  assert programs["logprobs"]["calls"] == 2 and programs["update"]["calls"] == 1
  assert programs["eval_greedy"]["calls"] == 2 and programs["eval_greedy"]["per"] == "eval"  # 8 prompts, 4 a call
  resident = record["resident"]
  assert set(resident) == {"train state", "reference", "reward model"}  # the start policy: the train state's
  assert resident["reference"] > 0 and resident["reward model"] > 0
  assert resident["train state"] >= 3 * resident["reference"]  # params and AdamW's two moments
  for p in programs.values():
    assert p["argument"] > 0 and p["code"] > 0 and p["temp"] >= 0
    assert p["flops"] > 0 or p["name"] == "batch"  # matmul FLOPs: the step's batch has none
    assert p["peak_bytes"] == p["argument"] + p["output"] + p["temp"] + p["code"] - p["alias"] + p["resident_other"]
    assert p["peak_bytes"] < 15.75 * 2 ** 30
  # Resident trees that are not a program's arguments: the update takes the whole train state, the forwards and
  # samplers one params tree.
  total = sum(resident.values())
  assert programs["update"]["resident_other"] == total - resident["train state"]
  assert programs["reward"]["resident_other"] == total - resident["reward model"]
  assert programs["logprobs"]["resident_other"] == total - resident["reference"]
  assert programs["batch"]["resident_other"] == total  # reads no resident tree
  assert programs["update"]["alias"] > 0  # the train state is donated
  # Trip counts: the update's FLOPs cover both micro-batches, the sampler's every decode step.
  assert programs["update"]["flops"] > 2 * programs["logprobs"]["flops"]
  assert programs["sampler"]["flops"] > programs["sampler"]["xla_flops"]
  assert programs["sampler"]["loop_ops"] == sum(programs["sampler"]["loop_op_kinds"].values()) > 0


@needs_libtpu
def test_does_not_fit_exits_with_one_line(tmp_path):
  # Two programs, each compiled in a child run of the script (--isolate, the default); the parent reports.
  result, records = _run_script(tmp_path, "--topology=v5e:2x2", "--mesh=fsdp:4", "--programs=logprobs,eval_greedy",
                                "--hbm_gib=0.0001")
  assert result.returncode != 0
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("DOES NOT FIT: logprobs needs") and "GiB HBM; largest arrays: " in last
  assert [p["name"] for p in records[0]["programs"]] == ["logprobs", "eval_greedy"]


def test_the_papers_flagfile_loads_and_names_the_runners_programs(tmp_path):
  # The runner's flagfile as it is: on-policy (one epoch over one minibatch) at temperature 1, so no π_old
  # forward; β > 0: the π_ref forward; a rule reward: no reward model. Listed without compiling.
  result, _ = _run_script(tmp_path, "--model=qwen2.5-0.5b", "--topology=cpu", "--mesh=data:1", "--programs=nothing",
                          run=_PAPER)
  assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert result.stderr.strip().splitlines()[-1] == (
      "aot_compile: --programs: nothing not among this run's programs (sampler, logprobs, batch, update, eval_greedy)")
  # An outcome reward model adds its scorer; --eval_samples the evaluation's sampler; β = 0 drops the forward.
  result, _ = _run_script(tmp_path, "--model=qwen2.5-0.5b", "--topology=cpu", "--mesh=data:1", "--programs=nothing",
                          "--reward=orm", "--reward_model=qwen2.5-0.5b", "--eval_samples=4", "--beta=0", run=_PAPER)
  assert result.stderr.strip().splitlines()[-1].endswith(
      "(sampler, reward, batch, update, eval_greedy, eval_samples)"), result.stderr[-3000:]


def _lowered(config, name, **overrides):
  """The lowered text of one of `programs(config)`'s programs (tiny model, one CPU device as a mesh)."""
  from experiments.runner import placement as placement_lib  # pylint: disable=import-outside-toplevel
  from experiments.trainer import programs  # pylint: disable=import-outside-toplevel
  config = config.replace(**overrides)
  placement = placement_lib.Placement.from_config(config.mesh, jax.devices()[:1])
  program = programs.programs(config, aot.policy_config(config.model), placement)[name]
  return program.jitted.trace(*program.args, **program.kwargs).lower().as_text()


class _Lowerings(logging.Handler):
  """Records `(module name, argument shapes and types)` of every program JAX lowers (its pxla debug log)."""

  LOGGER = "jax._src.interpreters.pxla"

  def __init__(self):
    super().__init__(logging.DEBUG)
    self.seen = []

  def emit(self, record):
    if record.msg.startswith("Compiling %s with global shapes"):
      self.seen.append((record.args[0], str(record.args[1])))

  def __enter__(self):
    self.logger = logging.getLogger(self.LOGGER)
    self.level = self.logger.level
    self.logger.setLevel(logging.DEBUG)
    self.logger.addHandler(self)
    return self

  def __exit__(self, *exc):
    self.logger.removeHandler(self)
    self.logger.setLevel(self.level)


def _programs_match_a_run(config, names, mesh=None):
  """programs(config) lists `names`, in order; a one-step run of `config` lowers every one of them with the same
  names and argument shapes and types, and no other program of the model's (by name). `mesh`: the one to list them
  for, where it is not the run's (a one-device run's). Returns the listed programs, the placement and the model
  config."""
  from experiments.trainer import loop  # pylint: disable=import-outside-toplevel
  from experiments.runner import placement as placement_lib  # pylint: disable=import-outside-toplevel
  from experiments.trainer import programs  # pylint: disable=import-outside-toplevel
  jax.clear_caches()  # a program another test compiled (the same shapes) would not be lowered, nor logged, again
  with _Lowerings() as runner:
    loop.run(config)
  config = config.replace(mesh=mesh) if mesh else config
  placement = placement_lib.Placement.from_config(config.mesh)
  model_config = aot.policy_config(config.model)
  listed = programs.programs(config, model_config, placement)
  assert list(listed) == names
  jax.clear_caches()  # the run compiled some of them ahead at these very arguments (`trainer.ahead`): lower anew
  with _Lowerings() as ours:
    for program in listed.values():
      program.jitted.trace(*program.args, **program.kwargs).lower()
  assert len(ours.seen) == len(listed) and set(ours.seen) <= set(runner.seen)
  model_programs = {name for name, _ in ours.seen}
  assert {seen for seen in runner.seen if seen[0] in model_programs} == set(ours.seen)
  return listed, placement, model_config


def test_the_programs_are_those_the_runner_compiles(tmp_path):
  # A one-step run (π_old recomputed at temperature 0.7, β > 0, evaluation before and after) on a one-device mesh
  # lowers every program of programs(config), with the same names and argument shapes and types; and its large
  # programs (the model's, by name) are all among them.
  config = config_lib.Config().replace(
      mesh="data:1", tiny_layers=1, batch_size=2, group_size=2, max_new_tokens=6, completion_pad_multiple=0,
      temperature=0.7, recompute_old_logprobs=True, steps=1, sft_steps=0, eval_every=0, num_test=2,
      eval_batch_size=2, save_every=0, tensorboard=False, work_dir=str(tmp_path / "run"))
  _programs_match_a_run(config, ["sampler", "logprobs", "batch", "update", "eval_greedy"])


def test_the_bucketed_programs_are_those_a_bucketed_run_compiles(tmp_path):
  # --token_layout=buckets: the forward and the update take all --max_new_tokens columns, one program each.
  config = config_lib.Config().replace(
      mesh="data:1", tiny_layers=1, batch_size=2, group_size=2, max_new_tokens=6, temperature=0.7,
      recompute_old_logprobs=True, steps=1, sft_steps=0, eval_every=0, num_test=2, eval_batch_size=2, save_every=0,
      tensorboard=False, work_dir=str(tmp_path / "run"), token_layout="buckets", bucket_micro_batches=2)
  listed, _, _ = _programs_match_a_run(config, ["sampler", "logprobs", "batch", "update", "eval_greedy"])
  assert "2 length-sorted micro-batches at widths (4, 6)" in listed["update"].uses
  assert listed["update"].args[1].tokens.shape == (4, config.task.max_prompt_len + 6)


@pytest.mark.parametrize("algo,names", [("online_rft", ["sampler", "batch", "update", "eval_greedy"]),
                                        ("rft_table10", ["sampler", "batch", "update", "eval_greedy"]),
                                        ("sft", ["update", "eval_greedy"]),
                                        ("rft", ["sampler", "batch", "update", "eval_greedy"]),
                                        ("dpo", ["sampler", "logprobs", "batch", "update", "eval_greedy"])])
def test_the_paradigm_programs_are_those_a_run_compiles(tmp_path, algo, names, known_answers):
  # Online RFT samples the current policy, Table 10's RFT the frozen start policy (π_ref's params, the same
  # structure), SFT nothing (the task's solutions, a batch without sampler log-probs), RFT and DPO the start policy
  # once for their data (DPO: then π_ref over each step's pairs): as a one-step run lowers them.
  config = config_lib.Config().replace(
      mesh="data:1", tiny_layers=1, batch_size=2, group_size=2, max_new_tokens=12, algo=algo, steps=1, sft_steps=0,
      eval_every=0, num_test=2, eval_batch_size=2, save_every=0, tensorboard=False, work_dir=str(tmp_path / "run"),
      **({"offline_prompts": 4} if algo in ("rft", "dpo") else {}))  # `known_answers`: right and wrong rows
  _programs_match_a_run(config, names)


def test_the_lora_programs_are_those_a_lora_run_compiles(tmp_path):
  # As above with --lora_rank: the sampler and evaluation take base + adapters, π_ref the base alone (adapters
  # off), π_old base + adapters (a second forward program), the update the adapters' train state and the frozen
  # base as a third argument; a one-step LoRA run lowers the same names and argument shapes.
  config = config_lib.Config().replace(
      mesh="data:1", tiny_layers=1, batch_size=2, group_size=2, max_new_tokens=6, completion_pad_multiple=0,
      temperature=0.7, recompute_old_logprobs=True, steps=1, sft_steps=0, eval_every=0, num_test=2,
      eval_batch_size=2, save_every=0, tensorboard=False, work_dir=str(tmp_path / "run"), lora_rank=4,
      lora_alpha=8.0)
  _programs_match_a_run(config, ["sampler", "old_logprobs", "logprobs", "batch", "update", "eval_greedy"])


@pytest.mark.parametrize("lora", [False, True])
def test_the_distill_programs_are_those_a_distill_run_compiles(tmp_path, lora):
  # --algo=distill: π_old recomputed (base + adapters with LoRA), the teacher's forward over its own params (a wider
  # model than the student's), no π_ref; a one-step run lowers the same; the teacher is resident in place of π_ref.
  from experiments.trainer import programs  # pylint: disable=import-outside-toplevel
  from tests.experiments.methods.test_distill import _teacher  # pylint: disable=import-outside-toplevel
  teacher = _teacher(tmp_path / "teacher", hidden_size=64)
  config = config_lib.Config().replace(
      algo="distill", teacher_checkpoint=str(teacher), mesh="data:1", tiny_layers=1, batch_size=2, group_size=2,
      max_new_tokens=6, completion_pad_multiple=0, temperature=0.7, recompute_old_logprobs=True, steps=1,
      sft_steps=0, eval_every=0, num_test=2, eval_batch_size=2, save_every=0, tensorboard=False,
      work_dir=str(tmp_path / "run"), **(dict(lora_rank=4, lora_alpha=8.0) if lora else {}))
  listed, placement, model_config = _programs_match_a_run(
      config, ["sampler", "old_logprobs" if lora else "logprobs", "teacher_logprobs", "batch", "update", "eval_greedy"])
  teacher_params = listed["teacher_logprobs"].args[0]
  assert teacher_params["embed"]["embedding"].shape == (model_config.vocab_size, 64)
  resident = programs.resident(config, model_config, placement)
  assert set(resident) == {"train state", "teacher"} | ({"base"} if lora else set())
  assert jax.tree.map(lambda x: x.shape, resident["teacher"]) == jax.tree.map(lambda x: x.shape, teacher_params)


def test_the_ppo_programs_are_those_a_ppo_run_compiles(tmp_path):
  # --algo=ppo: π_old (temperature 0.7) and π_ref through the rollouts' ungrouped forward, the value forward over
  # the train state's value model, the policy + value update over a PPO batch; a one-step run lowers the same.
  from experiments.trainer import programs  # pylint: disable=import-outside-toplevel
  config = config_lib.Config().replace(
      algo="ppo", mesh="data:1", tiny_layers=1, batch_size=2, group_size=2, max_new_tokens=6,
      completion_pad_multiple=0, temperature=0.7, steps=1, sft_steps=0, eval_every=0, num_test=2, eval_batch_size=2,
      save_every=0, tensorboard=False, work_dir=str(tmp_path / "run"))
  listed, placement, model_config = _programs_match_a_run(
      config, ["sampler", "logprobs", "values", "batch", "update", "eval_greedy"])
  assert listed["logprobs"].per_step == 2
  state = programs.resident(config, model_config, placement)["train state"]
  assert set(state.params) == {"policy", "value"} and listed["values"].args[0] == state.params["value"]
  for flags, message in ((dict(lora_rank=2), "--algo=ppo with --lora_rank > 0"),
                         (dict(value_init="some/dir"), "--value_init=some/dir")):
    with pytest.raises(config_lib.ConfigError, match=message):
      programs.programs(config.replace(**flags), model_config, placement)


def test_the_bucketed_ppo_programs_are_those_a_bucketed_ppo_run_compiles(tmp_path):
  # --algo=ppo --token_layout=buckets: π_old / π_ref (each prompt once per group) and V_ψ in length-sorted
  # micro-batches over all --max_new_tokens columns, the policy + value update at the ladder's widths; as a run lowers.
  config = config_lib.Config().replace(
      algo="ppo", mesh="data:1", tiny_layers=1, batch_size=2, group_size=2, max_new_tokens=6, temperature=0.7,
      steps=1, sft_steps=0, eval_every=0, num_test=2, eval_batch_size=2, save_every=0, tensorboard=False,
      work_dir=str(tmp_path / "run"), token_layout="buckets", bucket_micro_batches=2)
  listed, _, _ = _programs_match_a_run(config, ["sampler", "logprobs", "values", "batch", "update", "eval_greedy"])
  assert "2 length-sorted micro-batches at widths (4, 6)" in listed["update"].uses
  assert "2 length-sorted micro-batches" in listed["logprobs"].uses and "length-sorted" in listed["values"].uses
  assert listed["update"].args[1].tokens.shape == listed["update"].args[1].returns.shape == (
      4, config.task.max_prompt_len + 6)


@pytest.mark.parametrize("lora", [False, True])
def test_the_flow_grpo_programs_are_those_a_flow_grpo_run_compiles(tmp_path, lora):
  # --algo=flow_grpo runs on one device: the planner's turns through the unsharded sampler (the first turn B
  # prompts x G actions, later turns one action for each active trajectory; evaluation greedy), π_old and π_ref over
  # the turns' rows, the update over a TurnBatch. Buckets at least B·G (--min_bucket) and the turn rows' one count
  # (every trajectory at --max_turns) fix the shapes whatever the tiny policy writes; a one-step run lowers the same.
  from experiments.trainer import programs  # pylint: disable=import-outside-toplevel
  config = config_lib.Config().replace(**config_lib.PRESETS["flow_grpo"]).replace(
      tiny_layers=1, tiny_hidden_size=32, num_train=120, num_test=4, eval_batch_size=4, batch_size=2, group_size=2,
      max_turns=2, planner_prompt_len=40, action_tokens=8, memory_budget=28, min_bucket=4, grad_accum_steps=4,
      beta=0.04, sft_steps=0, steps=1, eval_every=0, save_every=0, tensorboard=False, work_dir=str(tmp_path / "run"),
      **(dict(lora_rank=4, lora_alpha=8.0) if lora else {}))
  forwards = ["old_logprobs", "logprobs"] if lora else ["logprobs"]
  listed, placement, model_config = _programs_match_a_run(
      config, ["sampler", "sampler_turns", *forwards, "update", "eval_greedy"], mesh="data:1")
  width = 40 + 8
  assert listed["sampler"].args[1].shape == listed["sampler_turns"].args[1].shape == (4, 40)  # bucket_size(4, 4)
  assert listed["sampler"].kwargs["num_samples"] == 2 and listed["sampler_turns"].kwargs["num_samples"] == 1
  assert listed["eval_greedy"].kwargs["greedy"] and listed["eval_greedy"].per_eval == 2  # one batch of 4, 2 turns
  # room for every turn of B·G = 4 trajectories: the update in micro-batches of 4 / 2 / 4 (--grad_accum_steps) = 1
  # row, the forwards in blocks of 4 / 2 = 2, those past a step's turns skipped
  assert listed["logprobs"].args[1].shape == (8, width) and listed["update"].args[1].tokens.shape == (8, width)
  assert "8 micro-batches (those without a loss token skipped)" in listed["update"].uses
  assert "in blocks of 2, those without a real row skipped" in listed["logprobs"].uses
  assert listed["update"].args[1].advantages.shape == (8,)
  assert listed["sampler_turns"].per_step == 1 and listed["logprobs"].per_step == (1 if lora else 2)
  resident = programs.resident(config.replace(mesh="data:1"), model_config, placement)
  assert set(resident) == ({"train state", "base"} if lora else {"train state", "reference"})


def test_the_lora_update_and_resident_trees_hold_the_base_once():
  # Bytes of the update's arguments and of the resident trees, full fine-tuning against LoRA on the same model:
  # the full train state is params + AdamW's two moments (+ the step count); LoRA's is the adapters + their two
  # moments, with the base a separate argument; π_ref is the base itself, so the base is resident once.
  from experiments.runner import placement as placement_lib  # pylint: disable=import-outside-toplevel
  from experiments.trainer import programs  # pylint: disable=import-outside-toplevel
  nbytes = lambda tree: aot._bytes_per_device(tree)  # pylint: disable=protected-access
  config = config_lib.Config().replace(mesh="data:1", tiny_layers=2, batch_size=2, group_size=2, max_prompt_len=4,
                                       max_new_tokens=4, eval_batch_size=2, num_test=2)
  lora_config = config.replace(lora_rank=2, lora_alpha=4.0, lora_targets="q,v")
  placement = placement_lib.Placement.from_config(config.mesh, jax.devices()[:1])
  model_config = aot.policy_config(config.model)
  full = programs.programs(config, model_config, placement)["update"]
  adapted = programs.programs(lora_config, model_config, placement)["update"]
  state, batch = full.args
  lora_state, lora_batch, base = adapted.args
  weights = nbytes(state.params)
  adapters = nbytes(lora_state.params)
  # rank 2 on q and v of 2 layers, float32: A [hidden, 2] and B [2, heads x head_dim] each
  e = model_config.hidden_size
  q, v = (model_config.num_attention_heads * model_config.head_dim,
          model_config.num_key_value_heads * model_config.head_dim)
  assert adapters == 4 * 2 * 2 * ((e + q) + (e + v))
  assert nbytes(base) == weights and nbytes(lora_batch) == nbytes(batch)
  # params + AdamW's two moments, + three int32 counts (the state's step, AdamW's, the schedule's)
  assert nbytes(state) - 3 * weights == nbytes(lora_state) - 3 * adapters == 3 * 4
  assert nbytes(adapted.args) < 0.4 * nbytes(full.args) and adapters < 0.01 * weights
  assert full.resident_args == (0,) and adapted.resident_args == (0, 2)
  resident = programs.resident(lora_config, model_config, placement)
  assert {k: nbytes(v) for k, v in resident.items()} == {"train state": nbytes(lora_state), "base": weights}
  assert {k: nbytes(v) for k, v in programs.resident(config, model_config, placement).items()} == {
      "train state": nbytes(state), "reference": weights}


def test_the_update_follows_the_run_config():
  # The update compiled is the one the run's flags make: its temperature, its clip range and schedule are in the
  # lowered program; where a run only logs differently, the program is the same.
  config = config_lib.Config().replace(mesh="data:1", tiny_layers=1, batch_size=2, group_size=2,
                                       max_prompt_len=4, max_new_tokens=4, eval_batch_size=2)
  base = _lowered(config, "update")
  assert _lowered(config, "update", seed=3, work_dir="elsewhere", eval_every=7) == base
  assert _lowered(config, "update", temperature=0.5) != base
  assert _lowered(config, "update", epsilon=0.3) != base
  assert _lowered(config, "update", lr_schedule="constant") != base


def test_the_update_follows_the_policy_loss():
  # --loss, --entropy_coef and --top_entropy_quantile each change the compiled update (the objective is the method's).
  config = config_lib.Config().replace(mesh="data:1", tiny_layers=1, batch_size=2, group_size=2,
                                       max_prompt_len=4, max_new_tokens=4, eval_batch_size=2)
  base = _lowered(config, "update")
  variants = [_lowered(config, "update", **flags) for flags in (
      dict(loss="cispo"), dict(loss="sapo"), dict(loss="sapo", sapo_tau_neg=2.0), dict(entropy_coef=0.01),
      dict(top_entropy_quantile=0.2))]
  assert base not in variants and len(set(variants)) == len(variants)


@pytest.mark.devices(4)
@pytest.mark.parametrize("flags,names,metrics", [
    (dict(loss="cispo", epsilon_high=3.0, entropy_coef=0.01), ["sampler", "logprobs", "batch", "update",
                                                                "eval_greedy"],
     ("clip_frac_high", "entropy_loss")),
    (dict(loss="sapo", top_entropy_quantile=0.5, lora_rank=4, lora_alpha=8.0),
     ["sampler", "old_logprobs", "logprobs", "batch", "update", "eval_greedy"],
     ("sapo_gradient_scale", "entropy_mask_frac")),
    (dict(token_layout="buckets", bucket_micro_batches=2, bucket_widths=2, beta=0.04),
     ["sampler", "logprobs", "batch", "update", "eval_greedy"], ("kl", "entropy")),  # length buckets, per shard
    (dict(algo="ppo", token_layout="buckets", bucket_micro_batches=2, bucket_widths=2, beta=0.04),
     ["sampler", "logprobs", "values", "batch", "update", "eval_greedy"], ("value_loss", "kl_reward")),  # PPO's too
])
def test_the_policy_losses_run_on_a_mesh_and_with_lora(tmp_path, flags, names, metrics):
  # A one-step run on a 2 x 2 (data, fsdp) mesh with π_old recomputed (ratios off 1) logs the loss's metrics,
  # finite; programs(config) lists the run's programs and each compiles.
  from experiments.trainer import loop  # pylint: disable=import-outside-toplevel
  from experiments.runner import placement as placement_lib  # pylint: disable=import-outside-toplevel
  from experiments.trainer import programs  # pylint: disable=import-outside-toplevel
  config = config_lib.Config().replace(
      mesh="data:2,fsdp:2", tiny_layers=1, batch_size=4, group_size=2, max_new_tokens=6, completion_pad_multiple=0,
      temperature=0.7, recompute_old_logprobs=True, steps=1, sft_steps=0, eval_every=0, num_test=4,
      eval_batch_size=4, save_every=0, tensorboard=False, work_dir=str(tmp_path / "run"), **flags)
  loop.run(config)
  records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if "train/loss" in r][-1]
  for name in metrics:
    assert np.isfinite(train[f"train/{name}"]), name
  listed = programs.programs(config, aot.policy_config(config.model), placement_lib.Placement.from_config(config.mesh))
  assert list(listed) == names
  for program in listed.values():
    program.jitted.trace(*program.args, **program.kwargs).lower().compile()


def test_bad_flags_are_one_line(tmp_path):
  for flags, message in ((["--topology=v9z:2x2"], "aot_compile: cannot describe TPU topology 'v9z:2x2'"),
                         (["--topology=cpu"], "aot_compile: --mesh is empty"),
                         (["--topology=cpu", "--mesh=data:1", "--tiny_hidden_size=36"],
                          "aot_compile: --tiny_hidden_size must be a positive multiple of 8"),
                         # issue 55's sweep: "fits ... within nan GiB", a traceback after compiling everything
                         (["--topology=cpu", "--mesh=data:1", "--hbm_gib=nan"],
                          "aot_compile: --hbm_gib must be a finite number of GiB > 0, not nan"),
                         (["--topology=cpu", "--mesh=data:1", f"--json_out={tmp_path / 'none' / 'f.jsonl'}"],
                          f"aot_compile: --json_out: cannot write {tmp_path / 'none' / 'f.jsonl'}"),
                         (["--topology=cpu", "--mesh=data:1", "--lora_rank=100000"],
                          "aot_compile: --lora_rank=100000 exceeds the embedded model's width")):
    result, _ = _run_script(tmp_path, "--programs=logprobs", *flags)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr[-2000:]


def test_tiny_model_is_the_runners():
  # An empty --model compiles the model the runner builds for the same --tiny_layers / --tiny_hidden_size.
  for layers, hidden in ((4, 128), (1, 32)):
    model = config_lib.PolicyConfig(tiny_layers=layers, tiny_hidden_size=hidden, dtype="bfloat16", scan_layers=True)
    runner = models.tiny_config(**policy.tiny_overrides(model), **policy.runtime(model))
    assert aot.policy_config(model) == runner
    assert runner.num_hidden_layers == layers and runner.hidden_size == hidden and runner.scan_layers
  assert aot.policy_config(config_lib.PolicyConfig(model="qwen2.5-1.5b")).hidden_size == 1536


@pytest.mark.devices(8)
def test_gpu_path_flags_compile_for_cpu():
  """--dtype=bfloat16 --remat with a mesh: the run's programs compile for 8 (fake CPU) devices."""
  cpu = aot.target("cpu")
  assert len(cpu.devices) == 8 and cpu.chip is None
  config = config_lib.Config().replace(dtype="bfloat16", remat=True, remat_policy="dots_no_batch", tiny_layers=1,
                                       mesh="data:2,fsdp:2,tensor:2", sharding_rules="fsdp_tp", batch_size=4,
                                       group_size=4, max_prompt_len=16, max_new_tokens=24, grad_accum_steps=2,
                                       eval_batch_size=4, num_test=4)
  results, resident = aot.compile_programs(config, cpu, ("update", "logprobs", "sampler"), log=lambda s: None)
  assert [r.name for r in results] == ["sampler", "logprobs", "update"]
  assert all(r.flops > 0 and r.argument > 0 and not r.error for r in results)
  assert resident["train state"] > 0 and resident["reference"] > 0
  assert aot.report(config, cpu, results, resident, None)[-1].startswith("fits")
  assert aot.report(config, cpu, results, resident, 1e-6)[-1].startswith("DOES NOT FIT")


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

  def h(w, x):  # while loops nested in a while loop (the rollout engine's phases and steps)
    step = lambda c: (c[0] @ w[0], c[1] + 1)
    return jax.lax.while_loop(lambda c: c[1].sum() < 1e9,
                              lambda c: jax.lax.while_loop(lambda d: d[1].sum() < 1e9, step, c), (x, x))[0]

  assert aot.matmul_flops(jax.make_jaxpr(h)(w, x).jaxpr, while_trips=(1, 9)) == 9 * one
  assert aot.matmul_flops(jax.make_jaxpr(h)(w, x).jaxpr, while_trips=3) == 9 * one  # an int: every level
  # Forward and backward: each matmul and its two transposes (the checkpointed matmul's recomputation is
  # dead code here: a matmul's transposes need its inputs, not its output).
  grad = jax.make_jaxpr(jax.grad(lambda w: f(w, x).sum()))(w).jaxpr
  assert aot.matmul_flops(grad) == 3 * 11 * one



_HLO = """HloModule m

%body.1 (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4]{0} get-tuple-element(%p), index=1
  %c = s32[] constant(1)
  %j = s32[] add(%i, %c)
  %y = f32[4]{0} fusion(%x), kind=kLoop, calls=%f
  %z = f32[4]{0} fusion(%y), kind=kLoop, calls=%f
  %b = f32[2,2]{1,0} bitcast(%z)
  %d = f32[2,2]{1,0} dot(%b, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (s32[], f32[4]) tuple(%j, %z)
}

%cond.1 (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(8)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main.1 (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %y = f32[4]{0} fusion(%a), kind=kLoop, calls=%f
  %s = (s32[], f32[4]) tuple(%c0, %y)
  %w = (s32[], f32[4]) while(%s), condition=%cond.1, body=%body.1
  ROOT %r = f32[4]{0} get-tuple-element(%w), index=1
}
"""


def test_loop_instructions_by_hand():
  """The while body's instructions that do work: the add, two fusions and the dot (not the parameter, tuple
  elements, constant, bitcast or tuple; not the entry's fusion or the condition's compare)."""
  assert aot.loop_instructions(_HLO) == (4, {"fusion": 2, "add": 1, "dot": 1})
  assert aot.loop_instructions(_HLO.replace("while(", "call(")) == (0, {})


def test_decode_projections_take_products_out_of_a_decode_step():
  """The tiny sampler compiled for this CPU: a decode step (the largest loop body) launches fewer instructions as
  --decode_projections fuses more. Per layer, separate runs q, k, v, gate and up as 5 products, auto 3 (k with v,
  gate with up), together 2 (q/k/v, gate/up): at 2 layers, at least 4 and 2 fewer (a product is one fusion here)."""
  cpu = aot.target("cpu")
  ops = {}
  for mode in ("separate", "auto", "together"):
    config = config_lib.Config().replace(tiny_layers=2, batch_size=2, group_size=2, max_prompt_len=8,
                                         max_new_tokens=8, decode_projections=mode, sampler="static",
                                         mesh="data:1")
    (result,), _ = aot.compile_programs(config, cpu, ("sampler",), log=lambda s: None)
    assert sum(result.loop_op_kinds.values()) == result.loop_ops > 0
    ops[mode] = result.loop_ops
  assert ops["separate"] - ops["auto"] >= 2 * 2 and ops["auto"] - ops["together"] >= 2 * 1, ops
