"""Tests for grpo_jax.rewards.math_verify_reward: math-verify's verdicts, the hard per-call bound (a hostile answer
is killed and scores 0), a dead worker replaced, the one-line error without the package, and how often it agrees
with the project's own parser (`correctness`) on the MATH-style answers the other tests hold."""

import gc
import importlib.util
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from experiments.runner import config as config_lib
from experiments.runner import task as task_lib
from grpo_jax.data.example import Example
from grpo_jax.rewards import math_verify_reward as mvr
from grpo_jax.rewards.rule import get_reward_fn, make_reward_fn, score

HOSTILE = "The answer is $\\boxed{9^{9^{9^{9}}}}$."  # sympy would build a number of ~10^(3.7·10^8) digits


@pytest.fixture(scope="module")
def verifier():
  v = mvr.MathVerifier(time_limit=30.0)  # generous: these checks are about verdicts, not time
  yield v
  v.close()


@pytest.mark.parametrize("completion, answer, expected", [
    ("The answer is $\\boxed{0.5}$.", "\\frac{1}{2}", True),
    ("so $\\boxed{\\frac{1}{2}}$", "0.5", True),
    ("\\boxed{\\dfrac{2}{4}}", "\\frac{1}{2}", True),
    ("$\\boxed{(x+1)^2}$", "x^2+2x+1", True),  # symbolic, beyond string or number equality
    ("$\\boxed{2\\sqrt{2}}$", "\\sqrt{8}", True),
    ("$\\boxed{\\{2, 1\\}}$", "\\{1,2\\}", True),
    ("48/2 = 24\n#### 72", "72", True),  # GSM8K's final line
    ("\\boxed{1} first, then \\boxed{3}", "3", False),  # math-verify reads the first box (own parser: the last)
    ("$\\boxed{3}$", "4", False),
    ("$\\boxed{\\frac{1}{3}}$", "0.33", False),
    ("no answer at all", "5", False),
    ("", "5", False),
])
def test_known_equivalences(verifier, completion, answer, expected):
  assert verifier.check(completion, answer) is expected


def test_hostile_answer_is_killed_at_the_bound_and_scores_zero():
  v = mvr.MathVerifier(time_limit=1.0)
  try:
    assert v.check("$\\boxed{2}$", "2")  # the worker started and answers
    start = time.perf_counter()
    assert v.check(HOSTILE, "2") is False
    elapsed = time.perf_counter() - start
    assert (v.calls, v.timeouts, v.restarts) == (2, 1, 1)  # the bound killed the worker once
    assert elapsed < 60  # generous: without the bound this check runs on (stopped after 2 minutes, unfinished)
    assert v.check("$\\boxed{\\frac{6}{4}}$", "1.5")  # the new worker answers
    assert (v.calls, v.timeouts, v.restarts) == (3, 1, 1)
  finally:
    v.close()


class _FakeClock:
  """`time.monotonic` and `connection.wait` for the verifier: a wait that nothing answers at once returns at its
  timeout, which the clock jumps to (no real time passes), so a check's end is measured in the clock's seconds."""

  def __init__(self, real_wait):
    self.now, self.real_wait, self.waits = 1000.0, real_wait, []

  def monotonic(self):
    return self.now

  def wait(self, conns, timeout):
    arrived = self.real_wait(conns, 0.05)  # a verdict already on its way (a real worker's pipe)
    if not arrived:
      self.waits.append(timeout)
      self.now += timeout
    return arrived


@pytest.mark.parametrize("time_limit, workers", [(1.0, 1), (0.25, 2)])
def test_a_hostile_check_is_killed_at_the_bound_not_later(monkeypatch, time_limit, workers):
  """The bound, measured without a wall clock: each hostile check ends exactly `time_limit` clock seconds after it
  was handed to its worker (issue 55: the wall-clock test above accepts a bound 60 times too slack); a slack of a
  few times, or a kill before the bound, fails."""
  v = mvr.MathVerifier(time_limit=time_limit, workers=workers)
  try:
    assert v.check_many([("$\\boxed{2}$", "2")] * workers) == [True] * workers  # workers started, real clock
    while not all(w.ready for w in v._pool):  # pylint: disable=protected-access
      # every worker started, so that the hostile checks go out together: one of them may have answered both
      # above while the other was still importing, and under the clock a start is never awaited in real time
      v.check_many([("$\\boxed{2}$", "2")])
    clock = _FakeClock(mvr.connection.wait)
    monkeypatch.setattr(mvr, "time", clock)
    monkeypatch.setattr(mvr.connection, "wait", clock.wait)
    start = clock.now
    assert v.check_many([(HOSTILE, "2")] * workers) == [False] * workers
    assert clock.now - start == pytest.approx(time_limit) and len(clock.waits) == 1
    assert (v.timeouts, v.restarts) == (workers, workers)
  finally:
    monkeypatch.undo()
    v.close()


