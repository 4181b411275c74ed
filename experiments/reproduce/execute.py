"""Running a study's jobs: one process each, `parallel` at once, each after the runs it needs; a finished run (its
summary.json exists) is skipped, an interrupted one resumes from its checkpoint, SIGTERM stops them all."""

import concurrent.futures
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import threading
import time

from experiments.reproduce import plan as plan_lib
from experiments.reproduce import tune
from experiments.studies import spec

# runners whose --resume continues from a checkpoint
RESUMABLE = (spec.GRPO_MATH, spec.FLOW_GRPO, spec.TRAIN_REWARD_MODEL)
# Checkpoint directories a run leaves under its work dir: stage 2's (and the reward model's), stage 1's
CHECKPOINT_DIRS = ("checkpoints", "sft_checkpoints")
# Flags reproduce adds to a runner's command, outside the run's hash: they change no result (a run saved and resumed
# equals an uninterrupted one bit for bit). Stage 1 checkpoints every SFT_SAVE_EVERY steps, so that an SFT start
# killed without a signal (a lost machine, the end of a session) resumes instead of starting again.
SFT_SAVE_EVERY = 250
OPERATIONAL = {spec.GRPO_MATH: {"sft_save_every": SFT_SAVE_EVERY}, spec.FLOW_GRPO: {"sft_save_every": SFT_SAVE_EVERY}}


class Stopped(Exception):
  """SIGTERM or SIGINT reached reproduce: the runs in flight were asked to stop (each saves its step and exits)."""

  def __init__(self, signum: int, runs: list[str]):
    self.signum, self.runs = signum, runs
    super().__init__(f"stopped by {signal.Signals(signum).name}" + (
        f"; {', '.join(runs)} saved where they were and continue when the same command runs again" if runs else ""))


def _stop(signum, frame):
  del frame
  raise Stopped(signum, [])


@dataclasses.dataclass
class Outcome:
  """What became of a job in this invocation."""

  status: str  # "done" (ran now), "cached" (summary existed), "failed", "blocked" (a needed run failed)
  message: str = ""
  wall_time_s: float | None = None


def last_line(path: pathlib.Path) -> str:
  """The last non-empty line of a log (progress lines end in \\r, not \\n)."""
  try:
    text = path.read_text(errors="replace")
  except OSError:
    return "(no log)"
  lines = [ln.strip() for ln in re.split(r"[\r\n]+", text) if ln.strip()]
  return lines[-1] if lines else "(empty log)"


def loadavg() -> list[float] | None:
  """The load average over 1, 5 and 15 minutes; None where the system has none."""
  try:
    return [round(x, 2) for x in os.getloadavg()]
  except OSError:
    return None


def _prepare(job: plan_lib.Job) -> list[str]:
  """The argv to run, with the runner's `OPERATIONAL` flags the run does not set itself: with --resume where the
  runner left a checkpoint (`CHECKPOINT_DIRS`), else in a fresh directory."""
  argv = list(job.argv)
  if not job.run.command:
    argv += [f"--{k}={v}" for k, v in OPERATIONAL.get(job.run.module, {}).items()
             if not any(a.startswith(f"--{k}=") for a in argv)]
  if job.directory.exists():
    left = [job.directory / d for d in CHECKPOINT_DIRS]
    if job.run.module in RESUMABLE and not job.run.command and any(d.is_dir() and any(d.iterdir()) for d in left):
      return argv + ["--resume"]
    shutil.rmtree(job.directory)
  return argv


def _run_one(job: plan_lib.Job, processes: dict, lock: threading.Lock) -> Outcome:
  """Runs a job's process from the repository, its output in the job's log; writes its record (argv, commit, wall
  time, load average) beside its directory."""
  argv = _prepare(job)
  job.directory.parent.mkdir(parents=True, exist_ok=True)
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plan_lib.ROOT), env.get("PYTHONPATH")]))
  record = {"argv": argv, "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "loadavg_start": loadavg(), "commit": job.commit or None}
  t0 = time.time()
  with open(job.log, "w") as log:
    log.write("$ " + " ".join(argv) + "\n")
    log.flush()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=plan_lib.ROOT, env=env)
    with lock:
      processes[job.key] = proc
    code = proc.wait()
    with lock:
      processes.pop(job.key, None)
  wall = time.time() - t0
  record.update(returncode=code, wall_time_s=round(wall, 1), loadavg_end=loadavg())
  job.record.write_text(json.dumps(record, indent=2))
  if code == 0 and job.summary.is_file():
    return Outcome("done", wall_time_s=wall)
  why = last_line(job.log) if code != 0 else "exited 0 without writing summary.json"
  return Outcome("failed", f"exit {code}: {why}", wall)


