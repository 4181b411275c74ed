"""One run per work dir (experiments/runner/work_dir_lock.py): a second run is refused with one line naming the
first one's process; a lock whose holder died is taken over."""

import os
import pathlib
import signal
import subprocess
import sys

import pytest

from experiments import cli
from experiments import train_reward_model
from experiments.runner import work_dir_lock
from tests.conftest import HANG_GUARD_S

REPO = pathlib.Path(__file__).resolve().parents[3]

_HOLD = """
import sys, time
from experiments.runner import work_dir_lock
with work_dir_lock.WorkDirLock(sys.argv[1]):
  print("locked", flush=True)
  time.sleep(600)
"""


def _holder(work_dir):
  child = subprocess.Popen([sys.executable, "-c", _HOLD, str(work_dir)], cwd=REPO, stdout=subprocess.PIPE,
                           text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
  assert child.stdout.readline() == "locked\n"
  return child


def test_a_live_holder_is_named_and_a_dead_ones_lock_is_taken_over(tmp_path):
  child = _holder(tmp_path / "run")
  try:
    with pytest.raises(work_dir_lock.WorkDirBusy, match=rf"in use by a running run \(process {child.pid} on "):
      with work_dir_lock.WorkDirLock(tmp_path / "run"):
        pass
  finally:
    child.send_signal(signal.SIGKILL)  # dies holding it: no release code runs
    child.wait(timeout=HANG_GUARD_S)
  assert (tmp_path / "run" / "run.lock").read_text() == f"process {child.pid} on {os.uname().nodename}\n"
  with work_dir_lock.WorkDirLock(tmp_path / "run"):  # the dead process's lock: taken over
    assert (tmp_path / "run" / "run.lock").read_text().startswith(f"process {os.getpid()} on ")
  assert not (tmp_path / "run" / "run.lock").exists()  # released: removed


def test_the_lock_is_released_when_the_body_raises(tmp_path):
  with pytest.raises(KeyError):
    with work_dir_lock.WorkDirLock(tmp_path):
      raise KeyError("x")
  with work_dir_lock.WorkDirLock(tmp_path):
    pass


def test_a_second_run_in_a_busy_work_dir_is_one_line_and_writes_nothing(tmp_path, main_in_process):
  work = tmp_path / "run"
  child = _holder(work)
  try:
    error = main_in_process(cli.main_for("grpo_math"), ["grpo_math", f"--work_dir={work}", "--steps=1"])
  finally:
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=HANG_GUARD_S)
  assert error == (f"grpo_math: error: {work} is in use by a running run (process {child.pid} on "
                   f"{os.uname().nodename}); wait for it to end, stop it, or choose another --work_dir")
  assert sorted(p.name for p in work.iterdir()) == ["run.lock"]  # the holder's file only


def test_resume_in_a_busy_work_dir_names_the_live_run_before_its_missing_checkpoint(tmp_path, main_in_process):
  """A live run that has not saved yet: `--resume` there is refused as busy (naming the run), not as "no
  checkpoint"; nothing is written."""
  work = tmp_path / "run"
  child = _holder(work)
  try:
    error = main_in_process(cli.main_for("grpo_math"), ["grpo_math", f"--work_dir={work}", "--steps=1", "--resume"])
  finally:
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=HANG_GUARD_S)
  assert error.startswith(f"grpo_math: error: {work} is in use by a running run (process {child.pid} on "), error
  assert sorted(p.name for p in work.iterdir()) == ["run.lock"]


def test_check_free_creates_nothing(tmp_path):
  work_dir_lock.check_free(tmp_path / "none")  # no directory: free, and still none
  assert not (tmp_path / "none").exists()
  with work_dir_lock.WorkDirLock(tmp_path / "run", flag="--rm_dir"):
    with pytest.raises(work_dir_lock.WorkDirBusy, match=r"choose another --rm_dir$"):
      work_dir_lock.check_free(tmp_path / "run", flag="--rm_dir")
  work_dir_lock.check_free(tmp_path / "run")  # released


def test_a_busy_rm_dir_names_the_rm_dir_flag(tmp_path, main_in_process):
  """REVIEW B2: train_reward_model locks --rm_dir, and its busy line names --rm_dir, not --work_dir."""
  work = tmp_path / "rm"
  child = _holder(work)
  try:
    error = main_in_process(train_reward_model.main, ["train_reward_model", f"--rm_dir={work}",
                                                      f"--policy={tmp_path / 'policy'}"])
  finally:
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=HANG_GUARD_S)
  assert error == (f"train_reward_model: error: {work} is in use by a running run (process {child.pid} on "
                   f"{os.uname().nodename}); wait for it to end, stop it, or choose another --rm_dir")