def test_a_batch_is_spread_over_the_workers_and_hostile_checks_are_killed():
  v = mvr.MathVerifier(time_limit=1.0, workers=2)
  try:
    pairs = [("$\\boxed{0.5}$", "\\frac{1}{2}"), (HOSTILE, "2"), ("#### 72", "72"), ("$\\boxed{3}$", "4"),
             (HOSTILE, "3"), ("$\\boxed{(x+1)^2}$", "x^2+2x+1")]
    start = time.perf_counter()
    assert v.check_many(pairs) == [True, False, True, False, False, True]
    assert time.perf_counter() - start < 120  # generous: the two hostile checks alone would never end
    assert (v.calls, v.timeouts, v.restarts, len(v._pool)) == (6, 2, 2, 2)  # pylint: disable=protected-access
    assert v.check_many([(c, a) for c, a in pairs if c != HOSTILE]) == [True, True, False, True]
    assert v.check_many([]) == [] and v.timeouts == 2
  finally:
    v.close()


def test_a_dead_worker_is_replaced(verifier):
  assert verifier.check("$\\boxed{7}$", "7")
  restarts = verifier.restarts
  verifier._pool[0].process.kill()  # pylint: disable=protected-access
  verifier._pool[0].process.wait()  # pylint: disable=protected-access
  assert verifier.check("$\\boxed{7}$", "7") is False  # its check scores 0
  assert verifier.restarts == restarts + 1 and verifier.check("$\\boxed{7}$", "7")


def test_ctrl_c_and_sigterm_leave_the_worker_alone(verifier):
  assert verifier.check("$\\boxed{7}$", "7")
  pid, restarts = verifier._pool[0].process.pid, verifier.restarts  # pylint: disable=protected-access
  assert os.getsid(pid) != os.getsid(0)  # a session of its own: a terminal's Ctrl-C reaches only the runner
  for sig in (signal.SIGINT, signal.SIGTERM):  # the runner's to handle (preemption saves the step in flight)
    os.kill(pid, sig)
  assert verifier.check("$\\boxed{8}$", "8") and verifier.restarts == restarts
  assert verifier._pool[0].process.pid == pid  # pylint: disable=protected-access


