"""One run per work dir: `<work_dir>/run.lock`, held with `flock(2)` while a run uses the directory.

Two runs in one work dir would write checkpoints and `metrics.jsonl` over each other. The lock is the kernel's, on
an open file: a run that dies in any way (kill -9 included) releases it, so a lock left by a dead process is taken
over without a question; a live one is named by the process id (and host) written in the file. With several
processes, process 0 takes the lock for all of them and tells the others the outcome.
"""

import errno
import fcntl
import os
import pathlib
import socket

import jax
import numpy as np
from jax.experimental import multihost_utils

from experiments.runner import config as config_lib

LOCK_NAME = "run.lock"


class WorkDirBusy(config_lib.RunError):
  """The work dir is locked by another run (one line, exit status 1)."""


def holder(path: pathlib.Path) -> str:
  """Who holds the lock at `path`, as its file says ("process 1234 on host"), or "another process"."""
  try:
    text = path.read_text().strip()
  except OSError:
    text = ""
  return text or "another process"


def _busy_message(directory: pathlib.Path, who: str, flag: str) -> str:
  return f"{directory} is in use by a running run ({who}); wait for it to end, stop it, or choose another {flag}"


def check_free(work_dir, flag: str = "--work_dir") -> None:
  """Raises `WorkDirBusy` when a live run holds `<work_dir>/run.lock`; creates and changes nothing (a check before
  the run's other checks, so a busy directory is named as such; `WorkDirLock` then takes the lock). Process 0
  looks; the others pass."""
  path = pathlib.Path(work_dir) / LOCK_NAME
  if jax.process_index() != 0:
    return
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return  # no lock file (or none we may read): `WorkDirLock` decides
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
  except OSError as err:
    if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
      raise WorkDirBusy(_busy_message(path.parent, holder(path), flag)) from None
  finally:
    os.close(fd)


class WorkDirLock:
  """`with WorkDirLock(work_dir):` holds `<work_dir>/run.lock` (creating the directory) or raises `WorkDirBusy`,
  whose line names `flag`, the runner's flag of that directory.

  Held by process 0 of a multi-process run; every process must enter it (they learn process 0's outcome).
  """

  def __init__(self, work_dir, flag: str = "--work_dir"):
    self.path = pathlib.Path(work_dir) / LOCK_NAME
    self.flag = flag
    self._fd = None

  def __enter__(self) -> "WorkDirLock":
    busy = ""
    if jax.process_index() == 0:
      busy = self._acquire()
    if jax.process_count() > 1:  # process 0's outcome, to every process
      flag = multihost_utils.broadcast_one_to_all(np.asarray(1 if busy else 0, np.int32))
      if int(flag) and not busy:
        busy = "process 0 of this run"
    if busy:
      raise WorkDirBusy(_busy_message(self.path.parent, busy, self.flag))
    return self

  def _acquire(self) -> str:
    """Takes the lock; returns "" on success, else who holds it."""
    self.path.parent.mkdir(parents=True, exist_ok=True)
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as err:
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
          return holder(self.path)
        raise OSError(f"{self.path}: cannot lock the work dir ({os.strerror(err.errno)})") from None
      try:  # the holder before us may have removed the file between our open and our lock: lock the new one
        same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
      except FileNotFoundError:
        same = False
      if same:
        break
      os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode())
    self._fd = fd
    return ""

  def __exit__(self, *exc_info) -> None:
    if self._fd is not None:
      try:
        self.path.unlink(missing_ok=True)  # before the unlock: a waiting run then locks a new file
      except OSError:
        pass  # a vanished or read-only work dir: the lock goes with the descriptor
      os.close(self._fd)
      self._fd = None
