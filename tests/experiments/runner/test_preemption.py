"""SIGTERM and SIGINT stop a run after the step in flight, with that step saved (experiments/runner/preemption.py).

The runs are real child processes of `python -m experiments.grpo_math`, sent real signals once their stderr shows
a given step done; each is resumed with the command its last line prints, and its final weights are compared,
bit for bit, with an uninterrupted run's. The children run without JAX_PLATFORMS, as a user's would: they must
print nothing about TPUs (libtpu is installed by the test extra; `grpo_jax.absent_tpu`).
"""

import os
import pathlib
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import numpy as np

from experiments.runner import preemption
from grpo_jax import models
from tests.conftest import HANG_GUARD_S, run_grpo_math, with_cpu_devices

REPO = pathlib.Path(__file__).resolve().parents[3]
TINY = ["--max_prompt_len=16", "--max_new_tokens=16", "--num_train=200", "--num_test=8", "--batch_size=4",
        "--group_size=4", "--eval_batch_size=8", "--tensorboard=false", "--tiny_layers=1", "--tiny_hidden_size=32",
        "--eval_every=0", "--learning_rate=1e-3", "--overlong_buffer=12", "--save_every=100"]
STAGE2 = ["--sft_steps=0", "--steps=12"]
SFT = ["--sft_steps=150", "--sft_batch_size=8", "--steps=2"]


