"""End-to-end tests of `python -m experiments.flow_grpo` on tiny settings."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

from absl import flags
import jax
import numpy as np
import pytest

from experiments import flow_grpo
from experiments import methods
from experiments.methods import flow_grpo as flow_method
from experiments.runner import config as config_lib
from grpo_jax import models
from tests.conftest import HANG_GUARD_S

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = ["--tiny_layers=1", "--tiny_hidden_size=32", "--num_train=120", "--num_test=8", "--sft_examples=60",
        "--eval_batch_size=8", "--batch_size=2", "--group_size=2", "--max_turns=3", "--planner_prompt_len=40",
        "--action_tokens=16", "--memory_budget=28", "--sft_batch_size=8", "--tensorboard=false", "--min_bucket=4"]


def _run(work_dir, *args):
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["flow_grpo", f"--work_dir={work_dir}", *TINY, *args])
  return flow_grpo.run()


def _params(path):
  return models.load_hf(path)[0]


def _alternating_rewards(monkeypatch):
  """Right and wrong outcomes by construction: the training reward of trajectory i is i % 2, so every group has
  non-zero advantages whatever a tiny policy answers (which depends on the processor's rounding: on some it fails
  every tool call and every group's rewards tie). Evaluations keep the real scores."""
  real_score = flow_method.rewards_lib.score
  monkeypatch.setattr(flow_method.rewards_lib, "score", lambda outputs, examples, reward_fn: (
      real_score(outputs, examples, reward_fn) if isinstance(reward_fn, str)
      else (np.arange(len(outputs)) % 2).astype(np.float32)))


def test_smoke_sft_then_flow_grpo(tmp_path, monkeypatch):
  _alternating_rewards(monkeypatch)
  summary = _run(tmp_path, "--sft_steps=4", "--steps=2", "--save_every=1", "--sft_learning_rate=1e-2")
  for key in ("start_accuracy", "final_accuracy", "final_mean_turns", "final_tool_error_rate", "start_mean_turns",
              "final_answer_rate", "wall_time_s"):
    assert np.isfinite(summary[key]), key
  assert 1.0 <= summary["final_mean_turns"] <= 3.0
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if "train/reward_mean" in r]
  assert [r["step"] for r in train] == [1, 2]
  for key in ("train/loss", "train/kl", "train/mean_turns", "train/tool_error_rate", "train/turn_rows",
              "train/entropy", "train/grad_norm", "train/clip_frac", "train/time_sampling", "train/time_update"):
    assert np.isfinite(train[-1][key]), key
  assert train[-1]["train/turn_rows"] >= 4  # B·G = 4 trajectories of at least one turn
  # Whatever a step's turns, its rows are one count (one compiled update and forward): room for 4 trajectories x 3
  # turns (--max_turns), in micro-batches of 4 / 2 rows, the empty ones skipped
  assert {r["train/turn_rows"] + r["train/padded_rows"] for r in train} == {12}
  assert [r["train/reward_mean"] for r in train] == [0.5, 0.5]  # the constructed rewards reached the update
  assert [r["step"] for r in records if "eval/accuracy" in r] == [0, 2]
  base, sft, final = (_params(tmp_path / d) for d in ("base_model", "sft_policy", "final_policy"))
  assert not np.allclose(base["embed"]["embedding"], sft["embed"]["embedding"])
  assert not np.allclose(sft["embed"]["embedding"], final["embed"]["embedding"])
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["1", "2"]
  marker = tmp_path / "sft_policy" / methods.FlowGRPO.sft_marker
  assert json.loads(marker.read_text())["sft_examples"] == 60


