"""Smoke runs of `python -m experiments.train_reward_model` on a tiny random policy."""

import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys

from absl import flags
import jax
import numpy as np
import pytest

from experiments import grpo_math
from experiments import train_reward_model
from experiments.runner import git_commit
from experiments.runner import preemption
from grpo_jax import models
from grpo_jax import reward_models as rm
from grpo_jax import sampling
from grpo_jax.reward_models import collect
from tests import known_answers
from tests.conftest import HANG_GUARD_S
from tests.experiments.runner.test_preemption import Child, _env

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = ["--max_prompt_len=16", "--max_new_tokens=12", "--num_train=40", "--num_test=8", "--sft_examples=0",
        "--synthetic_digits=1", "--tensorboard=false", "--rm_prompts=8", "--rm_eval_prompts=4",
        "--rm_samples_per_prompt=2", "--rm_sample_batch=4", "--rm_batch_size=8", "--rm_max_steps=3",
        "--mc_rollouts=2", "--rm_eval_every=2"]


def _policy(tmp_path):
  return models.build_default_checkpoint(tmp_path / "policy", num_hidden_layers=1, hidden_size=32,
                                         intermediate_size=64)


def _run(tmp_path, *args, signals=None):
  policy = _policy(tmp_path)
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["train_reward_model", f"--policy={policy}", f"--rm_dir={tmp_path / 'rm'}", *TINY, *args])
  return train_reward_model.run(*train_reward_model.config_from_flags(), signals=signals)