_ORPHAN = """
import sys
from grpo_jax.rewards import math_verify_reward as mvr
v = mvr.MathVerifier(time_limit=3600)
assert v.check("$\\\\boxed{1}$", "1")
print(v._pool[0].process.pid, flush=True)
v.check(sys.argv[1], "2")  # never returns: the test kills this process meanwhile
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_runner_takes_its_busy_worker_along():
  parent = subprocess.Popen([sys.executable, "-c", _ORPHAN, HOSTILE], stdout=subprocess.PIPE, text=True)
  try:
    worker = int(parent.stdout.readline())
    time.sleep(0.5)  # the worker is busy with the hostile check
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 60
    while _alive(worker) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert not _alive(worker)
  finally:
    parent.kill()


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
      return f.read().split(") ")[-1][0] != "Z"  # a zombie has ended (its new parent reaps it)
  except FileNotFoundError:
    return False


def test_registered_reward_and_spec(verifier):
  example = Example(question="1/2 + 1/4?", answer="\\frac{3}{4}")
  assert get_reward_fn("math_verify", verifier)("so it is $\\boxed{0.75}$", example) == 1.0
  reward = make_reward_fn("math_verify:1.0,boxed_format:0.1,correctness:0.5", verifier)
  completions = ["$\\boxed{0.75}$", "$\\boxed{3/5}$", "0.75", "$\\boxed{\\frac{6}{8}}$"]
  calls = verifier.calls
  got = score(completions, [example] * 4, reward)  # the batched path: all checks handed to the pool at once
  assert verifier.calls == calls + 4  # on the verifier passed in
  assert got.tolist() == pytest.approx([1.6, 0.1, 1.0, 1.6])  # math-verify also reads an unboxed final number
  assert got.tolist() == [np.float32(reward(c, example)) for c in completions]  # the same as one by one


def test_a_reward_without_a_verifier_has_its_own():
  example = Example(question="q", answer="2")
  first, second = get_reward_fn("math_verify"), make_reward_fn("math_verify:1,correctness:1")
  assert first("$\\boxed{2}$", example) == 1.0 and second("$\\boxed{2}$", example) == 2.0
  verifier = first.verifier  # pylint: disable=no-member
  assert (verifier.time_limit, verifier.workers) == (mvr.TIME_LIMIT, mvr.default_workers())
  assert verifier.calls == 1  # the spec's check ran on a verifier of its own
  verifier.close()


def test_a_dropped_verifier_stops_its_workers():
  v = mvr.MathVerifier(time_limit=30.0)
  assert v.check("$\\boxed{2}$", "2")
  process = v._pool[0].process  # pylint: disable=protected-access
  del v
  gc.collect()
  assert process.poll() is not None  # killed by the verifier's finalizer, not left running until the runner exits


def _task(time_limit: float, workers: int) -> task_lib.Task:
  return task_lib.Task(config_lib.TaskConfig(reward="math_verify:1.0", num_train=10, num_test=5,
                                             math_verify_time_limit=time_limit, math_verify_workers=workers),
                       tokenizer=None, sft_lineage=False, seed=0)


def test_a_task_owns_a_verifier_with_its_flags():
  assert config_lib.default("math_verify_time_limit") == mvr.TIME_LIMIT
  task = _task(0.5, 3)
  assert (task.verifier.time_limit, task.verifier.workers) == (0.5, 3)
  example = task.test[0]
  assert task.reward_fn("so $\\boxed{%s}$" % example.answer, example) == 1.0
  assert task.verifier.calls == 1 and len(task.verifier._pool) == 1  # pylint: disable=protected-access
  (worker,) = task.verifier._pool  # pylint: disable=protected-access
  task.close()
  assert worker.process.poll() is not None and not task.verifier._pool  # pylint: disable=protected-access
  assert _task_without_math_verify().verifier is None  # no verifier, no check of the optional package
  for bad, message in [({"math_verify_time_limit": 0.0}, r"--math_verify_time_limit must be in \(0, 86400\] seconds"),
                       ({"math_verify_workers": -1}, "--math_verify_workers must be >= 0")]:
    with pytest.raises(config_lib.ConfigError, match=message):
      config_lib.Config().replace(**bad)
  with pytest.raises(ValueError, match="time_limit must be > 0"):
    mvr.MathVerifier(time_limit=0.0)


def _task_without_math_verify() -> task_lib.Task:
  return task_lib.Task(config_lib.TaskConfig(reward="correctness:1.0,format:0.1", num_train=10, num_test=5),
                       tokenizer=None, sft_lineage=False, seed=0)


def test_two_tasks_do_not_share_or_reconfigure_a_verifier():
  """Issue 54: a process-wide verifier, reconfigured by each Task built, gave an earlier task the later one's
  settings and stopped its running workers; each task's reward now checks with its own."""
  first = _task(0.5, 3)
  example = first.test[0]
  right = "so $\\boxed{%s}$" % example.answer
  assert first.reward_fn(right, example) == 1.0
  (worker,) = first.verifier._pool  # pylint: disable=protected-access
  second = _task(1.0, 2)  # other settings
  try:
    assert second.verifier is not first.verifier
    assert (first.verifier.time_limit, first.verifier.workers) == (0.5, 3)
    assert (second.verifier.time_limit, second.verifier.workers) == (1.0, 2)
    assert worker.process.poll() is None  # building the second task left the first one's worker running
    assert second.reward_fn(right, example) == 1.0 and second.verifier.calls == 1
    second.close()
    assert first.reward_fn(right, example) == 1.0 and first.verifier.calls == 2  # the first's checks, its worker
    assert first.verifier._pool == [worker] and first.verifier.restarts == 0  # pylint: disable=protected-access
  finally:
    first.close()
    second.close()