def test_resume_is_exact(tmp_path, monkeypatch):
  _alternating_rewards(monkeypatch)  # non-zero advantages: each step moves the policy, so resume must restore it
  common = ["--sft_steps=0", "--steps=2", "--save_every=1", "--learning_rate=1e-3", "--beta=0.1",
            "--num_epochs=2", "--minibatch_size=2"]
  _run(tmp_path / "straight", *common)
  _run(tmp_path / "stopped", *common, "--stop_after=1")
  assert not (tmp_path / "stopped" / "final_policy").exists()
  _run(tmp_path / "stopped", *common, "--resume")
  straight, resumed = _params(tmp_path / "straight" / "final_policy"), _params(tmp_path / "stopped" / "final_policy")
  assert not np.array_equal(straight["embed"]["embedding"], _params(tmp_path / "straight" / "base_model")["embed"][
      "embedding"])
  jax.tree.map(np.testing.assert_array_equal, straight, resumed)
  records = {d: [json.loads(line) for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
             for d in ("straight", "stopped")}
  step2 = {d: next(r for r in records[d] if r["step"] == 2 and "train/loss" in r) for d in records}
  for key in ("train/loss", "train/grad_norm", "train/reward_std"):
    assert step2["straight"][key] == step2["stopped"][key], key
  assert step2["straight"]["train/grad_norm"] > 0 and step2["straight"]["train/reward_std"] > 0


def test_continued_sft_trains_the_teacher_turns_of_the_step_queries_at_coefficient_one(tmp_path):
  # --max_turns=4: room for a 3-step problem's three calls and its answer
  _run(tmp_path / "sft", "--sft_steps=4", "--steps=0", "--sft_learning_rate=1e-2", "--max_turns=4")
  start = tmp_path / "sft" / "sft_policy"
  _run(tmp_path / "cont", "--planner_objective=sft", f"--init_checkpoint={start}", "--steps=2",
       "--learning_rate=1e-3", "--save_every=0", "--max_turns=4")
  train = [r for r in map(json.loads, (tmp_path / "cont" / "metrics.jsonl").read_text().splitlines())
           if "train/loss" in r]
  assert [r["step"] for r in train] == [1, 2]
  for r in train:
    # B = 2 queries of 2-3 steps: each teacher trajectory is its calculator calls then the answer, all correct
    assert r["train/teacher_trajectories"] == 2 and r["train/answer_rate"] == 1 and r["train/tool_error_rate"] == 0
    assert 2 * 3 <= r["train/turn_rows"] <= 2 * 4 and r["train/mean_turns"] * 2 == r["train/turn_rows"]
    assert r["train/turn_rows"] + r["train/padded_rows"] == 16  # room for B·G = 4 trajectories x 4 turns
    # At ratio 1 with A = 1 on every action token, eq. 5's weights sum to 1: the loss is −1, and no KL term
    # although --beta is 0.04
    assert r["train/pg_loss"] == pytest.approx(-1.0, abs=1e-5) and r["train/kl_loss"] == 0
    assert r["train/optimizer_steps"] == 1 and r["train/ratio_min"] == r["train/ratio_max"] == 1
  assert not np.allclose(_params(start)["embed"]["embedding"],
                         _params(tmp_path / "cont" / "final_policy")["embed"]["embedding"])


@pytest.mark.parametrize("objective,aggregation,reference", [
    ("flow_grpo", "turn", True), ("trajectory_grpo", "trajectory", True), ("sft", "turn", False)])
def test_planner_objective_picks_the_aggregation_and_the_kl_term(objective, aggregation, reference):
  assert config_lib.Config().agent.planner_objective == "flow_grpo"  # eq. 5 by default
  config = config_lib.Config().replace(**config_lib.PRESETS["flow_grpo"], planner_objective=objective)
  method = flow_method.FlowGRPO(config, models.tiny_config(), None, None, None)
  bound = method.objective()
  assert bound.keywords["aggregation"] == aggregation and bound.keywords["use_reference"] is reference
  assert bound.keywords["loss_kwargs"]["beta"] == (0.04 if reference else 0.0)
  assert method.scoring_forwards() == (("π_old", "π_ref") if reference else ("π_old",))


@pytest.mark.parametrize("flags_,message", [
    ({"planner_objective": "token"}, "--planner_objective must be one of flow_grpo, trajectory_grpo, sft"),
    ({"planner_objective": "sft", "num_epochs": 2}, "--planner_objective=sft updates once a step"),
    ({"planner_objective": "sft", "minibatch_size": 64}, "--planner_objective=sft updates once a step"),
    ({"algo": "grpo", "planner_objective": "sft"}, "--planner_objective is read only by --algo=flow_grpo"),
])
def test_bad_planner_objective_is_one_line(flags_, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.Config().replace(**config_lib.PRESETS["flow_grpo"]).replace(**flags_)


def _cli(*args, cwd):
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "experiments.flow_grpo", *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=HANG_GUARD_S)


@pytest.mark.parametrize("args,message", [
    (["--tools=calc,shell"], "flow_grpo: error: --tools: unknown tools ['shell']"),
    (["--max_turns=0"], "--max_turns must be >= 1"),
    (["--dynamic_sampling"], "flow_grpo: error: --dynamic_sampling is a GRPO option that Flow-GRPO does not use"),
    (["--reward=orm", "--reward_model=rm"], "flow_grpo: error: --reward_model is a GRPO option"),
    (["--mesh=data:1"], "flow_grpo: error: --algo=flow_grpo runs on one device"),
    (["--algo=grpo"], "flow_grpo: error: --algo: this runner trains Flow-GRPO"),
    (["--planner_objective=sft", "--num_epochs=2"], "flow_grpo: error: --planner_objective=sft updates once a step"),
    (["--planner_prompt_len=8"], "flow_grpo: error: --planner_prompt_len=8: the planner's prompt (tool header, "
                                 "problem, cue) takes"),
])
def test_bad_input_is_one_line(tmp_path, args, message, main_in_process, monkeypatch):
  monkeypatch.chdir(tmp_path)
  error = main_in_process(flow_grpo.main, ["flow_grpo", f"--work_dir={tmp_path}", "--sft_steps=0", *args],
                          defaults=flow_grpo.DEFAULTS)  # as the program sets them
  assert isinstance(error, str) and error.startswith("flow_grpo: error: ") and "\n" not in error, error
  assert message in error, error


def test_bad_input_exits_with_one_line(tmp_path):
  """The process's contract: exit status 1, one line on stderr, no traceback."""
  result = _cli(f"--work_dir={tmp_path}", "--sft_steps=0", "--max_turns=0", cwd=tmp_path)
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1].startswith("flow_grpo: error: --max_turns must be >= 1")


def test_preset_is_the_default():
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["flow_grpo", f"--flagfile={REPO / 'experiments' / 'configs' / 'flow_grpo.cfg'}"])
  try:
    for name, value in flow_grpo.DEFAULTS.items():
      assert flags.FLAGS[name].value == value, name
    for field in dataclasses.fields(config_lib.AgentConfig):  # the agent's flags: the preset is their defaults
      assert flags.FLAGS[field.name].value == field.default, field.name
    assert flags.FLAGS.kl == "k3" and flags.FLAGS.beta == 0.04 and flags.FLAGS.temperature == 0.7
  finally:
    flags.FLAGS.unparse_flags()