def test_smoke_prm_with_monte_carlo_labels(tmp_path):
  summary = _run(tmp_path, "--rm_kind=prm", "--rm_step_labels=mc_hard", "--rm_steps=3",
                 "--rm_learning_rate=1e-2")
  assert summary["kind"] == "prm" and summary["step_labels"] == "mc_hard"
  assert summary["train_completions"] == 16 and summary["eval_completions"] == 8
  assert summary["before/step/count"] > 0 and summary["time_total_s"] > 0
  assert summary["code_version"] == git_commit.head_commit()  # what a study's page names as the run's code
  records = [json.loads(line) for line in (tmp_path / "rm" / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if "train/loss" in r]
  assert [r["step"] for r in train] == [2, 3] and all(np.isfinite(r["train/loss"]) for r in train)
  assert [r["step"] for r in records if "eval/step/count" in r] == [0, 2, 3]
  params, config, kind = rm.load_reward_model(tmp_path / "rm" / "reward_model")
  assert kind == "prm" and (tmp_path / "rm" / "reward_model" / "tokenizer.json").is_file()
  policy, _ = models.load_hf(tmp_path / "policy")
  assert not np.array_equal(params["backbone"]["embed"]["embedding"], policy["embed"]["embedding"])  # it trained
  assert json.loads((tmp_path / "rm" / "summary.json").read_text())["kind"] == "prm"


@pytest.fixture
def right_and_wrong(monkeypatch):
  """`rm.sample_reward_data` with every problem's sample 0 answering `#### <answer>` (right) and sample 1
  `#### <answer + 1>` (wrong), whatever the random policy samples (it answers nothing right): outcome labels
  1 and 0, one right/wrong pair per problem."""
  real = rm.sample_reward_data

  def sample_reward_data(policy, config, tokenizer, examples, prompts, key, **kwargs):
    b, g, starts = kwargs["batch_size"], kwargs["samples_per_prompt"], []

    def sample(*args, **kw):  # the sampler call of the batch of examples[start:start + b]
      out = sampling.sample(*args, **kw)
      start = len(starts) * b
      starts.append(start)
      chunk = list(examples[start:start + b]) + [examples[start]] * b  # (the padded last batch: copies)
      texts = [f"#### {int(chunk[r // g].answer) + r % g}" for r in range(len(out.tokens))]
      return known_answers._inject_texts(out, texts, tokenizer)  # pylint: disable=protected-access

    with monkeypatch.context() as m:
      m.setattr(collect, "sampling", type("Sampling", (), {"sample": staticmethod(sample)}))
      return real(policy, config, tokenizer, examples, prompts, key, **kwargs)

  monkeypatch.setattr(rm, "sample_reward_data", sample_reward_data)


def test_smoke_orm_pairwise(tmp_path, right_and_wrong):
  summary = _run(tmp_path, "--rm_kind=orm", "--rm_loss=pairwise", "--rm_steps=2")
  assert summary["kind"] == "orm" and summary["loss"] == "pairwise" and summary["after/outcome/count"] == 8
  assert summary["train/outcome/positive_rate"] == 0.5 and summary["after/outcome/group_pairs"] == 4
  records = [json.loads(line) for line in (tmp_path / "rm" / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if "train/loss" in r]
  assert train and all(r["train/pairs"] > 0 and r["train/grad_norm"] > 0 for r in train)  # it trained on pairs
  params, _, kind = rm.load_reward_model(tmp_path / "rm" / "reward_model")
  assert kind == "orm"
  # Beside it, the rows it trained on (iterative RL's replay starts from them): 8 problems x 2, right then wrong.
  rows, prompt_len = rm.load_training_rows(tmp_path / "rm" / "reward_model")
  assert prompt_len == 16 and rows.tokens.shape == (16, 16 + 12) and rows.positions.shape == (16, 1)
  np.testing.assert_array_equal(rows.outcome, np.tile([1.0, 0.0], 8))
  np.testing.assert_array_equal(rows.labels[:, 0], rows.outcome)
  assert len(set(rows.group.tolist())) == 8
  assert not np.array_equal(params["backbone"]["embed"]["embedding"],
                            models.load_hf(tmp_path / "policy")[0]["embed"]["embedding"])


def test_smoke_orm_steps(tmp_path):
  summary = _run(tmp_path, "--rm_kind=orm_steps", "--rm_steps=2")
  assert summary["kind"] == "orm_steps" and summary["step_labels"] == "outcome"
  # Problems with both right and wrong samples give the within-problem pairs: one each with 2 samples a problem.
  assert summary["train_problems"] == 8 and summary["train/outcome/group_pairs"] == summary["train_mixed_problems"]
  assert summary["after/outcome/count"] == 8
  # Its step scores are checked against the synthetic task's exact step labels, which it never trained on.
  assert summary["after/step/count"] == summary["before/step/count"] >= 8  # a segment or more per completion
  assert "train/step/count" not in summary  # the training rows carry outcome labels only
  _, _, kind = rm.load_reward_model(tmp_path / "rm" / "reward_model")
  assert kind == "orm_steps"


def test_loglik_score_with_a_frozen_backbone(tmp_path, right_and_wrong):
  """--rm_score=loglik --rm_freeze_backbone: the saved model carries its trained α and the policy's backbone,
  bitwise."""
  summary = _run(tmp_path, "--rm_kind=orm_steps", "--rm_score=loglik", "--rm_freeze_backbone", "--rm_loss=pairwise",
                 "--rm_steps=3")
  assert summary["score"] == "loglik" and summary["frozen_backbone"] and summary["alpha"] != 1.0  # α trained
  params, config, kind = rm.load_reward_model(tmp_path / "rm" / "reward_model")
  assert kind == "orm_steps" and float(params["alpha"]) == pytest.approx(summary["alpha"])
  start, _ = models.load_hf(tmp_path / "policy")
  jax.tree.map(np.testing.assert_array_equal, params["backbone"], {k: v for k, v in start.items() if k != "lm_head"})
  assert summary["after/outcome/group_pairs"] == 4  # the held-out problems' (right, wrong) pairs, one each


def test_lora_adapters_train_and_save_merged(tmp_path, right_and_wrong):
  """--rm_lora_rank: adapters train on the backbone (its base weights as loaded) and are saved merged, a plain
  reward model whose backbone differs from the policy's by a rank-2 update of each adapted projection."""
  summary = _run(tmp_path, "--rm_kind=orm", "--rm_score=loglik", "--rm_lora_rank=2", "--rm_lora_alpha=4",
                 "--rm_loss=pairwise", "--rm_steps=3", "--rm_learning_rate=1e-2")
  assert summary["lora_rank"] == 2 and not summary["frozen_backbone"]
  params, config, _ = rm.load_reward_model(tmp_path / "rm" / "reward_model")
  assert config.lora_rank == 0 and "lora_a" not in str(jax.tree_util.tree_structure(params))
  start, _ = models.load_hf(tmp_path / "policy")
  np.testing.assert_array_equal(params["backbone"]["embed"]["embedding"], start["embed"]["embedding"])  # no adapter
  for name in ("q_proj", "o_proj"):
    delta = np.asarray(params["backbone"]["layers_0"]["attn"][name]["kernel"]
                       - start["layers_0"]["attn"][name]["kernel"])
    assert np.abs(delta).max() > 0  # the adapters moved it ...
    assert np.linalg.matrix_rank(delta.reshape(delta.shape[0], -1) if name == "q_proj"
                                 else delta.reshape(-1, delta.shape[-1]), tol=1e-7) <= 2  # ... at rank 2


def test_rm_init_starts_from_another_backbone(tmp_path):
  verifier = models.build_default_checkpoint(tmp_path / "verifier", seed=7, num_hidden_layers=2, hidden_size=48,
                                             intermediate_size=96)
  summary = _run(tmp_path, "--rm_kind=orm", "--rm_steps=0", f"--rm_init={verifier}")
  assert summary["backbone"] == str(verifier) and "after/outcome/group_auc" in summary
  params, config, _ = rm.load_reward_model(tmp_path / "rm" / "reward_model")
  assert (config.num_hidden_layers, config.hidden_size) == (2, 48)  # the verifier's shape, not the policy's (1, 32)
  start, _ = models.load_hf(verifier)
  np.testing.assert_array_equal(params["backbone"]["embed"]["embedding"], start["embed"]["embedding"])  # 0 steps


def test_rm_init_must_read_the_policys_tokens(tmp_path, monkeypatch):
  # Refused before the logs start: no W&B run or TensorBoard writer is left open by a bad --rm_init.
  from experiments import train_reward_model  # pylint: disable=import-outside-toplevel
  started = []
  monkeypatch.setattr(train_reward_model.logs, "start", lambda *a, **k: started.append(a))
  other = models.build_default_checkpoint(tmp_path / "other", num_hidden_layers=1, hidden_size=32,
                                          intermediate_size=64, vocab_size=300)
  with pytest.raises(grpo_math.RunError, match="vocabulary of 300 tokens"):
    _run(tmp_path, "--rm_kind=orm", "--rm_steps=0", f"--rm_init={other}")
  assert not started


def test_errors_are_one_line(tmp_path, main_in_process, monkeypatch):
  # The process: exit status 1 and the one line on stderr.
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-m", "experiments.train_reward_model", f"--rm_dir={tmp_path / 'x'}"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 1 and len(lines) == 1, out.stderr[-2000:]
  assert lines[0].startswith("train_reward_model: error: --policy is required"), lines
  # The other bad inputs, in this process.
  monkeypatch.chdir(tmp_path)
  cases = [([f"--policy={tmp_path / 'none'}"], "checkpoint directory does not exist"),
           (["--rm_kind=prm", "--rm_loss=pairwise"], "--rm_loss=pairwise needs an outcome reward model"),
           (["--rm_kind=prm", "--rm_score=loglik"], "--rm_score=loglik needs an outcome reward model"),
           (["--policy=p", "--mesh=data:1"], "train_reward_model runs on one device in one process"),
           (["--policy=p", "--rm_learning_rate=nan"], "--rm_learning_rate must be a finite number > 0, not nan"),
           (["--policy=p", "--rm_lora_rank=2", "--rm_freeze_backbone"], "--rm_lora_rank trains adapters on the "
                                                                       "backbone, --rm_freeze_backbone none of it"),
           (["--policy=p", "--rm_lora_rank=-1"], "--rm_lora_rank must be >= 0"),
           # issue 55: a shared flag this runner does not read is refused, with the one it reads instead
           (["--policy=p", "--lora_rank=4"], "--lora_rank: train_reward_model does not read it; leave it at its "
                                             "default"),
           (["--policy=p", "--work_dir=w"], "--work_dir: train_reward_model does not read it (use --rm_dir)"),
           (["--policy=p", "--steps=5"], "--steps: train_reward_model does not read it (use --rm_steps)"),
           (["--policy=p", "--algo=ppo"], "--algo: train_reward_model does not read it"),
           (["--policy=p", "--token_layout=buckets"], "--token_layout: train_reward_model does not read it")]
  for args, message in cases:
    error = main_in_process(train_reward_model.main, ["train_reward_model", f"--rm_dir={tmp_path / 'x'}", *args])
    assert isinstance(error, str) and error.startswith("train_reward_model: error: ") and message in error, error
  jax.clear_caches()


# The shared flags train_reward_model reads (or checks, as the mesh's): with `UNREAD`, every shared flag. A new
# shared flag fails `test_every_shared_flag_is_read_or_refused` until it is put in one of the two.
READ = {"compilation_cache_dir", "coordinator_address", "cpu_devices", "decode_projections", "dtype",
        "keep_checkpoints", "math_verify_time_limit", "math_verify_workers", "max_grad_norm", "max_new_tokens",
        "max_prompt_len", "mesh", "num_processes", "num_slots", "num_test", "num_train", "num_validation",
        "paths_max_steps", "paths_min_steps", "process_id", "prompt_template", "remat", "resume", "reward",
        "sampler", "save_every", "seed", "sft_examples", "synthetic_digits", "synthetic_max_steps",
        "synthetic_min_steps", "synthetic_ops", "task", "temperature", "tensorboard", "test_file", "top_k",
        "top_p", "train_file", "wandb_entity", "wandb_mode", "wandb_project", "wandb_run_name", "warmup_steps",
        "weight_decay"}


def test_every_shared_flag_is_read_or_refused():
  from experiments.runner import config as config_lib  # pylint: disable=import-outside-toplevel
  unread = set(train_reward_model.UNREAD)
  assert len(unread) == len(train_reward_model.UNREAD) and not READ & unread
  assert set(config_lib.Config().flat()) == READ | unread


def _same_run(expected_dir, actual_dir):
  """The same reward model, bit for bit, and the same metrics.jsonl records and summary (times aside)."""
  expected, actual = (rm.load_reward_model(d / "reward_model")[0] for d in (expected_dir, actual_dir))
  jax.tree.map(np.testing.assert_array_equal, expected, actual)
  records = [[{k: v for k, v in json.loads(line).items() if k != "time"}
              for line in (d / "metrics.jsonl").read_text().splitlines()] for d in (expected_dir, actual_dir)]
  assert records[0] == records[1]
  summaries = [{k: v for k, v in json.loads((d / "summary.json").read_text()).items()
                if not k.startswith("time_") and k != "backbone"} for d in (expected_dir, actual_dir)]  # (its path)
  assert summaries[0] == summaries[1]
  assert not (actual_dir / "checkpoints").exists()  # removed once the reward model is saved


RESUMED = ["--rm_kind=orm", "--rm_steps=400", "--save_every=20", "--rm_eval_every=100"]


def test_sigterm_then_resume_equals_an_uninterrupted_run(tmp_path, main_in_process):
  """A real child process, SIGTERM after training step 10: it saves the step it stops after (exit 143, one line
  with the --resume command); resumed with other sampling flags it refuses in one line; resumed as printed, its
  reward model, metrics and summary equal an uninterrupted run's."""
  policy = _policy(tmp_path)
  rm_dir = tmp_path / "interrupted" / "rm"
  child = Child([sys.executable, "-m", "experiments.train_reward_model", f"--policy={policy}", f"--rm_dir={rm_dir}",
                 *TINY, *RESUMED])
  child.wait_for(r"\] 10/400 ")
  child.proc.send_signal(signal.SIGTERM)
  code, err = child.finish(), child.stderr
  assert code == 143 and "Traceback" not in err, err[-3000:]
  last = err.strip().splitlines()[-1]
  found = re.fullmatch(r"train_reward_model: interrupted by SIGTERM: stopped after reward-model training step "
                       r"(\d+), saved in (\S+); continue with: (.+)", last)
  assert found, last
  step, saved, command = int(found.group(1)), pathlib.Path(found.group(2)), shlex.split(found.group(3))
  assert 10 < step < 400 and step % 10 == 0 and command[-1] == "--resume", last
  assert saved == rm_dir / "checkpoints" and (saved / "data.npz").is_file() and (saved / str(step)).is_dir()
  assert not (rm_dir / "reward_model").exists() and not (rm_dir / "run.lock").exists()

  error = main_in_process(train_reward_model.main, ["train_reward_model", *command[3:], "--rm_prompts=6"])
  assert isinstance(error, str) and "\n" not in error, error
  assert error.startswith("train_reward_model: error: --resume: checkpoint step 0 was saved with --rm_prompts=8 "
                          "(now 6); resume with the same values, or start a new --rm_dir"), error

  resumed = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"resumed from step {step} in {saved}" in resumed.stderr and "sampling" not in resumed.stderr
  _run(tmp_path / "straight", *RESUMED)
  _same_run(tmp_path / "straight" / "rm", rm_dir)
  jax.clear_caches()


class _StopAfterSampling:
  """`preemption.StopSignals` as if SIGINT came while the policy sampled."""
  signum = signal.SIGINT

  def stop_requested(self):
    return True


def test_stopped_after_sampling_resumes_without_sampling(tmp_path, main_in_process, monkeypatch):
  """Stopped before the first training step: only the samples are saved; --resume trains on them (the sampler is
  not called) to an uninterrupted run's reward model. --resume without a checkpoint, and a new run over one,
  are refused in one line."""
  args = ["--rm_kind=orm_steps", "--rm_steps=12", "--save_every=5", "--rm_eval_every=4"]
  with pytest.raises(preemption.Interrupted) as stopped:
    _run(tmp_path / "interrupted", *args, signals=_StopAfterSampling())
  saved = tmp_path / "interrupted" / "rm" / "checkpoints"
  assert (stopped.value.step, stopped.value.saved, stopped.value.exit_status) == (0, saved, 130)
  assert sorted(p.name for p in saved.iterdir()) == ["data.npz"]
  assert not (tmp_path / "interrupted" / "rm" / "metrics.jsonl").exists()

  error = main_in_process(train_reward_model.main, ["train_reward_model", f"--policy={tmp_path / 'x'}",
                                                    f"--rm_dir={tmp_path / 'interrupted' / 'rm'}", *TINY, *args])
  assert error == (f"train_reward_model: error: {saved} already holds checkpoints; pass --resume to continue, "
                   "--rm_overwrite to start over, or choose another --rm_dir"), error
  error = main_in_process(train_reward_model.main, ["train_reward_model", f"--policy={tmp_path / 'x'}",
                                                    f"--rm_dir={tmp_path / 'none'}", "--resume"])
  assert error == f"train_reward_model: error: --resume: no checkpoint in {tmp_path / 'none' / 'checkpoints'}"

  with monkeypatch.context() as m:
    m.setattr(rm, "sample_reward_data", lambda *a, **k: pytest.fail("--resume sampled again"))
    _run(tmp_path / "interrupted", *args, "--resume")
  _run(tmp_path / "straight", *args)
  _same_run(tmp_path / "straight" / "rm", tmp_path / "interrupted" / "rm")