def test_missing_package_is_one_line(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else real(name, *a))
  for make in (lambda: get_reward_fn("math_verify"), lambda: make_reward_fn("correctness:1,math_verify:1"),
               mvr.MathVerifier):
    with pytest.raises(ValueError) as info:
      make()
    assert str(info.value) == ("the math_verify reward needs math-verify, which is not installed: "
                               "pip install 'grpo_jax[math]' (math-verify with its LaTeX parser)")


# The MATH-style answers of tests/grpo_jax/data/test_answer.py (equal and unequal pairs; the 100,000-digit pair is
# left out: it is a cost test, math-verify spends seconds on it) and its extraction cases with a box, test_rule.py's
# completions of the answer 52, and the MATH records of test_datasets.py and test_arrow_files.py. Columns: completion,
# reference, own parser's verdict, math-verify's.
def _boxed(pred):
  return "no answer" if pred is None else f"The final answer is $\\boxed{{{pred}}}$."


AGREEMENT = [
    *[(_boxed(pred), ref, True, True) for pred, ref in [
        ("0.5", "1/2"), ("\\frac{1}{2}", "0.5"), ("1,000", "1000"), ("1000.0", "1,000"), ("$18", "18"),
        ("50%", "50"), ("-0.75", "\\dfrac{-3}{4}"), ("\u22127", "-7"), ("x^2+1", "x^{2} + 1"), ("\\boxed{3}", "3"),
        ("9" * 200, "9" * 200), ("1e999999999", "1e999999999")]],
    *[(_boxed(pred), ref, False, False) for pred, ref in [
        ("0.5", "0.25"), ("52", "53"), ("-3", "3"), ("2x", "2"), (None, "5"), ("", "5"), ("", ""),
        ("1e999999999", "1e999999998"), ("1,2", "12"), ("garbage", "5"), ("\u00bd", "1/2")]],
    (_boxed("x^2+1"), "X^2+1", False, True),  # math-verify reads symbols case-insensitively
    *[(c, "52", True, True) for c in [
        "12+7=19\n19*3=57\n57-5=52\n#### 52", "12+7=19\n19*3=57\n57-5=52\n#### 52\n", "wrong steps\n#### 52",
        "#### 52.0", "\\boxed{52}"]],
    *[(c, "52", False, False) for c in ["#### 53", "", "#### ", "#### 52\n#### 53"]],
    ("52", "52", False, True),  # a bare number: no final-answer marker (own) vs the number itself
    *[(c, ref, True, True) for c, ref in [  # test_answer.py's extraction cases: the box extracted as the reference
        ("The answer is \\boxed{42}.", "42"), ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{3}}{\\left(2\\right)}} end", "\\frac{\\sqrt{3}}{\\left(2\\right)}"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"), ("\\boxed{a\\}b}", "a\\}b"),
        ("\\boxed{3} and an unclosed \\boxed{4", "3")]],
    ("\\boxed{1} then \\boxed{2}", "2", True, False),  # the last box (own) vs the first (math-verify)
    ("We get $\\boxed{1}$ wrong first; then $\\boxed{\\frac{3}{4}}$.", "\\frac{3}{4}", True, True),
    ("It is $\\boxed{\\frac{3}{4}}$.", "\\frac{3}{4}", True, True),
    ("So $x=\\boxed{2}$.", "2", True, True),
]


def test_agreement_with_own_parser(verifier):
  correctness = get_reward_fn("correctness")
  table = {}
  for completion, ref, own_expected, mv_expected in AGREEMENT:
    example = Example(question="q", answer=ref)
    own, mv = correctness(completion, example) == 1.0, verifier.check(completion, ref)
    assert (own, mv) == (own_expected, mv_expected), (completion, ref)
    table[own, mv] = table.get((own, mv), 0) + 1
  print(f"own parser vs math-verify on {len(AGREEMENT)} MATH-style pairs: both right {table.get((True, True), 0)}, "
        f"both wrong {table.get((False, False), 0)}, only math-verify {table.get((False, True), 0)}, "
        f"only own {table.get((True, False), 0)}")
  assert table == {(True, True): 26, (False, False): 15, (False, True): 2, (True, False): 1}
