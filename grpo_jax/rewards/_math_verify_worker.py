"""The worker process of `math_verify_reward`: answers (completion, answer) requests with math-verify's verdict.

Run as `python _math_verify_worker.py READ_FD WRITE_FD MEMORY_LIMIT_BYTES PARENT_PID` (by path, so that only this
file and math-verify are imported), in a session of its own. It sends ("ready", None) once math-verify is imported
(or ("error", message)), then one bool per request. math-verify's own signal-based timeouts are off: the parent
kills this process when a request outlives its bound. SIGINT and SIGTERM are the parent's to handle (a Ctrl-C or a
preemption notice must not cost a check in flight); the worker ends when the parent closes its pipe, and on Linux
it is killed when the parent dies (even in the middle of a check).
"""

import ctypes
import functools
import logging
import os
import resource
import signal
import sys
from multiprocessing.connection import Connection


def _limit_memory(limit: int) -> None:
  if limit > 0:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _tie_to_parent(parent_pid: int) -> None:
  """Ignores SIGINT/SIGTERM; with a parent pid (0: started from a thread that may end first), asks Linux for SIGKILL
  when the parent dies (PR_SET_PDEATHSIG), and exits if it already has."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  if parent_pid and sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
  if parent_pid and os.getppid() != parent_pid:
    sys.exit(0)


_WARM_UP = (("$\\boxed{\\frac{1}{2}}$", "0.5"), ("#### 3", "3"), ("$\\boxed{(x+1)^2}$", "x^2+2x+1"),
            ("$\\boxed{\\{1, 2\\}}$", "\\{2, 1\\}"))


@functools.lru_cache(maxsize=1024)
def _gold(mv, answer: str):
  return mv.parse("\\boxed{" + answer + "}", parsing_timeout=None)


def verify(mv, completion: str, answer: str) -> bool:
  """math-verify's verdict: the reference answer (as `\\boxed{answer}`) against the completion's parsed answer."""
  gold = _gold(mv, answer)
  pred = mv.parse(completion, parsing_timeout=None)
  return bool(gold) and bool(pred) and bool(mv.verify(gold, pred, timeout_seconds=None))


def serve(requests: Connection, replies: Connection) -> None:
  logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled": the parent keeps the time
  try:
    import math_verify as mv  # pylint: disable=import-outside-toplevel
  except Exception as err:  # pylint: disable=broad-except
    replies.send(("error", f"{type(err).__name__}: {err}"))
    return
  for completion, answer in _WARM_UP:  # lazy initialisation (the LaTeX grammar, sympy's caches) before the clock runs
    verify(mv, completion, answer)
  replies.send(("ready", None))
  while True:
    try:
      completion, answer = requests.recv()
    except EOFError:  # the parent closed its end
      return
    try:
      ok = verify(mv, completion, answer)
    except (Exception, RecursionError, MemoryError):  # pylint: disable=broad-except
      ok = False  # what math-verify cannot parse or compare scores 0
    replies.send(ok)


if __name__ == "__main__":
  _tie_to_parent(int(sys.argv[4]))
  _limit_memory(int(sys.argv[3]))
  serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
