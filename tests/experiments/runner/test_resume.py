"""`--resume` trusts nothing it has not checked: the flags a checkpoint was saved with (experiments/methods/
resume.py), damaged checkpoints, metrics logged after the checkpoint, and what earlier runs exported."""

import hashlib
import json
import os
import pathlib
import subprocess
import sys

from absl import flags
import jax
import numpy as np
import pytest

from experiments import grpo_math
from experiments import cli
from experiments.runner import config as config_lib
from experiments.runner import resume as resume_lib
from grpo_jax import models
from grpo_jax.training import checkpointing
from tests.conftest import HANG_GUARD_S, run_grpo_math

REPO = pathlib.Path(__file__).resolve().parents[3]
TINY = ["--max_prompt_len=16", "--max_new_tokens=16", "--num_train=200", "--num_test=8", "--batch_size=4",
        "--group_size=4", "--eval_batch_size=8", "--tensorboard=false", "--tiny_layers=1", "--tiny_hidden_size=32"]
COMMON = ["--sft_steps=0", "--steps=4", "--save_every=2", "--eval_every=0", "--learning_rate=1e-3",
          "--overlong_buffer=12"]  # length shaping: reward variance even from a random-init policy


def _run(work_dir, *args):
  return run_grpo_math(f"--work_dir={work_dir}", *TINY, *args)


def _cli(*args, cwd):
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "experiments.grpo_math", *TINY, *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=HANG_GUARD_S)


def _snapshot(directory: pathlib.Path) -> dict:
  """Every file under `directory` with its size and hash: "nothing on disk changed" is equality of two."""
  return {str(p.relative_to(directory)): hashlib.sha1(p.read_bytes()).hexdigest()
          for p in sorted(directory.rglob("*")) if p.is_file()}