def _env():
  # As a user runs it: JAX picks its platform (conftest sets cpu for the suite); libtpu, if installed, does not give
  # up early, quietly, when another process holds its lock file (see test_absent_tpu).
  env = dict(os.environ, PYTHONPATH=str(REPO), ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  env.pop("JAX_PLATFORMS", None)
  return env


class Child:
  """A child process whose stderr is collected as it comes (progress lines end in \\r, not \\n)."""

  def __init__(self, cmd, env=None):
    self.proc = subprocess.Popen(cmd, cwd=REPO, env=env or _env(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE)
    self._chunks = []
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self):
    while chunk := os.read(self.proc.stderr.fileno(), 65536):
      self._chunks.append(chunk)

  @property
  def stderr(self) -> str:
    return b"".join(self._chunks).decode(errors="replace")

  def wait_for(self, pattern: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not re.search(pattern, self.stderr):
      assert self.proc.poll() is None, f"exited {self.proc.returncode} before {pattern!r}:\n{self.stderr[-3000:]}"
      assert time.monotonic() < deadline, self.stderr[-3000:]
      time.sleep(0.05)

  def finish(self) -> int:
    code = self.proc.wait(timeout=HANG_GUARD_S)
    self._reader.join(timeout=60)
    return code


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _straight(work_dir, *args):
  """The same run, uninterrupted, in this process."""
  return run_grpo_math(f"--work_dir={work_dir}", *TINY, *args)


def _no_tpu_lines(text: str) -> None:
  bad = [l for l in text.splitlines() if "TPU" in l or "accelerator" in l.lower() or "Source Location" in l]
  assert not bad, bad


def _interrupt_and_resume(tmp_path, args, wait_pattern, signum, stage):
  """Runs `args` in a child, sends `signum` once `wait_pattern` shows on its stderr, checks the stop, resumes with
  the printed command; returns (the step it stopped after, the resumed run's work dir)."""
  work = tmp_path / "interrupted"
  child = Child([sys.executable, "-m", "experiments.grpo_math", *TINY, *args, f"--work_dir={work}"])
  child.wait_for(wait_pattern)
  child.proc.send_signal(signum)
  code = child.finish()
  err = child.stderr
  assert code == 128 + signum, (code, err[-3000:])
  assert "Traceback" not in err, err[-3000:]
  _no_tpu_lines(err)
  name = signal.Signals(signum).name
  assert f"{name} received: the step in flight finishes and is saved" in err
  last = err.strip().splitlines()[-1]
  found = re.fullmatch(rf"grpo_math: interrupted by {name}: stopped after {stage} step (\d+), saved in (\S+); "
                       r"continue with: (.+)", last)
  assert found, last
  step, saved, command = int(found.group(1)), pathlib.Path(found.group(2)), shlex.split(found.group(3))
  assert (saved / str(step)).is_dir() and command[-1] == "--resume", last
  assert not list(work.rglob("*orbax-checkpoint-tmp*")) and not (work / "run.lock").exists()
  resumed = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  _no_tpu_lines(resumed.stderr)
  return step, saved, work, resumed.stderr


def _same_final_weights(expected_dir, actual_dir):
  expected, actual = (models.load_hf(d / "final_policy")[0] for d in (expected_dir, actual_dir))
  jax.tree.map(np.testing.assert_array_equal, expected, actual)


def test_sigterm_in_stage_2_saves_the_step_and_resumes_bit_identically(tmp_path):
  step, saved, work, resumed = _interrupt_and_resume(tmp_path, STAGE2, r"\] 2/12 ", signal.SIGTERM, "stage-2")
  assert 2 <= step < 12 and saved == work / "checkpoints"
  assert f"resumed from step {step}" in resumed
  _straight(tmp_path / "straight", *STAGE2)
  _same_final_weights(tmp_path / "straight", work)


def test_sigint_in_sft_saves_the_step_and_resumes_bit_identically(tmp_path):
  step, saved, work, resumed = _interrupt_and_resume(tmp_path, SFT, r"\] 25/150 ", signal.SIGINT, "SFT")
  assert 25 <= step < 150 and saved == work / "sft_checkpoints"
  assert f"stage 1 resumed from step {step}" in resumed
  assert not saved.exists()  # stage 1 done and exported: its checkpoints are gone
  _straight(tmp_path / "straight", *SFT)
  _same_final_weights(tmp_path / "straight", work)
  for policy in ("sft_policy", "final_policy"):
    expected, actual = (models.load_hf(d / policy)[0] for d in (tmp_path / "straight", work))
    jax.tree.map(np.testing.assert_array_equal, expected, actual)


def test_a_kill_without_a_signal_in_sft_loses_only_the_steps_since_its_last_checkpoint(tmp_path):
  """SIGKILL (no handler, nothing saved at the kill) during stage 1 with --sft_save_every=20: the newest checkpoint
  (a multiple of 20) is left, and --resume continues from it to the uninterrupted run's weights, bit for bit."""
  work = tmp_path / "killed"
  args = [*SFT, "--sft_save_every=20"]
  child = Child([sys.executable, "-m", "experiments.grpo_math", *TINY, *args, f"--work_dir={work}"])
  child.wait_for(r"\] 75/150 ")
  child.proc.send_signal(signal.SIGKILL)
  assert child.finish() == -signal.SIGKILL
  saved = sorted(int(p.name) for p in (work / "sft_checkpoints").iterdir() if p.name.isdigit())
  assert len(saved) == 1 and saved[0] % 20 == 0 and 60 <= saved[0] < 150, saved  # the newest only
  resumed = subprocess.run([sys.executable, "-m", "experiments.grpo_math", *TINY, *args, f"--work_dir={work}",
                            "--resume"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"stage 1 resumed from step {saved[0]}" in resumed.stderr
  assert not (work / "sft_checkpoints").exists()  # stage 1 done and exported: its checkpoints are gone
  _straight(tmp_path / "straight", *SFT)  # without checkpoints: saving them moves nothing
  for policy in ("sft_policy", "final_policy"):
    expected, actual = (models.load_hf(d / policy)[0] for d in (tmp_path / "straight", work))
    jax.tree.map(np.testing.assert_array_equal, expected, actual)


_NOTE_AND_WAIT = """
import sys, time
from experiments.runner import preemption
with preemption.StopSignals() as signals:
  print("ready", flush=True)
  while not signals.noted:
    time.sleep(0.01)
  print("noted", signals.noted, flush=True)
  time.sleep(600)  # "saving": only a second SIGINT ends it
"""


def test_a_second_sigint_stops_at_once():
  child = subprocess.Popen([sys.executable, "-c", _NOTE_AND_WAIT], cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
  assert child.stdout.readline() == "ready\n"
  child.send_signal(signal.SIGINT)
  assert child.stdout.readline() == f"noted {int(signal.SIGINT)}\n"  # the first one is only noted
  child.send_signal(signal.SIGINT)
  _, err = child.communicate(timeout=HANG_GUARD_S)
  assert child.returncode == -signal.SIGINT  # the signal's default action: no handler, no traceback
  assert err.strip() == "SIGINT received: the step in flight finishes and is saved, then the run stops (Ctrl-C " \
                        "again: stop now, without saving)"


def test_signals_are_noted_then_the_handlers_restored():
  before = signal.getsignal(signal.SIGTERM)
  lines = []
  with preemption.StopSignals(report=lines.append) as signals:
    assert not signals.stop_requested()
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM: noted once, the run still saves
    assert signals.stop_requested() and signals.signum == signal.SIGTERM and len(lines) == 1
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
  assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_that_arrives_during_the_gather_stops_the_next_step(monkeypatch):
  """With several processes the handler may run inside the all-gather (Python runs it when the collective's C call
  returns): that signal is not lost but agreed on at the next step. Here the other process never got one."""
  calls = []

  def allgather(local):  # what the real one does with this process's value and the other's 0, plus the signal
    calls.append(int(local))
    if len(calls) == 1:
      os.kill(os.getpid(), signal.SIGTERM)  # delivered while "in" the collective
    return np.array([int(local), 0], np.int32)

  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(preemption.multihost_utils, "process_allgather", allgather)
  with preemption.StopSignals(report=lambda line: None) as signals:
    assert not signals.stop_requested()  # this step's gather went out before the signal
    assert signals.stop_requested() and signals.signum == signal.SIGTERM
  assert calls == [0, int(signal.SIGTERM)]


def test_interrupted_names_the_step_and_the_exit_status():
  err = preemption.Interrupted(signal.SIGTERM, 7, "stage-2", pathlib.Path("/runs/a/checkpoints"))
  assert str(err) == "interrupted by SIGTERM: stopped after stage-2 step 7, saved in /runs/a/checkpoints"
  assert err.exit_status == 143 and preemption.Interrupted(signal.SIGINT, 0, "SFT").exit_status == 130
  assert str(preemption.Interrupted(signal.SIGINT, 0, "stage-2")) == \
      "interrupted by SIGINT: stopped before the first step of stage-2, nothing to save"


def test_two_processes_stop_after_the_same_step_when_one_is_signalled(tmp_path):
  """Two processes (4 CPU devices each, gloo): SIGTERM reaches process 1 only; both stop after the same step, save
  it together and exit 143; resumed, they end with the weights of an uninterrupted two-process run."""
  policy = models.build_default_checkpoint(tmp_path / "policy", seed=2, num_hidden_layers=1, hidden_size=32,
                                           intermediate_size=96)
  args = [*TINY, "--steps=10", f"--init_checkpoint={policy}", "--mesh=data:2,fsdp:2,tensor:2",
          "--sharding_rules=fsdp_tp", "--num_processes=2"]

  def start(work, *extra):
    port = _free_port()
    return [Child([sys.executable, "-m", "experiments.grpo_math", *args, *extra, f"--work_dir={work}",
                   f"--coordinator_address=127.0.0.1:{port}", f"--process_id={i}"], env=with_cpu_devices(4, _env()))
            for i in range(2)]

  def finish(children):
    codes = [c.finish() for c in children]
    return codes, [c.stderr for c in children]

  work = tmp_path / "interrupted"
  children = start(work)
  children[0].wait_for(r"\] 2/10 ")  # process 0 draws the progress bar
  children[1].proc.send_signal(signal.SIGTERM)
  codes, errs = finish(children)
  assert codes == [143, 143], [e.replace("\r", "\n")[-3000:] for e in errs]
  steps = [int(re.search(r"stopped after stage-2 step (\d+), saved in ", e).group(1)) for e in errs]
  assert steps[0] == steps[1] and 2 <= steps[0] < 10, steps
  assert sorted(int(p.name) for p in (work / "checkpoints").iterdir()) == [steps[0]]
  codes, errs = finish(start(work, "--resume"))
  assert codes == [0, 0], [e[-3000:] for e in errs]
  codes, errs = finish(start(tmp_path / "straight"))
  assert codes == [0, 0], [e[-3000:] for e in errs]
  _same_final_weights(tmp_path / "straight", work)
