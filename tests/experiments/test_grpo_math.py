"""End-to-end tests of the main job, `python -m experiments.grpo_math`, on tiny settings."""

import json
import os
import pathlib
import subprocess
import sys

from absl import flags
import jax
import numpy as np
import pytest

from experiments import cli
from experiments import grpo_math
from experiments.runner import profiling
from grpo_jax import models
from tests.conftest import HANG_GUARD_S
from tests.known_answers import known_answers  # noqa: F401  (a fixture)

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = ["--max_prompt_len=16", "--max_new_tokens=24", "--num_train=200", "--num_test=16", "--batch_size=4",
        "--group_size=4", "--eval_batch_size=16", "--synthetic_digits=1", "--tensorboard=false", "--tiny_layers=2",
        "--tiny_hidden_size=32"]


def _run(work_dir, *args):
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["grpo_math", f"--work_dir={work_dir}", *TINY, *args])
  return grpo_math.run()


def _params(path):
  params, _ = models.load_hf(path)
  return params


def test_smoke_sft_then_grpo(tmp_path, known_answers):  # right and wrong samples: the policy moves
  summary = _run(tmp_path, "--sft_steps=10", "--steps=3", "--eval_every=2", "--eval_samples=2")
  assert set(summary) >= {"start_accuracy", "final_accuracy", "final_format_rate"}
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if "train/reward_mean" in r]
  assert [r["step"] for r in train] == [1, 2, 3]
  for key in ("train/kl", "train/clip_frac_low", "train/clip_frac_high", "train/entropy", "train/response_length",
              "train/zero_variance_groups", "train/tokens_per_s", "train/time_sampling", "train/time_scoring",
              "train/time_update", "train/grad_norm"):
    assert np.isfinite(train[-1][key]), key
  evals = [r for r in records if "eval/accuracy" in r]
  assert [r["step"] for r in evals] == [0, 2, 3] and "eval/maj@2" in evals[-1] and "eval/pass@2" in evals[-1]
  # The start policy is the SFT policy (trained, so it differs from the random base), the final one moved on.
  base, sft, final = (_params(tmp_path / d) for d in ("base_model", "sft_policy", "final_policy"))
  assert not np.allclose(base["embed"]["embedding"], sft["embed"]["embedding"])
  assert not np.allclose(sft["embed"]["embedding"], final["embed"]["embedding"])
  assert (tmp_path / "checkpoints" / "3").is_dir()


def test_resume_is_exact(tmp_path):
  common = ["--sft_steps=0", "--steps=4", "--save_every=2", "--eval_every=0", "--beta=0.1", "--num_epochs=2",
            "--minibatch_size=8", "--dynamic_sampling", "--learning_rate=1e-3",
            "--overlong_buffer=20"]  # length shaping: reward variance even from a random-init policy
  _run(tmp_path / "straight", *common)
  _run(tmp_path / "stopped", *common, "--stop_after=2")
  assert not (tmp_path / "stopped" / "final_policy").exists()
  # The resumed steps under the profiler (a flag that may change on resume): the same run, and a trace of it.
  _run(tmp_path / "stopped", *common, "--resume", "--profile_steps=3:4")
  straight, resumed = _params(tmp_path / "straight" / "final_policy"), _params(tmp_path / "stopped" / "final_policy")
  jax.tree.map(np.testing.assert_array_equal, straight, resumed)
  programs = {p.name: p for p in profiling.summarize(tmp_path / "stopped" / "profile")}
  assert programs["jit_step"].runs == 2 * 2 * 2  # 2 steps x 2 epochs x 2 minibatches of 8 of the 16 rows
  assert programs["jit_step"].op_ms > 0 and programs["jit_step"].span_ms > 0
  base = _params(tmp_path / "straight" / "base_model")
  assert not np.array_equal(base["embed"]["embedding"], straight["embed"]["embedding"])


def _cli(*args, cwd):
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "experiments.grpo_math", *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=HANG_GUARD_S)


