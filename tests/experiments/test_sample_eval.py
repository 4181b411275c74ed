"""`python -m experiments.sample_eval`: Maj@k and Pass@k worked out by hand from injected samples; bad inputs: one line
naming the flag, nothing written."""

import json

from absl import flags as absl_flags
import numpy as np
import pytest

from experiments import cli
from experiments import sample_eval
from experiments.runner import evaluation as runner_evaluation
from experiments.runner import git_commit
from experiments.runner import task as task_lib
from grpo_jax import models


@pytest.mark.parametrize("args, message", [
    ([], "--init_checkpoint is required"),
    (["--init_checkpoint=p"], "--eval_samples must be >= 1"),
    (["--init_checkpoint=p", "--eval_samples=4", "--model=m"], "--model: sample_eval does not read it (use "
                                                                "--init_checkpoint)"),
    (["--init_checkpoint=p", "--eval_samples=4", "--temperature=1.0"], "--temperature: sample_eval does not read it "
                                                                       "(use --eval_temperature)"),
    (["--init_checkpoint=p", "--eval_samples=4", "--mesh=data:1"], "--mesh: sample_eval does not read it"),
    (["--init_checkpoint=p", "--eval_samples=4", "--lora_rank=4"], "--lora_rank: sample_eval does not read it"),
    (["--init_checkpoint=p", "--eval_samples=4", "--eval_temperature=nan"], "--eval_temperature must be a finite"),
    (["--init_checkpoint=nope", "--eval_samples=4"], "checkpoint directory does not exist: nope"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, main_in_process, args, message):
  monkeypatch.chdir(tmp_path)
  error = main_in_process(cli.main_for("sample_eval", sample_eval.run),
                          ["sample_eval", f"--work_dir={tmp_path / 'out'}", *args])
  assert error.startswith("sample_eval: error: ") and message in error and "\n" not in error, error
  assert not (tmp_path / "out").exists()


def test_every_shared_flag_is_read_or_refused():
  """Every shared flag is either read (or harmless: --tensorboard) or in `UNREAD`: a new shared flag fails here
  until it is put in one of the two."""
  from experiments.runner import config as config_lib  # pylint: disable=import-outside-toplevel
  unread = set(sample_eval.UNREAD)
  assert len(unread) == len(sample_eval.UNREAD)
  read = {"compilation_cache_dir", "cpu_devices", "decode_projections", "dtype", "eval_batch_size", "eval_samples",
          "eval_temperature", "init_checkpoint", "math_verify_time_limit", "math_verify_workers", "max_new_tokens",
          "max_prompt_len", "num_test", "num_train", "num_validation", "paths_max_steps", "paths_min_steps",
          "prompt_template", "reward", "seed", "sft_examples", "synthetic_digits", "synthetic_max_steps",
          "synthetic_min_steps", "synthetic_ops", "task", "tensorboard", "test_file", "train_file", "work_dir"}
  assert not read & unread
  assert set(config_lib.Config().flat()) == read | unread


def test_sample_eval_reports_every_power_of_two(tmp_path, monkeypatch):
  """studies.sample_eval: Maj@k and unbiased Pass@k for k = 1, 2, 4 from one set of 4 samples per problem
  (completions injected, so the numbers are worked out by hand, whatever the tiny model would say)."""
  ks_up_to = runner_evaluation.ks_up_to
  assert ks_up_to(64) == [1, 2, 4, 8, 16, 32, 64] and ks_up_to(6) == [1, 2, 4, 6]
  policy = models.build_default_checkpoint(tmp_path / "policy", seed=0, num_hidden_layers=1, hidden_size=32,
                                           intermediate_size=96)
  calls = []

  def fake_generate(params, config, tokenizer, prompts, key, *, greedy=False, num_samples=1, **kwargs):
    answers = [e.answer for e in task_examples]
    right, wrong = (lambda i: f"#### {answers[i]}"), (lambda i: f"#### {int(answers[i]) + 1}")
    calls.append((greedy, num_samples, len(prompts)))
    if greedy:  # problem 0 right, problem 1 wrong
      return [[right(0)], [wrong(1)]], np.array([6, 6])
    # problem 0: r r w r (maj right at every k); problem 1: w w w r (maj wrong at every k)
    return [[right(0), right(0), wrong(0), right(0)], [wrong(1), wrong(1), wrong(1), right(1)]], np.array([6] * 8)

  absl_flags.FLAGS.unparse_flags()
  absl_flags.FLAGS(["sample_eval", f"--init_checkpoint={policy}", f"--work_dir={tmp_path / 'out'}", "--num_test=2",
                    "--num_train=20", "--eval_samples=4", "--tensorboard=false"])
  cfg = cli.config_from_flags()
  task_examples = task_lib.Task(cfg.task, models.load_tokenizer(policy), sft_lineage=False, seed=cfg.run.seed).test
  monkeypatch.setattr(runner_evaluation.evaluation, "generate", fake_generate)
  try:
    summary = sample_eval.run(cli.config_from_flags())
  finally:
    absl_flags.FLAGS.unparse_flags()
  assert calls == [(True, 1, 2), (False, 4, 2)]
  assert summary["ks"] == [1, 2, 4] and summary["accuracy"] == 0.5
  assert summary["code_version"] == git_commit.head_commit()
  # pass@k = 1 - C(n-c, k) / C(n, k) per problem, n = 4, c = 3 and 1
  assert summary["pass@1"] == pytest.approx((3 / 4 + 1 / 4) / 2)
  assert summary["pass@2"] == pytest.approx((1.0 + (1 - 3 / 6)) / 2)
  assert summary["pass@4"] == pytest.approx(1.0)
  assert [summary[f"maj@{k}"] for k in (1, 2, 4)] == [0.5, 0.5, 0.5]
  assert json.loads((tmp_path / "out" / "summary.json").read_text())["pass@2"] == pytest.approx(0.75)


def test_a_work_dir_another_evaluation_holds_is_one_line(tmp_path, main_in_process):
  """Issue 55's sweep: two evaluations into one --work_dir both wrote summary.json; the second is now refused."""
  from experiments.runner import work_dir_lock  # pylint: disable=import-outside-toplevel
  models.build_default_checkpoint(tmp_path / "policy", seed=0)
  with work_dir_lock.WorkDirLock(tmp_path / "out"):
    error = main_in_process(cli.main_for("sample_eval", sample_eval.run),
                            ["sample_eval", f"--work_dir={tmp_path / 'out'}", f"--init_checkpoint={tmp_path / 'policy'}",
                             "--eval_samples=2", "--num_test=2"])
  assert error.startswith("sample_eval: error: ") and "--work_dir" in error and "\n" not in error, error
  assert not (tmp_path / "out" / "summary.json").exists()