def _truncate_largest_array(step_dir: pathlib.Path) -> None:
  array = max((p for p in step_dir.rglob("*") if p.is_file() and "ocdbt.process_0" in str(p)),
              key=lambda p: p.stat().st_size)
  array.write_bytes(array.read_bytes()[:array.stat().st_size // 2])


def _one_line_error(result, *needles, thread_noise=False):
  """`thread_noise`: orbax's restore of a damaged array fails while tensorstore's reader threads still run, and
  these may print their own tracebacks (asyncio "Event loop is closed", the failed read) before or after the
  run's error, timing permitting; the run's own outcome is still exactly one error line."""
  assert result.returncode != 0
  lines = result.stderr.strip().splitlines()
  if thread_noise:
    errors = [l for l in lines if l.startswith("grpo_math: error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    last = errors[0]
  else:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = lines[-1]
  assert last.startswith("grpo_math: error: "), result.stderr[-3000:]
  for needle in needles:
    assert needle in last, last


def _error_in_process(main_in_process, *args):
  """The one-line error of `grpo_math` on TINY + args, run in this process (conftest's `main_in_process`)."""
  error = main_in_process(cli.main_for("grpo_math"), ["grpo_math", *TINY, *args])
  assert isinstance(error, str) and error.startswith("grpo_math: error: ") and "\n" not in error, error
  return error


def test_check_flags_names_what_differs():
  now = {"seed": 1, "batch_size": 8, "steps": 50, "eval_every": 5}
  recorded = {"seed": 0, "batch_size": 8, "steps": 20, "eval_every": 10, "gone_flag": 3}
  with pytest.raises(resume_lib.ResumeError, match=r"saved with --seed=0 \(now 1\); ") as info:
    resume_lib.check_flags(recorded, now, 7, print)
  assert "--batch_size" not in str(info.value).split(";")[0] and "--steps" in str(info.value)  # in the may-change list
  resume_lib.check_flags({**recorded, "seed": 1}, now, 7, print)  # only may-change flags differ: accepted
  notes = []
  resume_lib.check_flags(None, now, 7, notes.append)
  assert notes and "flags not compared" in notes[0]


def test_the_record_is_the_whole_config():
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["grpo_math", "--seed=3"])
  recorded = resume_lib.record(cli.config_from_flags())
  flags.FLAGS.unparse_flags()
  assert recorded["seed"] == 3 and recorded["algo"] == "grpo" and "offline_prompts" in recorded
  assert recorded["group_size"] == 8  # resolved: GRPO's default G
  assert "verbosity" not in recorded and "logtostderr" not in recorded
  json.dumps(recorded)


def test_damaged_newest_checkpoint_resumes_from_the_older_one(tmp_path, capfd):
  _run(tmp_path / "straight", *COMMON)
  work = tmp_path / "crashed"
  _run(work, *COMMON)  # checkpoints 2 and 4, metrics of steps 1-4, then the newest checkpoint is damaged
  _truncate_largest_array(work / "checkpoints" / "4")
  capfd.readouterr()
  _run(work, *COMMON, "--resume")
  err = capfd.readouterr().err
  assert "checkpoints/4 cannot be restored" in err and "trying an older checkpoint" in err
  assert "moved aside" in err and "resumed from step 2" in err and "records of later steps dropped" in err
  assert (work / "checkpoints_damaged" / "4").is_dir()  # kept for inspection, not deleted
  assert sorted(p.name for p in (work / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "4"]
  straight, resumed = (models.load_hf(d / "final_policy")[0] for d in (tmp_path / "straight", work))
  jax.tree.map(np.testing.assert_array_equal, straight, resumed)
  base = models.load_hf(work / "base_model")[0]  # the steps moved the policy: the equality above is not of starts
  assert not np.array_equal(base["embed"]["embedding"], resumed["embed"]["embedding"])
  records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3, 4]  # each step once


def test_no_intact_checkpoint_is_one_line_and_moves_nothing(tmp_path):
  work = tmp_path / "run"
  _run(work, *COMMON)
  for step in ("2", "4"):
    _truncate_largest_array(work / "checkpoints" / step)
  before = _snapshot(work / "checkpoints")
  result = _cli(f"--work_dir={work}", *COMMON, "--resume", cwd=tmp_path)
  _one_line_error(result, "no intact checkpoint in", "tried steps 4, 2", thread_noise=True)
  assert _snapshot(work / "checkpoints") == before and not (work / "checkpoints_damaged").exists()


def test_resume_with_other_flags_is_refused(tmp_path, main_in_process):
  work = tmp_path / "run"
  _run(work, *COMMON, "--stop_after=2")
  before = _snapshot(work)
  error = _error_in_process(main_in_process, f"--work_dir={work}", *COMMON, "--resume", "--seed=1", "--batch_size=8")
  for needle in ("--seed=0 (now 1)", "--batch_size=4 (now 8)", "may change on resume", "--steps"):
    assert needle in error, error
  assert _snapshot(work) == before


def test_work_dirs_sft_policy_without_marker_is_refused(tmp_path):
  work = tmp_path / "run"
  models.build_default_checkpoint(work / "sft_policy", num_hidden_layers=1, hidden_size=32,
                                  intermediate_size=96)  # e.g. copied by hand, or from an older version
  with pytest.raises(grpo_math.RunError, match="has no grpo_jax_sft.json"):
    _run(work, "--sft_steps=5", "--steps=1")


@pytest.mark.parametrize("damage", ["truncate", "garble"])
def test_corrupt_init_checkpoint_is_one_line(tmp_path, damage, main_in_process):
  model = models.build_default_checkpoint(tmp_path / "model", num_hidden_layers=1, hidden_size=32,
                                          intermediate_size=96)
  weights = model / "model.safetensors"
  data = weights.read_bytes()
  weights.write_bytes(data[:len(data) // 3] if damage == "truncate" else b"\xff" * 64 + data[64:])
  error = _error_in_process(main_in_process, f"--work_dir={tmp_path / 'run'}", f"--init_checkpoint={model}",
                            "--steps=1")
  assert str(weights) in error and "unreadable safetensors file" in error, error


def test_bad_tiny_shape_writes_nothing(tmp_path, main_in_process):
  error = _error_in_process(main_in_process, f"--work_dir={tmp_path / 'run'}", "--tiny_hidden_size=36")
  assert "--tiny_hidden_size must be a positive multiple of 8" in error and not (tmp_path / "run").exists()


def test_checkpointer_reports_unreadable_metadata(tmp_path):
  ckpt = checkpointing.Checkpointer(tmp_path / "ckpt")
  ckpt.save(1, {"w": np.ones(3, np.float32)}, {"step": 1})
  next((tmp_path / "ckpt" / "1" / "metadata").rglob("metadata")).write_text("{garbled")
  with pytest.raises(checkpointing.CheckpointError, match="unreadable metadata"):
    ckpt.metadata(1)
  ckpt.close()


def test_check_start(tmp_path):
  """The checkpoint-directory guard both runners use: its two refusals, each one line naming the runner's flags."""
  full, empty = tmp_path / "full", tmp_path / "empty"
  full.mkdir()
  (full / "1").mkdir()
  empty.mkdir()
  assert resume_lib.holds_checkpoints(full) and not resume_lib.holds_checkpoints(empty)
  assert not resume_lib.holds_checkpoints(tmp_path / "absent")
  resume_lib.check_start([empty, tmp_path / "absent"], False)
  resume_lib.check_start([empty, full], True)
  resume_lib.check_start([empty], True, resumable=True)  # e.g. stage 1's exported policy
  resume_lib.check_start([full], False, overwrite=True, overwrite_flag="--rm_overwrite")
  with pytest.raises(config_lib.RunError) as error:
    resume_lib.check_start([empty, full], False)
  assert str(error.value) == (f"{full} already holds checkpoints; pass --resume to continue, or choose another "
                              "--work_dir")
  with pytest.raises(config_lib.RunError) as error:
    resume_lib.check_start([full], False, directory_flag="--rm_dir", overwrite_flag="--rm_overwrite")
  assert str(error.value) == (f"{full} already holds checkpoints; pass --resume to continue, --rm_overwrite to start "
                              "over, or choose another --rm_dir")
  with pytest.raises(config_lib.RunError) as error:
    resume_lib.check_start([empty, tmp_path / "absent"], True)
  assert str(error.value) == f"--resume: no checkpoint in {empty}"