@pytest.mark.parametrize("args,message", [
    (["--group_size=1"], "--group_size must be >= 2"),
    (["--epsilon=0"], "--epsilon must be > 0"),
    (["--minibatch_size=7"], "--minibatch_size (0: batch_size*group_size) must divide"),
    (["--sft_batch_size=32", "--grad_accum_steps=64"], "--sft_batch_size must be divisible"),
    (["--task=gsm8k"], "--task=gsm8k needs --train_file"),
    (["--task=gsm8k", "--train_file=nope.jsonl", "--test_file=nope.jsonl"], "nope.jsonl"),
    (["--resume"], "--resume: no checkpoint in"),
    (["--profile_steps=3"], "--profile_steps must be FIRST:LAST with 1 <= FIRST <= LAST"),
    (["--steps=4", "--profile_steps=3:5"], "--profile_steps=3:5 ends after the run's last step (--steps=4)"),
    (["--model=/does/not/exist"], "--model: checkpoint directory does not exist: /does/not/exist"),
    (["--init_checkpoint=nope"], "--init_checkpoint: checkpoint directory does not exist: nope"),
    (["--task=gsm8k", "--train_file=nope.jsonl", "--test_file=nope.jsonl"], "--train_file: nope.jsonl does not exist"),
    (["--reward=orm", "--reward_model=nope"], "--reward_model: nope is not a directory"),
    (["--algo=ppo", "--group_size=1", "--value_init=nope"], "--value_init: checkpoint directory does not exist: nope"),
    # issue 55: numbers as numbers, and flags the method does not read
    (["--lora_rank=1000000000000"], "--lora_rank=1000000000000 exceeds the embedded model's width"),
    (["--lora_rank=4", "--lora_alpha=nan"], "--lora_alpha must be a finite number, not nan"),
    (["--reward=math_verify:1.0", "--math_verify_time_limit=inf"], "--math_verify_time_limit must be a finite"),
    (["--forward_memory_budget=nan"], "--forward_memory_budget must be a finite number, not nan"),
    (["--forward_memory_budget=inf"], "--forward_memory_budget must be a finite number, not inf"),
    (["--dynamic_sampling", "--algo=online_rft"], "--dynamic_sampling is read only by --algo=grpo; "
                                                  "--algo=online_rft does not use it"),
    (["--algo=dpo", "--beta=0.1"], "--beta is read only by --algo=grpo|ppo|flow_grpo; --algo=dpo does not use it"),
])
def test_bad_input_is_one_clear_line(tmp_path, args, message, main_in_process, monkeypatch):
  monkeypatch.chdir(tmp_path)  # relative paths as in a child process started there
  error = main_in_process(cli.main_for("grpo_math"), ["grpo_math", f"--work_dir={tmp_path / 'run'}", *args])
  assert isinstance(error, str) and error.startswith("grpo_math: error: ") and "\n" not in error, error
  assert message in error, error
  assert not (tmp_path / "run").exists()  # refused before the run writes anything


def test_a_lora_rank_above_the_checkpoints_width_is_refused_before_anything_runs(tmp_path, main_in_process):
  model = models.build_default_checkpoint(tmp_path / "model", num_hidden_layers=1, hidden_size=32,
                                          intermediate_size=64)
  error = main_in_process(cli.main_for("grpo_math"), ["grpo_math", f"--work_dir={tmp_path / 'run'}", f"--model={model}",
                                                      "--lora_rank=33"])
  assert error == (f"grpo_math: error: --lora_rank=33 exceeds the width of {model} (hidden size 32): a rank-r adapter "
                   "needs r <= the hidden size")
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("attention", ["cudnn", "pallas"])
def test_an_attention_kernel_the_backend_lacks_falls_back_to_xla_with_one_warning(tmp_path, attention, capsys):
  """Issue 55: --attention=cudnn or pallas on a CPU ended in a traceback in stage 1 and silently ran xla in stage 2
  while config.json said otherwise. Now one warning line names the flag and what runs, and config.json records it."""
  summary = _run(tmp_path, f"--attention={attention}", "--sft_steps=2", "--sft_batch_size=4", "--steps=1",
                 "--eval_every=0", "--num_test=4", "--eval_batch_size=4")
  warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("--attention")]
  needs = "an NVIDIA GPU and --dtype=bfloat16" if attention == "cudnn" else "a TPU"
  assert warnings == [f"--attention={attention}: its kernel needs {needs}, not cpu; running --attention=xla instead "
                      "(config.json records xla)"]
  assert json.loads((tmp_path / "config.json").read_text())["attention"] == "xla"
  assert summary["config"]["attention"] == "xla"


def test_malformed_jsonl_names_the_line(tmp_path):
  good = json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"})
  (tmp_path / "train.jsonl").write_text(good + "\n" + "{not json\n")
  result = _cli(f"--work_dir={tmp_path / 'run'}", "--task=gsm8k", f"--train_file={tmp_path / 'train.jsonl'}",
                f"--test_file={tmp_path / 'train.jsonl'}", cwd=tmp_path)
  # The process's contract: exit status 1, one line on stderr naming the problem, no traceback.
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1].startswith("grpo_math: error: ") and "train.jsonl:2" in result.stderr
  assert "Traceback" not in result.stderr, result.stderr[-2000:]


