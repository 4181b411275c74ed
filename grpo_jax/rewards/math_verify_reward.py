"""The `math_verify` reward: MATH-style answers checked by Hugging Face's math-verify, each call under a hard bound.

math-verify (the checker of TRL's and Open-R1's accuracy rewards) extracts the completion's final answer (a
`\\boxed{}`, a LaTeX or plain expression, `#### x`) and compares it with the reference symbolically through sympy:
`\\frac{1}{2}` = 0.5, `\\sqrt{4}` = 2, `x^2+2x+1` = `(x+1)^2`, {1, 2} = {2, 1}. Symbolic work on a hostile answer
(`\\boxed{9^{9^{9^{9}}}}`) runs for minutes and more, and math-verify's own timeout is a SIGALRM (main thread only,
5 s).
So checks run in a pool of worker processes (`_math_verify_worker.py`, address space capped; a batch is spread
over them): each check gets at most `time_limit` seconds from the moment a worker takes it, then that worker is
killed, the check scores 0 and a new worker starts. Model output is handed to math-verify as a string; this module
never evaluates it (math-verify passes plain arithmetic it finds, digits and + - * / ^ ( ) only, to sympy's
eval-based `parse_expr`: no names reach it, and the worker's caps bound its cost).

reward = 1.0 iff math_verify.verify(parse("\\boxed{<reference answer>}"), parse(completion)), else 0.0

`make_reward_fn(verifier)` is the reward over a `MathVerifier` the caller owns: each verifier has its own workers
and settings, there is no process-wide one.
"""

import importlib.util
import os
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing import connection
from multiprocessing.connection import Connection
from typing import Callable, Sequence

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


