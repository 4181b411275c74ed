"""Preemption: SIGTERM and SIGINT stop a run after the step in flight, with a checkpoint of that step.

A preemptible TPU or GPU slice is taken back with SIGTERM, then SIGKILL a grace period later; Ctrl-C is SIGINT.
While `StopSignals` is active, either signal is only noted (a line on stderr says so at once). The training loops
ask `stop_requested()` at the end of every step: on a yes they save the step's checkpoint and raise `Interrupted`,
which the command line turns into one line (the step, the `--resume` command) and exit status 128 + the signal's
number (143 for SIGTERM, 130 for SIGINT), the shell's code for "ended by that signal": a scheduler reads it as
"preempted, requeue". A second SIGINT stops at once, without saving (the signal's default action): the last
checkpoint stays whole, since a checkpoint appears by a rename only once it is complete.

With several processes, the signal may reach one process, or all at different moments. `stop_requested` then
gathers every process's signal (a collective all of them call once per step, like orbax's multi-host preemption
sync point) so that every process stops after the same step and saves it together.

  with preemption.StopSignals() as signals:
    for step in ...:
      ...
      if signals.stop_requested():
        save(step)
        raise preemption.Interrupted(signals.signum, step, "stage 2", checkpoint_dir)
"""

import os
import signal
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_status(signum: int) -> int:
  """The exit status of a run interrupted by `signum`: 128 + its number, as a shell reports a process it ended."""
  return 128 + signum


class Interrupted(Exception):
  """A run stopped by a signal after `step` of `stage`, that step saved in `saved` (None: nothing to save)."""

  def __init__(self, signum: int, step: int, stage: str, saved=None):
    self.signum, self.step, self.stage, self.saved = signum, step, stage, saved
    name = signal.Signals(signum).name
    where = f"after {stage} step {step}" if step else f"before the first step of {stage}"
    what = f", saved in {saved}" if saved is not None else ", nothing to save"
    super().__init__(f"interrupted by {name}: stopped {where}{what}")

  @property
  def exit_status(self) -> int:
    return exit_status(self.signum)


class StopSignals:
  """While active (a context manager), SIGTERM and SIGINT are noted instead of ending the process.

  The first SIGINT puts SIGINT back to its default action, so a second one ends the process at once. Outside the
  main thread (where Python cannot set handlers) it notes nothing and the signals act as before.

  Args:
    signals: the signals to note.
    report: writes the line announcing a noted signal (default: straight to stderr's file descriptor, which is
      safe in a signal handler, unlike `print`).
  """

  def __init__(self, signals=SIGNALS, report=None):
    self.signals = tuple(signals)
    self.noted = 0  # the first signal this process got (set by the handler, at any bytecode); 0: none
    self.signum = 0  # the signal to stop on, as `stop_requested` agreed it; 0: none
    self._report = report or (lambda line: os.write(2, line.encode()))
    self._previous = {}

  def __enter__(self) -> "StopSignals":
    if threading.current_thread() is threading.main_thread():
      for signum in self.signals:
        self._previous[signum] = signal.signal(signum, self._note)
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous.clear()

  def _note(self, signum, frame) -> None:  # pylint: disable=unused-argument
    first = not self.noted
    self.noted = self.noted or signum
    if signum == signal.SIGINT:
      signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C: stop now, without saving
    if first:
      then = " (Ctrl-C again: stop now, without saving)" if signum == signal.SIGINT else ""
      self._report(f"\n{signal.Signals(signum).name} received: the step in flight finishes and is saved, then the "
                   f"run stops{then}\n")

  def stop_requested(self) -> bool:
    """Whether to stop after the current step: this process's signal, or, with several processes, any process's
    (every process must call it at the same point of each step; all of them get the same answer and the same
    `signum`)."""
    agreed = self.noted
    if jax.process_count() > 1:  # (a signal noted during the gather is not lost: it is in `noted` for the next)
      agreed = int(np.max(multihost_utils.process_allgather(np.asarray(agreed, np.int32))))
    self.signum = self.signum or agreed
    return bool(self.signum)