def test_a_batch_beyond_a_file_tasks_rl_pool_is_one_line(tmp_path):
  """Issue #55's sweep: 4 prompts a step from a file of 3 problems (after SFT's share) would repeat a problem in
  every step; the run stops with one line naming both numbers, before any checkpoint."""
  model_dir = models.build_default_checkpoint(tmp_path / "hf_model", seed=3, num_hidden_layers=1)
  records = [{"question": f"{a}+{a}?", "answer": f"{a}+{a}={2 * a}\n#### {2 * a}"} for a in range(3)]
  (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  with pytest.raises(grpo_math.RunError, match=r"^--batch_size=4 exceeds the 3 RL problems of --train_file=.*train\.jsonl$"):
    _run(tmp_path / "run", f"--model={model_dir}", "--task=gsm8k", f"--train_file={tmp_path / 'train.jsonl'}",
         f"--test_file={tmp_path / 'train.jsonl'}", "--steps=1", "--eval_every=0")
  assert not (tmp_path / "run" / "checkpoints").exists()


def test_existing_checkpoints_are_never_overwritten(tmp_path):
  _run(tmp_path, "--sft_steps=0", "--steps=1", "--eval_every=0")
  before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
  with pytest.raises(grpo_math.RunError, match="already holds checkpoints"):
    _run(tmp_path, "--sft_steps=0", "--steps=1", "--eval_every=0")
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before


def test_hf_checkpoint_on_gsm8k_jsonl_with_chat_template(tmp_path):
  model_dir = models.build_default_checkpoint(tmp_path / "hf_model", seed=3, num_hidden_layers=1)
  records = [{"question": f"Tom has {a} apples and buys {b} more. How many now?",
              "answer": f"{a}+{b}=<<{a}+{b}={a + b}>>{a + b}\n#### {a + b}"} for a, b in [(2, 3), (4, 5), (1, 7), (6, 2)]]
  jsonl = tmp_path / "gsm8k.jsonl"
  jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
  summary = _run(tmp_path / "run", f"--model={model_dir}", "--task=gsm8k", f"--train_file={jsonl}",
                 f"--test_file={jsonl}", "--prompt_template=chat", "--max_prompt_len=96", "--steps=2",
                 "--eval_every=0", "--reward=correctness:1.0,format:0.1", "--overlong_buffer=8", "--dtype=bfloat16")
  assert summary["num_eval_problems"] == 4
  assert not (tmp_path / "run" / "sft_policy").exists()  # an HF model skips the SFT warm start
  final = _params(tmp_path / "run" / "final_policy")
  assert final["embed"]["embedding"].shape == _params(model_dir)["embed"]["embedding"].shape
  tokenizer = models.load_tokenizer(tmp_path / "run" / "final_policy")
  assert tokenizer.decode(tokenizer.encode("12 + 3\n", add_special_tokens=False)) == "12 + 3\n"


@pytest.mark.parametrize("name", ["cpu_default.cfg", "deepseekmath_gsm8k.cfg"])
def test_presets_parse(name):
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["grpo_math", f"--flagfile={REPO / 'experiments' / 'configs' / name}"])
  if name == "cpu_default.cfg":  # the preset is what no flags gives
    for flag in flags.FLAGS.get_key_flags_for_module(cli):
      if flag.name != "work_dir":
        assert flag.value == flag.default, flag.name
  else:
    assert flags.FLAGS.group_size == 64 and flags.FLAGS.beta == 0.04 and flags.FLAGS.learning_rate == 1e-6
  flags.FLAGS.unparse_flags()


def test_scanned_layers_train_and_export_hf(tmp_path):
  summary = _run(tmp_path, "--sft_steps=0", "--steps=2", "--eval_every=0", "--scan_layers", "--remat",
                 "--remat_policy=dots_no_batch", "--overlong_buffer=20")
  assert 0 <= summary["final_accuracy"] <= 1
  final, config = models.load_hf(tmp_path / "final_policy")  # the HF checkpoint, in the unrolled layout
  assert not config.scan_layers and "layers_0" in final
  base = _params(tmp_path / "base_model")
  assert not np.array_equal(base["embed"]["embedding"], final["embed"]["embedding"])


def test_attention_that_runs_by_backend():
  from experiments.runner import config as config_lib  # pylint: disable=import-outside-toplevel
  from experiments.runner import policy  # pylint: disable=import-outside-toplevel
  model = lambda attention, dtype="bfloat16": config_lib.PolicyConfig(attention=attention, dtype=dtype)  # noqa: E731
  assert policy.attention_that_runs(model("cudnn"), "gpu") == ("cudnn", "")
  assert policy.attention_that_runs(model("pallas"), "tpu") == ("pallas", "")
  for name in ("auto", "einsum", "xla"):
    assert policy.attention_that_runs(model(name, "float32"), "cpu") == (name, "")
  attention, warning = policy.attention_that_runs(model("cudnn", "float32"), "gpu")
  assert attention == "xla" and warning == ("--attention=cudnn: its kernel needs an NVIDIA GPU and --dtype=bfloat16, "
                                            "not gpu with --dtype=float32; running --attention=xla instead "
                                            "(config.json records xla)")
  assert policy.attention_that_runs(model("pallas"), "gpu")[0] == "xla"
  assert policy.attention_that_runs(model("cudnn"), "tpu")[0] == "xla"
