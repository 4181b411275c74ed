"""The `math_verify` reward: MATH-style answers checked by Hugging Face's math-verify, each call under a hard bound.

math-verify (the checker of TRL's and Open-R1's accuracy rewards) extracts the completion's final answer (a
`\\boxed{}`, a LaTeX or plain expression, `#### x`) and compares it with the reference symbolically through sympy:
`\\frac{1}{2}` = 0.5, `\\sqrt{4}` = 2, `x^2+2x+1` = `(x+1)^2`, {1, 2} = {2, 1}. Symbolic work on a hostile answer
(`\\boxed{9^{9^{9^{9}}}}`) runs without end, and math-verify's own timeout is a SIGALRM (main thread only, 5 s).
So each check runs in a worker process (`_math_verify_worker.py`, address space capped): the caller waits at most
`time_limit` seconds for the verdict, then kills the worker, scores 0 and starts a new one. Model output is handed
to math-verify as a string; this module never evaluates it.

reward = 1.0 iff math_verify.verify(parse("\\boxed{<reference answer>}"), parse(completion)), else 0.0
"""

import atexit
import importlib.util
import os
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

from grpo_jax.data.example import Example

TIME_LIMIT = 2.0  # seconds one check may take (parse + verify); the worker is killed past it
START_TIMEOUT = 300.0  # seconds a new worker may take to import math-verify (sympy) before it is an error
MEMORY_LIMIT = 4 << 30  # the worker's address space, in bytes (0: no cap)
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_math_verify_worker.py")
INSTALL_HINT = "pip install 'grpo_jax[math]' (math-verify with its LaTeX parser)"


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):  # a parent package missing, or the module blocked in sys.modules
    return False


def check_installed() -> None:
  """Raises ValueError in one line when math-verify or its ANTLR LaTeX parser is not installed."""
  missing = [name for name, module in (("math-verify", "math_verify"), ("antlr4-python3-runtime", "antlr4"))
             if not _installed(module)]
  if missing:
    raise ValueError(f"the math_verify reward needs {' and '.join(missing)}, which "
                     f"{'is' if len(missing) == 1 else 'are'} not installed: {INSTALL_HINT}")


class _Worker:
  """One worker process and the two pipes to it."""

  def __init__(self, memory_limit: int):
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    self.process = subprocess.Popen(
        [sys.executable, _WORKER, str(to_child_r), str(from_child_w), str(memory_limit),
         # PR_SET_PDEATHSIG follows the thread that starts the worker: only the main thread lives as long as we do
         str(os.getpid() if threading.current_thread() is threading.main_thread() else 0)],
        pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, close_fds=True,
        start_new_session=True)  # a terminal's Ctrl-C goes to the runner, which decides
    os.close(to_child_r)
    os.close(from_child_w)
    self.requests = Connection(to_child_w, readable=False)
    self.replies = Connection(from_child_r, writable=False)
    self.ready = False

  def wait_ready(self, timeout: float) -> None:
    if self.ready:
      return
    try:
      if not self.replies.poll(timeout):
        raise RuntimeError(f"the math_verify worker did not start within {timeout:.0f} s")
      kind, message = self.replies.recv()
    except (EOFError, OSError):
      kind, message = "error", f"it exited with status {self.process.wait()}"
    if kind != "ready":
      raise RuntimeError(f"the math_verify worker failed to start ({message}): {INSTALL_HINT}")
    self.ready = True

  def kill(self) -> None:
    self.process.kill()
    self.process.wait()
    self.requests.close()
    self.replies.close()


class MathVerifier:
  """math-verify's verdicts under a hard per-call time bound.

  Args:
    time_limit: seconds a check may take, from handing it to the worker (already started) to its verdict;
      past it the worker is killed and the check is False.
    start_timeout: seconds a new worker may take to import math-verify.
    memory_limit: the worker's address space in bytes (0: unlimited); a check that exceeds it is False.

  Attributes:
    calls: checks asked for.
    timeouts: checks that ran out of time (each killed a worker).
    restarts: workers started after the first (timeouts and workers that died).
  """

  def __init__(self, time_limit: float = TIME_LIMIT, start_timeout: float = START_TIMEOUT,
               memory_limit: int = MEMORY_LIMIT):
    if not time_limit > 0:
      raise ValueError(f"time_limit must be > 0, got {time_limit}")
    check_installed()
    self.time_limit, self.start_timeout, self.memory_limit = time_limit, start_timeout, memory_limit
    self.calls = self.timeouts = self.restarts = 0
    self._worker = None

  def _start(self) -> None:
    self._worker = _Worker(self.memory_limit)

  def _replace_worker(self) -> None:
    self._worker.kill()
    self.restarts += 1
    self._start()  # imports in the background while the caller goes on

  def check(self, completion: str, answer: str) -> bool:
    """Whether math-verify finds `completion`'s final answer equal to the reference `answer` (LaTeX or plain
    text, as `Example.answer`), within `time_limit` seconds; False past it."""
    self.calls += 1
    if self._worker is None:
      self._start()
    self._worker.wait_ready(self.start_timeout)
    try:
      self._worker.requests.send((str(completion), str(answer)))
      if self._worker.replies.poll(self.time_limit):
        return bool(self._worker.replies.recv())
      self.timeouts += 1
    except (EOFError, OSError):
      pass  # the worker died (its memory cap): a new one
    self._replace_worker()
    return False

  def close(self) -> None:
    """Stops the worker."""
    if self._worker is not None:
      self._worker.kill()
      self._worker = None


_VERIFIER: MathVerifier | None = None


def default_verifier() -> MathVerifier:
  """The process's shared `MathVerifier` (started on first use, stopped at exit)."""
  global _VERIFIER
  if _VERIFIER is None:
    _VERIFIER = MathVerifier()
    atexit.register(_VERIFIER.close)
  return _VERIFIER


def math_verify_reward(completion: str, example: Example) -> float:
  """1.0 iff math-verify finds the completion's answer equal to `example.answer` within `TIME_LIMIT`, else 0.0."""
  return float(default_verifier().check(completion, example.answer))