def execute(jobs: list[plan_lib.Job], parallel: int, echo=print, on_finish=None) -> dict[tuple[str, int], Outcome]:
  """Runs the jobs whose summary.json is missing, `parallel` at once, each after the runs it needs; calls
  `on_finish(job, outcome)` as each process ends."""
  outcomes, pending = _triage(jobs)
  by_key = {j.key: j for j in jobs}
  total, started = sum(not j.alias for j in pending), 0
  processes: dict = {}
  lock = threading.Lock()
  running: dict[concurrent.futures.Future, plan_lib.Job] = {}
  with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool, _sigterm_stops():
    try:
      while pending or running:
        progressed = False
        for job in list(pending):
          if len(running) >= max(1, parallel):
            break
          failed = _failed_needs(job, outcomes)
          if failed:
            outcomes[job.key] = Outcome("blocked", f"needs {', '.join(failed)}, which did not finish")
            pending.remove(job)
            progressed = True
            echo(f"[{job.run.name} seed {job.seed}] not started: {outcomes[job.key].message}")
            continue
          if all(outcomes.get(k) is not None for k in job.waits_for):
            pending.remove(job)
            progressed = True
            outcome = _settle(job, by_key)
            if outcome is not None:
              outcomes[job.key] = outcome
              continue
            started += 1
            echo(f"[{started}/{total}] {job.run.name} seed {job.seed}: started ({job.directory})"
                 + (f", --{job.tuned['tune'].flag}={job.tuned['value']} chosen" if job.tuned else ""))
            running[pool.submit(_run_one, job, processes, lock)] = job
        if not running:
          if not progressed:  # nothing runs and nothing can start: the rest wait for runs that will not come
            for job in pending:
              outcomes[job.key] = Outcome("blocked", "waits for runs that did not finish")
            pending = []
          continue
        done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in done:
          job = running.pop(future)
          outcomes[job.key] = _finished(job, future, echo)
          if on_finish is not None:
            on_finish(job, outcomes[job.key])
    except (KeyboardInterrupt, Stopped) as err:
      signum = err.signum if isinstance(err, Stopped) else signal.SIGINT
      raise Stopped(signum, _terminate(processes, lock)) from None
  return outcomes


@contextlib.contextmanager
def _sigterm_stops():
  """SIGTERM (a preempted machine, `kill`) raises `Stopped` while in the block, as Ctrl-C raises KeyboardInterrupt:
  `execute` then stops the runs in flight, which save the step they are on and exit, and the pool waits for them.
  A process started in the background ignores SIGINT, so SIGTERM is the signal that reaches it. Only the main
  thread can set a handler; elsewhere this does nothing."""
  main_thread = threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGTERM, _stop) if main_thread else None
  try:
    yield
  finally:
    if main_thread:
      signal.signal(signal.SIGTERM, previous)


def _failed_needs(job: plan_lib.Job, outcomes: dict[tuple[str, int], Outcome]) -> list[str]:
  """The runs `job` needs that failed or were blocked ("name", or "name seed s" for another seed's)."""
  return [f"{name}" + (f" seed {seed}" if seed != job.seed else "") for name, seed in job.waits_for
          if outcomes.get((name, seed)) is not None and outcomes[(name, seed)].status in ("failed", "blocked")]


def _terminate(processes: dict, lock: threading.Lock) -> list[str]:
  """Sends SIGTERM to the runs in flight (each saves its step and exits); their names."""
  stopped = []
  with lock:
    for key, proc in processes.items():
      proc.terminate()
      stopped.append(f"{key[0]} seed {key[1]}")
  return stopped


def _triage(jobs: list[plan_lib.Job]) -> tuple[dict[tuple[str, int], Outcome], list[plan_lib.Job]]:
  """The outcomes known before anything runs (finished already; needs a run that is not planned) and the jobs
  still to run."""
  outcomes: dict[tuple[str, int], Outcome] = {}
  pending = []
  keys = {j.key for j in jobs}
  for job in jobs:
    missing = [k for k in job.waits_for if k not in keys]
    if missing:
      outcomes[job.key] = Outcome("blocked", f"needs {', '.join(f'{n} seed {s}' for n, s in missing)}, not planned")
      continue
    if job.summary.is_file() and not job.alias:
      outcomes[job.key] = Outcome("cached", wall_time_s=recorded_time(job))
    else:
      pending.append(job)
  return outcomes, pending


def _settle(job: plan_lib.Job, by_key: dict[tuple[str, int], plan_lib.Job]) -> Outcome | None:
  """A job whose needs have finished: its outcome when it need not run (a tuned run's grid that did not finish, a
  tuning seed's alias, a summary written meanwhile), else None, its argv now final."""
  if job.tuned and not tune.resolve_tuned(job):
    return Outcome("blocked", "its grid's runs did not all write their validation accuracy")
  if job.alias:  # a tuning seed: the grid's run at the chosen value is this run's
    return Outcome("cached")
  for need in job.waits_for:  # a tuned run on a tuning seed is the grid's run at the chosen value
    alias = by_key[need]
    if alias.alias and alias.tuned.get("planned"):
      job.argv = [a.replace(str(alias.tuned["planned"]), str(alias.directory)) for a in job.argv]
  if job.summary.is_file():  # finished meanwhile (another invocation, or by hand)
    return Outcome("cached", wall_time_s=recorded_time(job))
  return None


def _finished(job: plan_lib.Job, future: concurrent.futures.Future, echo) -> Outcome:
  """A job's outcome once its process has ended, said in one line."""
  try:
    outcome = future.result()
  except OSError as err:
    outcome = Outcome("failed", f"could not start: {err}")
  took = f" in {outcome.wall_time_s / 60:.1f} min" if outcome.wall_time_s is not None else ""
  echo(f"{job.run.name} seed {job.seed}: {outcome.status}{took}"
       + (f": {outcome.message} (log {job.log})" if outcome.message else ""))
  return outcome


def recorded_time(job: plan_lib.Job) -> float | None:
  """A run's wall time as recorded when it ran (its record, else its summary); None where neither says."""
  try:
    return float(json.loads(job.record.read_text())["wall_time_s"])
  except (OSError, ValueError, KeyError, TypeError):
    try:
      return float(json.loads(job.summary.read_text()).get("wall_time_s"))
    except (OSError, ValueError, TypeError):
      return None


def recorded_commit(job: plan_lib.Job) -> str | None:
  """The commit reproduce ran a job from (its record), for a runner whose summary does not say its code."""
  try:
    return json.loads(job.record.read_text()).get("commit") or None
  except (OSError, ValueError, AttributeError):
    return None