def default_workers() -> int:
  """Worker processes of a `MathVerifier` by default: half the host's cores, 1 to 8."""
  return min(8, max(1, (os.cpu_count() or 2) // 2))


class _Worker:
  """One worker process, the two pipes to it, and whether it has imported math-verify yet."""

  def __init__(self, memory_limit: int, start_timeout: float):
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
    self.start_deadline = time.monotonic() + start_timeout

  def started(self, message) -> None:
    """Takes the worker's first message: ("ready", None), or ("error", why) raised as a RuntimeError."""
    kind, why = message
    if kind != "ready":
      raise RuntimeError(f"the math_verify worker failed to start ({why}): {INSTALL_HINT}")
    self.ready = True

  def kill(self) -> None:
    self.process.kill()
    self.process.wait()
    self.requests.close()
    self.replies.close()


class MathVerifier:
  """math-verify's verdicts from a pool of worker processes, each check under a hard time bound.

  Args:
    time_limit: seconds a check may take, from handing it to a worker (already started) to its verdict; past it
      the worker is killed (and replaced) and the check is False.
    workers: worker processes checking in parallel (0: `default_workers()`); started as a batch needs them.
    start_timeout: seconds a new worker may take to import math-verify.
    memory_limit: a worker's address space in bytes (0: unlimited); a check that exceeds it is False.

  Its workers stop at `close`, or when it is garbage-collected or the process exits.

  Attributes:
    calls: checks asked for.
    timeouts: checks that ran out of time (each killed a worker).
    restarts: workers started to replace others (timeouts, and workers that died).
  """

  def __init__(self, time_limit: float = TIME_LIMIT, workers: int = 0, start_timeout: float = START_TIMEOUT,
               memory_limit: int = MEMORY_LIMIT):
    if not time_limit > 0:
      raise ValueError(f"time_limit must be > 0, got {time_limit}")
    if workers < 0:
      raise ValueError(f"workers must be >= 0, got {workers}")
    check_installed()
    self.time_limit, self.start_timeout, self.memory_limit = time_limit, start_timeout, memory_limit
    self.workers = workers or default_workers()
    self.calls = self.timeouts = self.restarts = 0
    self._pool: list[_Worker] = []
    weakref.finalize(self, _kill_all, self._pool)  # a verifier dropped unclosed, or alive at exit, stops its workers

  def _replace(self, worker: _Worker) -> None:
    worker.kill()
    self._pool[self._pool.index(worker)] = _Worker(self.memory_limit, self.start_timeout)
    self.restarts += 1

  def check(self, completion: str, answer: str) -> bool:
    """Whether math-verify finds `completion`'s final answer equal to the reference `answer` (LaTeX or plain
    text, as `Example.answer`), within `time_limit` seconds; False past it."""
    return self.check_many([(completion, answer)])[0]

  def check_many(self, pairs: Sequence[tuple[str, str]]) -> list[bool]:
    """`check` of each (completion, answer) pair, spread over the workers; the verdicts in order.

    Raises:
      RuntimeError: when a worker cannot start (math-verify fails to import, or `start_timeout` passes).
    """
    pairs = [(str(completion), str(answer)) for completion, answer in pairs]
    self.calls += len(pairs)
    verdicts = [False] * len(pairs)
    while len(self._pool) < min(self.workers, len(pairs)):
      self._pool.append(_Worker(self.memory_limit, self.start_timeout))
    todo = list(reversed(range(len(pairs))))
    busy: dict[_Worker, tuple[int, float]] = {}  # worker -> (pair index, deadline)
    while todo or busy:
      for worker in list(self._pool):  # hand the next pairs to the idle workers
        if todo and worker.ready and worker not in busy:
          index = todo.pop()
          try:
            worker.requests.send(pairs[index])
            busy[worker] = (index, time.monotonic() + self.time_limit)
          except OSError:  # it died since its last verdict: the pair scores 0
            self._replace(worker)
      waiting = {w.replies: w for w in self._pool if w in busy or not w.ready}
      deadlines = [d for _, d in busy.values()] + [w.start_deadline for w in self._pool if not w.ready]
      arrived = connection.wait(list(waiting), max(0.0, min(deadlines) - time.monotonic()))
      for conn in arrived:
        worker = waiting[conn]
        try:
          message = conn.recv()
        except (EOFError, OSError):  # it died: its memory cap, or killed from outside
          if worker not in busy:
            raise RuntimeError(f"the math_verify worker exited with status {worker.process.wait()} while "
                               f"starting: {INSTALL_HINT}") from None
          del busy[worker]
          self._replace(worker)
          continue
        if worker in busy:
          verdicts[busy.pop(worker)[0]] = bool(message)
        else:
          worker.started(message)
      now = time.monotonic()
      for worker, (_, deadline) in list(busy.items()):
        if now >= deadline:  # out of time: killed, the pair scores 0
          del busy[worker]
          self.timeouts += 1
          self._replace(worker)
      for worker in self._pool:
        if not worker.ready and now >= worker.start_deadline:
          raise RuntimeError(f"the math_verify worker did not start within {self.start_timeout:.0f} s")
    return verdicts

  def close(self) -> None:
    """Stops the workers (a later check starts new ones)."""
    _kill_all(self._pool)


def _kill_all(pool: list[_Worker]) -> None:
  """Kills a verifier's workers and empties its pool (the list itself: `MathVerifier`'s finalizer holds it)."""
  for worker in pool:
    worker.kill()
  pool.clear()


def make_reward_fn(verifier: MathVerifier) -> Callable[[str, Example], float]:
  """The `math_verify` reward over `verifier`: `fn(completion, example)` is 1.0 iff `verifier.check(completion,
  example.answer)`, else 0.0; `fn.batch(completions, examples)` scores a batch, checked in parallel by the
  verifier's workers. The caller owns `verifier` (and closes it)."""

  def reward_fn(completion: str, example: Example) -> float:
    return float(verifier.check(completion, example.answer))

  def batch(completions: Sequence[str], examples: Sequence[Example]) -> list[float]:
    return [float(v) for v in verifier.check_many([(c, e.answer) for c, e in zip(completions, examples)])]

  reward_fn.batch = batch
  reward_fn.verifier = verifier
  return reward_fn
