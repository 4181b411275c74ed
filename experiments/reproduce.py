r"""Reproduces a paper's ablation with one command: runs over seeds, mean ± standard error, tables, plots.

  python -m experiments.reproduce --study=paradigm                  # DeepSeekMath Fig 5 / Table 10
  python -m experiments.reproduce --study=majk_passk --profile=quick --parallel=2
  python -m experiments.reproduce --study=path/to/my_study.json --seeds=5
  python -m experiments.reproduce --list                            # the studies and their runs

A study (`experiments/studies/`) is data: a list of runs (flag sets of the runners `experiments.grpo_math`,
`experiments.flow_grpo`, `experiments.train_reward_model`), the metrics to read from what they write, and
the plots to draw. Each run and seed is its own process, `python -m <runner> <flags> --seed=S
--work_dir=DIR`, in a directory named by a hash of its runner, its flags and those of the runner's defaults that
differ from `studies/runner_defaults.json` (under --runs_dir), so a run that two studies share (the SFT policy,
plain GRPO) runs once, a change of a default starts new runs instead of reusing old ones (a new flag that keeps
the old behaviour does not), and a run whose `summary.json` exists is skipped:
a study stopped halfway continues where it was, and `--seeds=5` after `--seeds=3` runs only seeds 3 and 4.
A run interrupted after a checkpoint continues with the runner's `--resume`. A failed run is reported with
its log's last line and does not stop the others (only the runs that need its output).

Output in --out_dir (default runs/reproduce/NAME): `results.json` (one entry per cell: study, run, metric,
step, the seeds, their values, mean and standard error), `results.md` (the tables, the plots, the commands,
each run's wall time), the PNG plots, `runs/<run>/seed<S>` links to the run directories and `logs/`.
Profiles: `full` runs the runners' own settings, `quick` the study's shortened ones (fewer steps, a smaller
held-out set; `results.md` lists the flags it adds).
"""

import concurrent.futures
import dataclasses
import datetime
import hashlib
import json
import math
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from absl import app
from absl import flags

from experiments import studies as studies_lib
from experiments.runner.git_commit import head_commit
from experiments.runner import config as config_lib
from experiments.studies import spec
from experiments.studies import verdicts

flags.DEFINE_string("study", None, "A study name (--list shows them) or a JSON file of a study spec.")
flags.DEFINE_integer("seeds", 3, "Seeds 0..N-1 of every run (model init, data order and sampling change with "
                     "it); default: the study's own (3, headline 5).")
flags.DEFINE_string("profile", "quick", "quick: the study's shortened settings; full: the runners' own settings.")
flags.DEFINE_string("out_dir", "", "Results, plots, logs and run links; default runs/reproduce/<study>.")
flags.DEFINE_string("runs_dir", "runs/reproduce/runs", "Where run directories live (shared by all studies: a "
                    "run with the same runner and flags is reused).")
flags.DEFINE_integer("parallel", 1, "Runs at once (each process uses every core it finds).")
flags.DEFINE_list("only", [], "Run only these runs (and what they need); aggregate all that exist.")
flags.DEFINE_bool("dry_run", False, "Print the commands and which would run or be skipped, run nothing.")
flags.DEFINE_bool("aggregate_only", False, "Run nothing; aggregate, tabulate and plot what exists.")
flags.DEFINE_bool("list", False, "List the studies, their runs and profiles, and exit.")
flags.DEFINE_bool("claims_table", False, "Print the table of every study's claims against its committed pages "
                  "(docs/reproduce/<study>/results.json, quick, and <study>/full/results.json) and exit.")
flags.DEFINE_bool("redecide", False, "Decide the committed pages' claims again from their cells (after a change of "
                  "the claims or the verdict rules) and rewrite each page's results.json and the Verdicts section of "
                  "its results.md; run nothing, and exit.")
flags.DEFINE_bool("write_defaults_snapshot", False, "Record the runners' defaults under a new revision in "
                  "experiments/studies/runner_defaults.json (every run directory moves once), and exit.")

FLAGS = flags.FLAGS

ROOT = pathlib.Path(__file__).resolve().parent.parent  # the repository: runners run from here
# runners whose --resume continues from a checkpoint
RESUMABLE = (spec.GRPO_MATH, spec.FLOW_GRPO, spec.TRAIN_REWARD_MODEL)
_REF = re.compile(r"\{run:([\w.-]+)\}")


class StudyError(Exception):
  """A problem with a study spec or the command line, reported as one line."""


def read_json(path: pathlib.Path, what: str = "a JSON object", need: tuple[str, ...] = ()) -> dict:
  """The JSON object in `path` (with the keys `need`), or StudyError naming the file (cut short, not an object)."""
  try:
    value = json.loads(path.read_text())
  except (OSError, ValueError) as err:
    raise StudyError(f"{path}: cannot read {what} ({err})") from None
  if not isinstance(value, dict) or any(k not in value for k in need):
    raise StudyError(f"{path}: not {what}" + (f" (needs {', '.join(need)})" if need else ""))
  return value


class Stopped(Exception):
  """SIGTERM or SIGINT reached reproduce: the runs in flight were asked to stop (each saves its step and exits)."""

  def __init__(self, signum: int, runs: list[str]):
    self.signum, self.runs = signum, runs
    super().__init__(f"stopped by {signal.Signals(signum).name}" + (
        f"; {', '.join(runs)} saved where they were and continue when the same command runs again" if runs else ""))


def _stop(signum, frame):
  del frame
  raise Stopped(signum, [])


# PLAN: runs x seeds -> jobs


@dataclasses.dataclass
class Job:
  run: spec.Run
  seed: int
  directory: pathlib.Path
  argv: list[str]
  needs: list[str]  # names of the runs of the same seed it reads from
  commit: str = ""  # a design profile's: the commit every run of the study comes from
  after: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # runs of other seeds it waits for
  tuned: dict | None = None  # a tuned run: {"tune": spec.Tune, "grid": value -> the tuning seeds' grid jobs}
  alias: bool = False  # a tuned run on a tuning seed: no process, the grid run at the chosen value
  grid: bool = False  # one value of a tuned run's grid on a tuning seed

  @property
  def key(self) -> tuple[str, int]:
    return (self.run.name, self.seed)

  @property
  def waits_for(self) -> list[tuple[str, int]]:
    return [(n, self.seed) for n in self.needs] + self.after

  @property
  def summary(self) -> pathlib.Path:
    return self.directory / "summary.json"

  @property
  def log(self) -> pathlib.Path:
    return self.directory.parent / f"{self.directory.name}.log"

  @property
  def record(self) -> pathlib.Path:
    return self.directory.parent / f"{self.directory.name}.run.json"


def load_study(name: str) -> spec.Study:
  """A registered study by name, or a JSON spec file."""
  if name in studies_lib.STUDIES:
    return studies_lib.STUDIES[name]
  path = pathlib.Path(name)
  if path.suffix == ".json" or path.is_file():
    try:
      return spec.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError) as err:
      raise StudyError(f"{path}: not a study spec ({type(err).__name__}: {err})") from None
  raise StudyError(f"no study {name!r}; known: {', '.join(studies_lib.STUDIES)} (or a .json spec file)")


def spec_files(study: spec.Study) -> list[str]:
  """The files, relative to the repository, whose commits declare a study's design: its module (when it is a
  registered study) and the verdict rule."""
  files = ["experiments/studies/verdicts.py"]
  for module in list(sys.modules.values()):
    if getattr(module, "STUDY", None) is study and getattr(module, "__file__", None):
      try:
        files.insert(0, str(pathlib.Path(module.__file__).resolve().relative_to(ROOT)))
      except ValueError:  # a study module outside the repository: no commit of ours declares it
        pass
  return files


def declaration(study: spec.Study, commit: str, root: pathlib.Path = ROOT) -> dict:
  """When a design was declared: the last commit at or before `commit` that changed its `spec_files`, and its
  date (None where git cannot say)."""
  try:
    log = subprocess.run(["git", "log", "-1", "--format=%H %cI", commit.removesuffix("-dirty"), "--",
                          *spec_files(study)], cwd=root, capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError):
    log = None
  parts = log.stdout.split() if log is not None and not log.returncode else []
  return {"commit": parts[0] if parts else None, "date": parts[1] if len(parts) > 1 else None,
          "files": spec_files(study)}


def design_commit(study: spec.Study, profile: str, dry_run: bool = False) -> str:
  """The commit a design profile runs from: HEAD, which must be clean (a dry run only warns)."""
  commit = head_commit()
  if (commit.endswith("-dirty") or commit == "unknown") and not dry_run:
    raise StudyError(f"study {study.name}, profile {profile}: a design runs every arm from one commit, and {ROOT} "
                     f"is {'not a git checkout' if commit == 'unknown' else 'changed since its last commit'}; "
                     "commit, or run from a worktree pinned to a commit (git worktree add DIR COMMIT)")
  return commit


def check_one_commit(jobs: list[Job], commit: str) -> None:
  """A design's table takes every finished run from `commit`: each run's record (what reproduce ran it from) and
  its summary's `code_version` (what the runner ran) must both say so. Raises StudyError with one line."""
  seen: dict[str, list[str]] = {}
  for job in jobs:
    if not job.summary.is_file():
      continue
    found = set()
    for path, key in ((job.record, "commit"), (job.summary, "code_version")):
      try:
        value = json.loads(path.read_text()).get(key)
      except (OSError, ValueError, AttributeError):
        value = None
      if value:
        found.add(value)
    for value in found or {"not recorded"}:
      seen.setdefault(value, []).append(f"{job.run.name} seed {job.seed}")
  others = {c: runs for c, runs in seen.items() if c != commit}
  if others:
    said = "; ".join(f"{c[:12] + c[40:]}: {len(r)} run{'s' if len(r) > 1 else ''} ({', '.join(r[:3])}"
                     f"{', ...' if len(r) > 3 else ''})" for c, r in sorted(others.items()))
    raise StudyError(f"a design's table takes every run from one commit, {commit[:12]}, and these are not from it: "
                     f"{said}; remove them, or aggregate from a worktree pinned to their commit")


def _flag_args(values: dict[str, Any]) -> list[str]:
  args = []
  for name, value in values.items():
    if value is True:
      args.append(f"--{name}")
    elif value is False:
      args.append(f"--no{name}")
    elif isinstance(value, (list, tuple)):
      args.append(f"--{name}={','.join(str(v) for v in value)}")
    else:
      args.append(f"--{name}={value}")
  return args


def _needs(values: dict[str, Any]) -> list[str]:
  return sorted({m for v in values.values() if isinstance(v, str) for m in _REF.findall(v)})


def _prefix(run: spec.Run) -> list[str]:
  return list(run.command) if run.command else [sys.executable, "-m", run.module]


# The runners' defaults as they were when run directories last moved on purpose: a run's hash covers only the
# defaults that differ from these (and the revision), so a flag added with a default that keeps the old behaviour
# leaves finished runs where they are, while a changed default still moves them. Numerics that change without a
# flag (a kernel, an initialiser) bump the snapshot's "revision" by rewriting the file:
#   python -m experiments.reproduce --write_defaults_snapshot
DEFAULTS_SNAPSHOT = pathlib.Path(__file__).resolve().parent / "studies" / "runner_defaults.json"


def runner_defaults(run: spec.Run) -> dict[str, str]:
  """The settings a runner module uses for the flags a run leaves out: the runner `Config`'s defaults (with
  Flow-GRPO's own for experiments.flow_grpo); {} for a custom command."""
  if run.command:
    return {}
  where = ("work_dir", "compilation_cache_dir", "cpu_devices")  # where and how it runs, not what it computes
  values = {k: v for k, v in config_lib.Config().flat().items() if k not in where}
  if run.module == spec.FLOW_GRPO:
    values.update({k: v for k, v in config_lib.PRESETS["flow_grpo"].items() if k != "algo"})
  return {k: str(v) for k, v in sorted(values.items())}


def _snapshot_key(run: spec.Run) -> str:
  return spec.FLOW_GRPO if run.module == spec.FLOW_GRPO else spec.GRPO_MATH  # the others read grpo_math's Config


def read_defaults_snapshot(path: pathlib.Path | None = None) -> dict[str, Any]:
  path = path or DEFAULTS_SNAPSHOT
  try:
    snapshot = json.loads(path.read_text())
    if not isinstance(snapshot.get("revision"), int) or not all(
        isinstance(snapshot.get(k), dict) for k in (spec.GRPO_MATH, spec.FLOW_GRPO)):
      raise ValueError("needs an integer 'revision' and the defaults of each runner")
  except (OSError, ValueError, AttributeError) as err:
    raise StudyError(f"{path}: not a defaults snapshot ({err}); rewrite it with "
                     "python -m experiments.reproduce --write_defaults_snapshot") from None
  return snapshot


def write_defaults_snapshot(path: pathlib.Path | None = None) -> int:
  """Records today's runner defaults under the next revision: every run's hash changes once."""
  path = path or DEFAULTS_SNAPSHOT
  try:
    revision = read_defaults_snapshot(path)["revision"] + 1
  except StudyError:
    revision = 1
  snapshot = {"revision": revision}
  for module in (spec.GRPO_MATH, spec.FLOW_GRPO):
    snapshot[module] = runner_defaults(spec.Run("x", {}, module=module))
  path.write_text(json.dumps(snapshot, indent=1, sort_keys=True) + "\n")
  return revision


def hashed_defaults(run: spec.Run, snapshot: dict[str, Any]) -> dict[str, Any]:
  """What of a runner's defaults enters its runs' hash: the snapshot's revision and the defaults that differ from
  the snapshot's (a flag the snapshot does not know keeps the old behaviour at its default, by convention)."""
  if run.command:
    return {}
  recorded = snapshot[_snapshot_key(run)]
  changed = {k: v for k, v in runner_defaults(run).items() if k in recorded and recorded[k] != v}
  return {"revision": snapshot["revision"], "changed": changed}


def plan(study: spec.Study, profile: str, seeds: list[int], runs_dir: pathlib.Path, commit: str = "") -> list[Job]:
  """The study's jobs, dependencies first, each in `runs_dir/<runner>-<hash>/seed<S>`.

  The hash covers the runner, the flags (before {run:..} and {seed} are filled in), the runner's defaults where
  they differ from the snapshot's (`hashed_defaults`) and, recursively, the runs they name, so equal
  configurations share a directory across studies, profiles never collide, runs made under other defaults are not
  taken for this code's, and a new flag that keeps the old behaviour does not orphan finished runs. With `commit`
  (a design profile's) it covers the commit too: no run of other code is reused.
  """
  if profile != "full" and profile not in study.profiles:
    raise StudyError(f"study {study.name} has no profile {profile!r}; it has full"
                     + "".join(f", {p}" for p in study.profiles))
  runs = study.runs_in(profile)
  merged = {r.name: study.flags_for(r, profile) for r in runs}
  by_name = {r.name: r for r in runs}
  grids: dict[str, list[tuple[Any, str]]] = {}  # tuned run -> (value, grid run name)
  for run in [r for r in runs if r.tune]:
    tune = run.tune
    if merged[run.name].get("num_validation", 0) in (0, None) and not run.command:
      raise StudyError(f"study {study.name}, run {run.name}: a tuned --{tune.flag} is chosen on a validation "
                       "split: the run needs --num_validation")
    grids[run.name] = []
    for value in tune.values:
      name = tune.grid_name(run.name, value)
      by_name[name] = dataclasses.replace(run, name=name, label=f"{run.display}, --{tune.flag}={value}", tune=None)
      merged[name] = {**merged[run.name], tune.flag: value}
      grids[run.name].append((value, name))
    merged[run.name] = {**merged[run.name], tune.flag: "{tuned}"}
  for run in by_name.values():
    for flag in ("seed", run.output_flag):
      if flag in merged[run.name]:
        raise StudyError(f"study {study.name}, run {run.name}: --{flag} is set by reproduce, leave it out")
    unknown = set(_needs(merged[run.name])) - set(merged)
    if unknown:
      raise StudyError(f"study {study.name}, run {run.name}: names runs that are not in profile {profile}: "
                       f"{sorted(unknown)}")

  hashes: dict[str, str] = {}
  snapshot = read_defaults_snapshot()

  def digest(name: str, visiting: tuple[str, ...] = ()) -> str:
    if name in visiting:
      raise StudyError(f"study {study.name}: runs need each other in a cycle: {' -> '.join(visiting + (name,))}")
    if name not in hashes:
      run = by_name[name]
      blob = {"command": list(run.command) or [run.module], "out_flag": run.output_flag,
              "flags": {k: str(v) for k, v in sorted(merged[name].items())},
              "defaults": hashed_defaults(run, snapshot),
              "needs": {n: digest(n, visiting + (name,)) for n in _needs(merged[name])}}
      if commit:
        blob["commit"] = commit
      if name in grids:  # the value comes from the grid: the grid's runs and the rule that chooses
        blob["tune"] = {"grid": {str(v): digest(g, visiting + (name,)) for v, g in grids[name]},
                        "seeds": run.tune.seeds, "by": run.tune.by}
      hashes[name] = hashlib.sha1(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:10]
    return hashes[name]

  order: list[str] = []

  def visit(name: str):
    if name not in order:
      for need in _needs(merged[name]):
        visit(need)
      order.append(name)

  for name in by_name:
    digest(name)
    visit(name)

  jobs = []
  tuning_seeds = {s for r in runs if r.tune for s in range(r.tune.seeds)}
  grid_of = {g: r for r, pairs in grids.items() for _, g in pairs}
  for seed in sorted(set(seeds) | tuning_seeds):
    dirs: dict[str, pathlib.Path] = {}
    for name in order:
      run = by_name[name]
      slug = (run.module.rsplit(".", 1)[-1] if not run.command else name)
      directory = (runs_dir / f"{slug}-{hashes[name]}" / f"seed{seed}").resolve()
      dirs[name] = directory
      tuner = by_name[grid_of[name]].tune if name in grid_of else run.tune
      if name in grid_of and seed >= tuner.seeds:
        continue  # a grid runs on the tuning seeds only (which always run, with what their grid needs)

      def fill(value, dirs=dirs, seed=seed):
        if not isinstance(value, str):
          return value
        return _REF.sub(lambda m: str(dirs[m.group(1)]), value).replace("{seed}", str(seed))

      values = {k: fill(v) for k, v in merged[name].items()}
      argv = _prefix(run) + _flag_args(values) + [f"--seed={seed}", f"--{run.output_flag}={directory}"]
      job = Job(run, seed, directory, argv, _needs(merged[name]), commit, grid=name in grid_of)
      if name in grids:
        job.after = [(g, s) for _, g in grids[name] for s in range(tuner.seeds)]
        job.alias = seed < tuner.seeds
        job.tuned = {"tune": tuner, "grid": {v: g for v, g in grids[name]}}
      jobs.append(job)
  by_key = {j.key: j for j in jobs}
  for job in jobs:  # the grid's jobs themselves, for choosing
    if job.tuned:
      job.tuned["jobs"] = {v: [by_key[(g, s)] for s in range(job.tuned["tune"].seeds)]
                           for v, g in job.tuned["grid"].items()}
  return jobs


def choose(job: Job) -> tuple[Any, dict]:
  """A tuned run's value: the grid value whose runs on the tuning seeds have the highest mean `by` (the validation
  split's accuracy; ties: the first in the grid), or None while any of them has not finished. Also returns the
  grid's table: value -> (mean, standard error, seeds)."""
  tune, table, complete = job.tuned["tune"], {}, True
  for value, grid_jobs in job.tuned["jobs"].items():
    found = []
    for g in grid_jobs:
      try:
        found.append(float(json.loads(g.summary.read_text())[tune.by]))
      except (OSError, ValueError, KeyError, TypeError):
        complete = False
    if found:
      mean, se = mean_se(found)
      table[value] = {"mean": mean, "se": se, "n": len(found)}
  if not complete or not table:
    return None, table
  return max(job.tuned["jobs"], key=lambda v: (table[v]["mean"], -list(job.tuned["jobs"]).index(v))), table


def resolve_tuned(job: Job) -> bool:
  """Fills in a tuned job's value (its argv's "{tuned}"; an alias takes the chosen grid run's directory).
  Returns False while the grid has not finished."""
  value, _ = choose(job)
  if value is None:
    return False
  if job.alias:
    grid = job.tuned["jobs"][value][job.seed]
    job.tuned.setdefault("planned", job.directory)
    job.directory, job.argv = grid.directory, grid.argv
  else:
    job.argv = [a.replace("{tuned}", str(value)) for a in job.argv]
  job.tuned["value"] = value
  return True


# EXECUTE


@dataclasses.dataclass
class Outcome:
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


def _loadavg() -> list[float] | None:
  try:
    return [round(x, 2) for x in os.getloadavg()]
  except OSError:
    return None


def _prepare(job: Job) -> list[str]:
  """The argv to run: with --resume where the runner left a checkpoint, else in a fresh directory."""
  argv = list(job.argv)
  if job.directory.exists():
    ckpts = job.directory / "checkpoints"
    if job.run.module in RESUMABLE and not job.run.command and ckpts.is_dir() and any(ckpts.iterdir()):
      return argv + ["--resume"]
    shutil.rmtree(job.directory)
  return argv


def _run_one(job: Job, processes: dict, lock: threading.Lock) -> Outcome:
  argv = _prepare(job)
  job.directory.parent.mkdir(parents=True, exist_ok=True)
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
  record = {"argv": argv, "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "loadavg_start": _loadavg(), "commit": job.commit or None}
  t0 = time.time()
  with open(job.log, "w") as log:
    log.write("$ " + " ".join(argv) + "\n")
    log.flush()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    with lock:
      processes[job.key] = proc
    code = proc.wait()
    with lock:
      processes.pop(job.key, None)
  wall = time.time() - t0
  record.update(returncode=code, wall_time_s=round(wall, 1), loadavg_end=_loadavg())
  job.record.write_text(json.dumps(record, indent=2))
  if code == 0 and job.summary.is_file():
    return Outcome("done", wall_time_s=wall)
  why = last_line(job.log) if code != 0 else "exited 0 without writing summary.json"
  return Outcome("failed", f"exit {code}: {why}", wall)


def execute(jobs: list[Job], parallel: int, echo=print) -> dict[tuple[str, int], Outcome]:
  """Runs the jobs whose summary.json is missing, `parallel` at once, each after the runs it needs."""
  outcomes: dict[tuple[str, int], Outcome] = {}
  pending = []
  keys = {j.key for j in jobs}
  by_key = {j.key: j for j in jobs}
  for job in jobs:
    missing = [k for k in job.waits_for if k not in keys]
    if missing:
      outcomes[job.key] = Outcome("blocked", f"needs {', '.join(f'{n} seed {s}' for n, s in missing)}, not planned")
      continue
    if job.summary.is_file() and not job.alias:
      outcomes[job.key] = Outcome("cached", wall_time_s=_recorded_time(job))
    else:
      pending.append(job)
  total, started = sum(not j.alias for j in pending), 0
  processes: dict = {}
  lock = threading.Lock()
  running: dict[concurrent.futures.Future, Job] = {}
  # SIGTERM (a preempted machine, `kill`) stops reproduce as Ctrl-C does: the runs in flight get SIGTERM, save the
  # step they are on and exit; the pool waits for them. A process started in the background ignores SIGINT, so
  # SIGTERM is the signal that reaches it.
  main_thread = threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGTERM, _stop) if main_thread else None
  stopped: list[str] = []
  with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
    try:
      while pending or running:
        progressed = False
        for job in list(pending):
          if len(running) >= max(1, parallel):
            break
          states = [outcomes.get(k) for k in job.waits_for]
          if any(s is not None and s.status in ("failed", "blocked") for s in states):
            bad = [f"{n}" + (f" seed {s_}" if s_ != job.seed else "")
                   for (n, s_), s in zip(job.waits_for, states) if s is not None and s.status in ("failed", "blocked")]
            outcomes[job.key] = Outcome("blocked", f"needs {', '.join(bad)}, which did not finish")
            pending.remove(job)
            progressed = True
            echo(f"[{job.run.name} seed {job.seed}] not started: {outcomes[job.key].message}")
            continue
          if all(s is not None for s in states):
            pending.remove(job)
            progressed = True
            if job.tuned and not resolve_tuned(job):
              outcomes[job.key] = Outcome("blocked", "its grid's runs did not all write their validation accuracy")
              continue
            if job.alias:  # a tuning seed: the grid's run at the chosen value is this run's
              outcomes[job.key] = Outcome("cached")
              continue
            for need in job.waits_for:  # a tuned run on a tuning seed is the grid's run at the chosen value
              alias = by_key[need]
              if alias.alias and alias.tuned.get("planned"):
                job.argv = [a.replace(str(alias.tuned["planned"]), str(alias.directory)) for a in job.argv]
            if job.summary.is_file():  # finished meanwhile (another invocation, or by hand)
              outcomes[job.key] = Outcome("cached", wall_time_s=_recorded_time(job))
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
          try:
            outcome = future.result()
          except OSError as err:
            outcome = Outcome("failed", f"could not start: {err}")
          outcomes[job.key] = outcome
          took = f" in {outcome.wall_time_s / 60:.1f} min" if outcome.wall_time_s is not None else ""
          echo(f"{job.run.name} seed {job.seed}: {outcome.status}{took}"
               + (f": {outcome.message} (log {job.log})" if outcome.message else ""))
    except (KeyboardInterrupt, Stopped) as err:
      with lock:
        for key, proc in processes.items():
          proc.terminate()
          stopped.append(f"{key[0]} seed {key[1]}")
      signum = err.signum if isinstance(err, Stopped) else signal.SIGINT
      raise Stopped(signum, stopped) from None
    finally:
      if main_thread:
        signal.signal(signal.SIGTERM, previous)
  return outcomes


def _recorded_time(job: Job) -> float | None:
  try:
    return float(json.loads(job.record.read_text())["wall_time_s"])
  except (OSError, ValueError, KeyError, TypeError):
    try:
      return float(json.loads(job.summary.read_text()).get("wall_time_s"))
    except (OSError, ValueError, TypeError):
      return None


# AGGREGATE


def mean_se(values: list[float]) -> tuple[float, float | None]:
  """Mean and standard error of the mean, s / √n with the sample standard deviation (n − 1); None if n < 2."""
  n = len(values)
  if n == 0:
    raise ValueError("mean_se of no values")
  mean = math.fsum(values) / n
  if n < 2:
    return mean, None
  var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
  return mean, math.sqrt(var / n)


def read_curve(path: pathlib.Path) -> dict[str, dict[int, float]]:
  """metrics.jsonl as key -> step -> value; a step logged twice (a resumed run) keeps its last record."""
  curves: dict[str, dict[int, float]] = {}
  if not path.is_file():
    return curves
  for line in path.read_text().splitlines():
    try:
      record = json.loads(line)
    except ValueError:
      continue  # a line cut short by an interruption
    step = record.get("step")
    if not isinstance(step, int):
      continue
    for key, value in record.items():
      if key not in ("step", "time") and isinstance(value, (int, float)) and math.isfinite(value):
        curves.setdefault(key, {})[step] = float(value)
  return curves


def _number(value) -> float | None:
  return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def collect(study: spec.Study, jobs: list[Job]) -> list[dict]:
  """Cells: one per (run, metric, step), from every seed whose run finished."""
  values: dict[tuple[str, str, int | None], dict[int, float]] = {}
  extra: dict[tuple[str, str, int | None], dict] = {}
  for job in jobs:
    if not job.summary.is_file():
      continue
    summary = read_json(job.summary, "a run's summary")
    curves = None
    for metric in study.metrics:
      if metric.runs and job.run.name not in metric.runs:
        continue
      for name, key, minus, k in metric.expand():
        if metric.source == "summary":
          v, m = _number(summary.get(key)), (_number(summary.get(minus)) if minus else 0.0)
          points = {None: v - m} if v is not None and m is not None else {}
        else:
          curves = read_curve(job.directory / "metrics.jsonl") if curves is None else curves
          base, sub = curves.get(key, {}), (curves.get(minus, {}) if minus else None)
          points = {s: v - (sub[s] if sub is not None else 0.0) for s, v in base.items()
                    if sub is None or s in sub}
          if metric.since_start and points:
            first = points[min(points)]
            points = {s: v - first for s, v in points.items()}
          if metric.reduce == "mean" and points:
            points = {None: math.fsum(points.values()) / len(points)}
        for step, v in points.items():
          cell = (job.run.name, name, step)
          values.setdefault(cell, {})[job.seed] = v
          extra[cell] = {"k": k, "percent": metric.percent, "label": metric.display}
  for c in study.contrasts:
    for (run, metric, step), by_seed in list(values.items()):
      if run != c.a or metric != c.metric or (c.b, metric, step) not in values:
        continue
      other = values[(c.b, metric, step)]
      paired = {seed: v - other[seed] for seed, v in by_seed.items() if seed in other}
      if paired:
        values[(c.run, metric, step)] = paired
        extra[(c.run, metric, step)] = {**extra[(run, metric, step)], "contrast": True}
  order = {r.name: i for i, r in enumerate(study.runs)}
  order.update({c.run: len(order) + i for i, c in enumerate(study.contrasts)})
  metric_order = {name: i for i, (name, *_rest) in enumerate(n for m in study.metrics for n in m.expand())}
  cells = []
  for (run, metric, step), by_seed in sorted(
      values.items(), key=lambda kv: (order[kv[0][0]], metric_order.get(kv[0][1], 0), -1 if kv[0][2] is None
                                      else kv[0][2])):
    seeds = sorted(by_seed)
    mean, se = mean_se([by_seed[s] for s in seeds])
    cells.append({"study": study.name, "run": run, "metric": metric, "step": step, **extra[(run, metric, step)],
                  "n": len(seeds), "seeds": seeds, "values": [by_seed[s] for s in seeds], "mean": mean, "se": se})
  return cells


# REPORT: results.json, results.md, plots


def _fmt(cell: dict | None, with_n: bool = True) -> str:
  if cell is None:
    return "-"
  scale = 100.0 if cell["percent"] else 1.0
  digits = 1 if cell["percent"] else 3
  text = f"{scale * cell['mean']:.{digits}f}"
  if cell["se"] is not None:
    text += f" ± {scale * cell['se']:.{digits}f}"
  return text + (f" ({cell['n']})" if with_n else "")


def tables(study: spec.Study, cells: list[dict]) -> list[str]:
  """Markdown tables: a curve metric by step, a templated metric by k, the scalar metrics side by side."""
  index = {(c["run"], c["metric"], c["step"]): c for c in cells}
  runs = [r for r in study.runs if any(c["run"] == r.name for c in cells)]
  out = []
  scalars = []
  for metric in study.metrics:
    if metric.source == "curve" and not metric.reduce:
      steps = sorted({c["step"] for c in cells if c["metric"] == metric.name})
      rows = [r for r in runs if any((r.name, metric.name, s) in index for s in steps)]
      if not rows:
        continue
      out.append(f"**{metric.display}** by step (mean ± s.e. (seeds))\n")
      out.append("| run | " + " | ".join(f"step {s}" for s in steps) + " |")
      out.append("|---|" + "---|" * len(steps))
      for r in rows:
        out.append(f"| {r.display} | " + " | ".join(_fmt(index.get((r.name, metric.name, s))) for s in steps) + " |")
      out.append("")
    elif metric.ks:
      names = [(n, k) for n, _, _, k in metric.expand()]
      rows = [r for r in runs if any((r.name, n, None) in index for n, _ in names)]
      if not rows:
        continue
      out.append(f"**{metric.display.format(k='K')}** by K (mean ± s.e. (seeds))\n")
      out.append("| run | " + " | ".join(f"K={k}" for _, k in names) + " |")
      out.append("|---|" + "---|" * len(names))
      for r in rows:
        out.append(f"| {r.display} | " + " | ".join(_fmt(index.get((r.name, n, None))) for n, _ in names) + " |")
      out.append("")
    else:
      scalars.append(metric)
  if study.contrasts:
    label = {r.name: r.display for r in study.runs}
    metrics = {m.name: m for m in study.metrics}
    out.append("Paired differences, run a minus run b seed by seed (mean ± s.e. (seeds)); a difference more than "
               "about two standard errors from zero is unlikely to be noise\n")
    out.append("| a - b | metric | step | difference |")
    out.append("|---|---|---|---|")
    for c in study.contrasts:
      for cell in (x for x in cells if x["run"] == c.run and x["metric"] == c.metric):
        step = "end" if cell["step"] is None else str(cell["step"])
        out.append(f"| {label[c.a]} - {label[c.b]} | {metrics[c.metric].display if c.metric in metrics else c.metric}"
                   f" | {step} | {_fmt(cell)} |")
    out.append("")
  if scalars:
    rows = [r for r in runs if any((r.name, m.name, None) in index for m in scalars)]
    cols = [m for m in scalars if any((r.name, m.name, None) in index for r in rows)]
    if rows and cols:
      out.append("Mean ± s.e. (seeds)\n")
      out.append("| run | " + " | ".join(m.display for m in cols) + " |")
      out.append("|---|" + "---|" * len(cols))
      for r in rows:
        out.append(f"| {r.display} | " + " | ".join(_fmt(index.get((r.name, m.name, None))) for m in cols) + " |")
      out.append("")
      seeds = sorted({s for c in cells for s in c["seeds"]})
      out.append("Per seed\n")
      out.append("| run | metric | " + " | ".join(f"seed {s}" for s in seeds) + " |")
      out.append("|---|---|" + "---|" * len(seeds))
      for r in rows:
        for m in cols:
          cell = index.get((r.name, m.name, None))
          if cell is None:
            continue
          by_seed = dict(zip(cell["seeds"], cell["values"]))
          scale, digits = (100.0, 1) if cell["percent"] else (1.0, 3)
          out.append(f"| {r.display} | {m.display} | " + " | ".join(
              f"{scale * by_seed[s]:.{digits}f}" if s in by_seed else "-" for s in seeds) + " |")
      out.append("")
  return out


def draw(study: spec.Study, cells: list[dict], out_dir: pathlib.Path) -> list[pathlib.Path]:
  """The study's plots as PNGs; a panel with nothing to draw says so."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  by_metric: dict[str, list[dict]] = {}
  for c in cells:
    by_metric.setdefault(c["metric"], []).append(c)
  written = []
  for plot in study.plots:
    fig, axes = plt.subplots(1, len(plot.panels), figsize=(5.2 * len(plot.panels), 4.0), squeeze=False)
    for ax, panel in zip(axes[0], plot.panels):
      runs = [study.run(n) for n in panel.runs] if panel.runs else list(study.runs)
      percent, drawn, label = True, False, panel.metrics[0]
      if plot.x == "run":
        metrics = panel.metrics
        groups = [r for r in runs if any(c["run"] == r.name for m in metrics for c in by_metric.get(m, ()))]
        width = 0.8 / max(1, len(metrics))
        for j, m in enumerate(metrics):
          found = {c["run"]: c for c in by_metric.get(m, ()) if c["step"] is None}
          xs = [i for i, r in enumerate(groups) if r.name in found]
          if not xs:
            continue
          cs = [found[groups[i].name] for i in xs]
          percent = cs[0]["percent"]
          scale = 100.0 if percent else 1.0
          label = cs[0]["label"]
          ax.bar([x + (j - (len(metrics) - 1) / 2) * width for x in xs], [scale * c["mean"] for c in cs], width,
                 yerr=[scale * (c["se"] or 0.0) for c in cs], capsize=3, label=label)
          drawn = True
        counts = {r.name: min((c["n"] for m in metrics for c in by_metric.get(m, ())
                               if c["run"] == r.name and c["step"] is None), default=0) for r in groups}
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{r.display} (n={counts[r.name]})" for r in groups], rotation=20, ha="right",
                           fontsize=8)
        if len(metrics) > 1:
          ax.legend(fontsize=8)
      else:
        for run in runs:
          if plot.x == "step":
            cs = sorted((c for c in by_metric.get(panel.metric, ()) if c["run"] == run.name and c["step"] is not None),
                        key=lambda c: c["step"])
            xs = [c["step"] for c in cs]
          else:
            cs = sorted((c for c in cells if c["run"] == run.name and c["k"] is not None
                         and c["metric"] == panel.metric.format(k=c["k"])), key=lambda c: c["k"])
            xs = [c["k"] for c in cs]
          if not cs:
            continue
          percent, label = cs[0]["percent"], cs[0]["label"]
          scale = 100.0 if percent else 1.0
          mean = [scale * c["mean"] for c in cs]
          se = [scale * (c["se"] or 0.0) for c in cs]
          n = min(c["n"] for c in cs)
          color = f"C{[r.name for r in study.runs].index(run.name) % 10}"  # a run's colour in every panel
          line, = ax.plot(xs, mean, marker="o", markersize=3, color=color, label=f"{run.display} (n={n})")
          ax.fill_between(xs, [m - s for m, s in zip(mean, se)], [m + s for m, s in zip(mean, se)],
                          color=line.get_color(), alpha=0.2, linewidth=0)
          drawn = True
        if plot.x == "k":
          ax.set_xscale("log", base=2)
          ks = sorted({c["k"] for c in cells if c["k"] is not None})
          ax.set_xticks(ks)
          ax.set_xticklabels([str(k) for k in ks])
        if drawn:
          ax.legend(fontsize=8)
      if not drawn:
        ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)
      ax.set_title(panel.title or (panel.metric if isinstance(panel.metric, str) else ""), fontsize=10)
      ax.set_xlabel(plot.xlabel or {"step": "training step", "k": "K", "run": ""}[plot.x])
      label = label.replace("{k}", "K")
      ax.set_ylabel(panel.ylabel or (f"{label} (%)" if percent else label))
      ax.grid(alpha=0.3)
    title = plot.title or study.title
    fig.suptitle(f"{title}\nmean ± standard error over seeds", fontsize=10)
    fig.tight_layout()
    path = out_dir / plot.file
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
  return written


def report(study: spec.Study, profile: str, seeds: list[int], jobs: list[Job],
           outcomes: dict[tuple[str, int], Outcome], out_dir: pathlib.Path, invocation: dict) -> dict:
  """Writes results.json, results.md and the plots; returns the results. A design profile's table takes every run
  from one commit (`check_one_commit`)."""
  if profile in study.designs:
    check_one_commit(jobs, next((j.commit for j in jobs if j.commit), ""))
  out_dir.mkdir(parents=True, exist_ok=True)
  tuning = {}
  for job in jobs:
    if job.tuned:
      value, table = choose(job)
      if job.alias and value is not None:
        resolve_tuned(job)
      tuning[job.run.name] = {"flag": job.tuned["tune"].flag, "by": job.tuned["tune"].by,
                              "seeds": job.tuned["tune"].seeds, "chosen": value,
                              "grid": [{"value": v, **table.get(v, {"mean": None, "se": None, "n": 0})}
                                       for v in job.tuned["grid"]]}
  grid_jobs = [j for j in jobs if j.grid]
  jobs = [j for j in jobs if not j.grid and not (j.alias and j.tuned.get("value") is None)]
  cells = collect(study, jobs)
  plots = draw(study, cells, out_dir)
  runs = {}
  for run in study.runs_in(profile):
    own = [j for j in jobs if j.run.name == run.name]
    times = {j.seed: (outcomes[j.key].wall_time_s if j.key in outcomes else _recorded_time(j)) for j in own}
    held_out, versions = set(), {}
    for j in own:
      if j.summary.is_file():
        summary = read_json(j.summary, "a run's summary")
        if summary.get("num_eval_problems") is not None:
          held_out.add(summary["num_eval_problems"])
        versions[j.seed] = summary.get("code_version", "not recorded")
    runs[run.name] = {
        "label": run.display, "module": run.module, "flags": study.flags_for(run, profile),
        "command_seed0": _shown(shlex.join(own[0].argv)) if own else "",
        "directories": {j.seed: _shown(str(j.directory)) for j in own},
        "status": {j.seed: (outcomes[j.key].status if j.key in outcomes
                            else ("cached" if j.summary.is_file() else "missing")) for j in own},
        "wall_time_s": times, "num_eval_problems": sorted(held_out), "code_versions": versions}
  failures = [{"run": k[0], "seed": k[1], "status": o.status, "message": o.message}
              for k, o in sorted(outcomes.items()) if o.status in ("failed", "blocked")]
  compute = sum(t for r in runs.values() for t in r["wall_time_s"].values() if t is not None)
  shown = {j.directory for j in jobs}  # a grid run that is also a tuned run's (its chosen value) counts once
  compute += sum(_recorded_time(g) or 0.0 for g in grid_jobs if g.directory not in shown)
  history = []
  if (out_dir / "invocations.jsonl").is_file():
    for line in (out_dir / "invocations.jsonl").read_text().splitlines():
      try:
        record = json.loads(line)
      except ValueError:
        continue
      if record.get("profile") == profile and record.get("ran"):
        history.append(record)
  design = study.designs.get(profile)
  rule = {"rule": "2se"}
  if design is not None:
    commit = next((j.commit for j in jobs if j.commit), "")
    rule = {"rule": "t-holm", "commit": commit, "declared": declaration(study, commit),
            "design": {"seeds": design.seeds, "alpha": design.alpha, "note": design.note,
                       "claims": [dataclasses.asdict(c) for c in design.claims]}}
  results = {"study": study.name, "title": study.title, "profile": profile, "seeds": seeds, **rule,
             "verdicts": decide_claims(study, cells, profile),
             "profile_flags": {m: dict(f) for m, f in study.profiles.get(profile, {}).items()},
             "note": study.notes.get(profile, ""), "invocation": invocation, "invocations": history,
             "compute_time_s": round(compute, 1), "runs": runs, "failures": failures, "tuning": tuning,
             "cells": cells,
             "plots": [p.name for p in plots]}
  (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
  (out_dir / "results.md").write_text(markdown(study, results, cells, plots))
  return results


def decide_claims(study: spec.Study, cells: list[dict], profile: str | None = None) -> list[dict]:
  """Each claim of the study against its cell at the last step it has (a summary metric's one cell): a profile
  with a design by its rule (`decide_design`), any other by the rule of 2 standard errors (`verdicts.decide`)."""
  if profile in study.designs:
    return decide_design(study.designs[profile], cells)
  out = []
  for claim in study.claims:
    found = [c for c in cells if c["run"] == claim.run and c["metric"] == claim.metric]
    entry = {"claim": claim.text, "run": claim.run, "metric": claim.metric, "expect": claim.expect}
    if not found:
      out.append({**entry, "cell": None, "verdict": "not run", "detail": "no seed has finished it"})
      continue
    cell = max(found, key=lambda c: -1 if c["step"] is None else c["step"])
    v = verdicts.decide(cell["mean"], cell["se"], cell["n"], claim.expect, scale=100.0 if cell["percent"] else 1.0,
                        digits=1 if cell["percent"] else 3, margin=claim.margin)
    out.append({**entry, "cell": _fmt(cell), "step": cell["step"], "n": cell["n"], "verdict": v.word,
                "detail": v.detail, "short": v.short, "z": v.z, "lo": v.lo, "hi": v.hi, "seeds_to_decide": v.seeds})
  return out


def decide_design(design: spec.Design, cells: list[dict]) -> list[dict]:
  """A design's claims, one family (`verdicts.decide_family`), each cell read on the declared seeds only."""
  entries, family = [], []
  for claim in design.claims:
    found = [c for c in cells if c["run"] == claim.run and c["metric"] == claim.metric]
    entry = {"claim": claim.text, "run": claim.run, "metric": claim.metric, "expect": claim.expect,
             "margin": claim.margin}
    cell = max(found, key=lambda c: -1 if c["step"] is None else c["step"]) if found else None
    scale, digits = (100.0, 1) if cell is None or cell["percent"] else (1.0, 3)
    values = [v for seed, v in zip(cell["seeds"], cell["values"]) if seed < design.seeds] if cell else []
    if len(values) < design.seeds:
      family.append(verdicts.Cell(claim.expect, margin=claim.margin, scale=scale, digits=digits, have=len(values),
                                  declared=design.seeds))
      entries.append({**entry, "cell": None, "step": cell["step"] if cell else None, "n": len(values)})
      continue
    mean, se = mean_se(values)
    family.append(verdicts.Cell(claim.expect, mean, se, len(values), claim.margin, scale, digits))
    shown = {**cell, "mean": mean, "se": se, "n": len(values)}
    entries.append({**entry, "cell": _fmt(shown), "step": cell["step"], "n": len(values)})
  out = []
  for entry, v in zip(entries, verdicts.decide_family(family, design.alpha)):
    out.append({**entry, "verdict": v.word, "detail": v.detail, "short": v.short, "lo": v.lo, "hi": v.hi})
  return out


PAGES = ROOT / "docs" / "reproduce"  # committed pages: <study>/results.json (quick), <study>/full/results.json


def claims_table(pages: pathlib.Path = PAGES) -> str:
  """The Markdown table of every registered study's claims against its committed quick and full pages (verdicts
  decided again from the pages' cells): what the README's "What reproduces" shows."""

  def read(path: pathlib.Path):
    return read_json(path, "a study's results page", need=("cells",)) if path.is_file() else None

  def column(study, page, claim):
    if page is None:
      return "not yet", None
    v = next(v for v in decide_claims(study, page["cells"]) if v["claim"] == claim.text)
    if v["verdict"] == "not run":
      return "not yet", None
    word = "" if v["verdict"] == "reported" else f": **{v['verdict']}**"
    return f"{v['cell'].rsplit(' (', 1)[0]} ({v['n']} seed{'s' if v['n'] != 1 else ''}){word}", v

  def says(v, profile):
    return "-" if v is None else f"{profile}: {v['short']}"

  lines = ["| the paper (old rule: 2 s.e., no correction) | quick profile (40 RL steps) | full profile (the "
           "runners' settings) | in short |", "|---|---|---|---|"]
  for name, study in studies_lib.STUDIES.items():
    quick, full = read(pages / name / "results.json"), read(pages / name / "full" / "results.json")
    for claim in study.claims:
      (q_text, q), (f_text, f) = column(study, quick, claim), column(study, full, claim)
      lines.append(f"| {claim.text} | {q_text} | {f_text} | {says(f, 'full') if f else says(q, 'quick')} |")
  designed = [(name, study, profile) for name, study in studies_lib.STUDIES.items() for profile in study.designs]
  if designed:
    lines += ["", "| the paper (a declared design: t, Holm) | study, profile | value (seeds) | verdict |",
              "|---|---|---|---|"]
  for name, study, profile in designed:
    page = read(pages / name / profile / "results.json")
    decided = decide_claims(study, page["cells"], profile) if page else None
    for i, claim in enumerate(study.designs[profile].claims):
      v = decided[i] if decided else None
      value = f"{v['cell'].rsplit(' (', 1)[0]} ({v['n']} seeds)" if v and v["cell"] else "not yet"
      verdict = f"**{v['verdict']}**: {v['short']}" if v else "not yet run"
      lines.append(f"| {claim.text} | {name}, {profile} | {value} | {verdict} |")
  return "\n".join(lines) + "\n"


def page_dirs(pages: pathlib.Path, name: str, study: spec.Study) -> list[pathlib.Path]:
  """Where a study's committed pages live: <name>/ (quick), <name>/full/, <name>/<profile>/ for each design."""
  return [pages / name, pages / name / "full"] + [pages / name / p for p in study.designs if p != "full"]


def redecide_pages(pages: pathlib.Path = PAGES) -> list[pathlib.Path]:
  """Rewrites the verdicts of every committed page (results.json and the Verdicts section of results.md) from its
  own cells under today's claims and rules; the runs need not exist, and the rest of the page stays as it ran.
  Returns the pages it changed."""
  changed = []
  read = {path: read_json(path, "a study's results page", need=("cells",))  # every page reads before any is written
          for name in studies_lib.STUDIES for path in (pages / name / "results.json", pages / name / "full" /
                                                       "results.json") if path.is_file()}
  for name, study in studies_lib.STUDIES.items():
    for page_dir in page_dirs(pages, name, study):
      path, md = page_dir / "results.json", page_dir / "results.md"
      if not path.is_file():
        continue
      results = read[path]
      verdicts_now = json.loads(json.dumps(decide_claims(study, results["cells"], results.get("profile")),
                                           default=str))
      lines = md.read_text().split("\n")
      if "## Verdicts" in lines:
        start = lines.index("## Verdicts")
        end = start + 4  # the heading, a blank line, the rule, a blank line, then the table
        while end < len(lines) and lines[end].startswith("|"):
          end += 1
        end += 1  # the blank line after the table
      else:  # a page from before verdicts: the section goes before the first table
        start = end = next((i for i, line in enumerate(lines) if line.startswith(("**", "## Runs"))), len(lines))
      section = _verdict_lines(verdicts_now, results.get("rule", "2se"))
      if verdicts_now == results.get("verdicts", []) and lines[start:end] == section:
        continue
      results["verdicts"] = verdicts_now
      path.write_text(json.dumps(results, indent=2, default=str) + "\n")
      lines[start:end] = section
      md.write_text("\n".join(lines))
      changed.append(page_dir)
  return changed


def _shown(text: str) -> str:
  """Paths inside the repository relative to it, the interpreter as `python`."""
  return text.replace(sys.executable, "python").replace(str(ROOT) + "/", "")


def _verdict_lines(verdict_list: list[dict], rule: str = "2se") -> list[str]:
  """The page's "Verdicts" section: the rule, then each claim's cell and verdict."""
  if not verdict_list:
    return []
  if rule == "t-holm":
    said = ("Each of the paper's findings against its cell (mean ± s.e. (seeds) on the declared seeds, at the last "
            "step), decided by the design's rule: Student-t p-values on the paired per-seed values, Holm-corrected "
            "across the claims at the declared α; reproduced or contradicted when the test against zero rejects, "
            "equal within the declared margin when the equivalence test (two one-sided t tests) rejects, else "
            "undecided; pending until every claim has all its declared seeds "
            "(`experiments/studies/verdicts.py`, `decide_family`).")
  else:
    said = (f"Decided by the rule these runs were made under, before the designs of issue 56 (labelled so: it is "
            f"looser than it reads): each finding against its cell (mean ± s.e. (seeds), at the last step); with "
            f"{verdicts.MIN_SEEDS} or more seeds, reproduced or contradicted when the {verdicts.Z:g}-standard-error "
            "interval lies on one side of zero (an 82% interval at 3 seeds, 88% at 5), no correction across the "
            "claims; equal when a claimed ordering's interval holds zero but lies inside its margin (a margin set "
            "after the quick pages); consistent when a claimed non-change stays inside its margin (or, with none, "
            "the interval holds zero); else undecided.")
  lines = ["## Verdicts", "", said, "",
           "| the paper | cell | value | verdict |", "|---|---|---|---|"]
  lines += [f"| {v['claim']} | {v['run']}, {v['metric']} | {v.get('cell') or '-'} | **{v['verdict']}** "
            f"({v['detail']}) |" for v in verdict_list]
  return lines + [""]


def _design_lines(results: dict) -> list[str]:
  """A design page's "Design" section: what was declared, in which commit, and the commit the runs come from."""
  if results.get("rule") != "t-holm":
    return []
  design, declared, commit = results["design"], results["declared"], results["commit"]
  when = (f"commit `{declared['commit'][:12]}` ({declared['date']}), the last commit at or before the runs' to "
          f"change {', '.join(f'`{f}`' for f in declared['files'])}" if declared.get("commit")
          else "a commit git could not name")
  lines = ["## Design", "",
           f"Declared before the runs in {when}. Every run on this page comes from commit `{commit[:12]}` "
           f"(reproduce refuses a table that mixes commits). Seeds per arm: {design['seeds']} (seeds 0 to "
           f"{design['seeds'] - 1}; more are left out of the verdicts); family-wise error rate α = "
           f"{design['alpha']:g} over the claims below (Holm)." + (f" {design['note']}" if design["note"] else ""),
           "", "| claim | cell | expected | margin |", "|---|---|---|---|"]
  words = {">": "above zero", "<": "below zero", "=": "no change", "": "no ordering (reported)"}
  for c in design["claims"]:
    margin = f"±{100 * c['margin']:.1f} points" if c["margin"] else "-"
    lines.append(f"| {c['text']} | {c['run']}, {c['metric']} | {words[c['expect']]} | {margin} |")
  return lines + [""]


def _tuning_lines(study: spec.Study, results: dict) -> list[str]:
  """The "chosen on the validation split" section: each tuned run's grid, its validation means, the choice."""
  tuning = results.get("tuning") or {}
  if not tuning:
    return []
  lines = ["## Hyperparameters chosen on the validation split", "",
           "Each tuned run was made at every value of its grid on the tuning seeds, with `--num_validation` "
           "problems of the training pool held out; the value with the best mean validation accuracy is the run's "
           "on every seed (the tuning seeds' runs at that value are its runs there). The test set chose nothing.",
           "", "| run | flag | value: validation accuracy, mean ± s.e. (seeds) | chosen |", "|---|---|---|---|"]
  label = {r.name: r.display for r in study.runs}
  for name, t in tuning.items():
    grid = "; ".join(f"{g['value']:g}: " + ("-" if g["mean"] is None else _fmt(
        {"mean": g["mean"], "se": g["se"], "n": g["n"], "percent": True})) for g in t["grid"])
    chosen = "not yet (the grid has not finished)" if t["chosen"] is None else f"**{t['chosen']:g}**"
    lines.append(f"| {label.get(name, name)} | --{t['flag']} | {grid} | {chosen} |")
  return lines + [""]


def markdown(study: spec.Study, results: dict, cells: list[dict], plots: list[pathlib.Path]) -> str:
  lines = [f"# {study.title}", ""]
  if study.description:
    lines += [study.description.strip(), ""]
  held_out = sorted({n for r in results["runs"].values() for n in r["num_eval_problems"]})
  lines.append(f"Study `{study.name}`, profile `{results['profile']}`, seeds {', '.join(map(str, results['seeds']))}; "
               f"held-out problems per evaluation: {', '.join(map(str, held_out)) or 'n/a'}. Each cell is the mean "
               "± standard error over seeds (s / √n), with the number of seeds in parentheses.")
  if results["note"]:
    lines += ["", f"Profile `{results['profile']}`: {results['note']}"]
  for module, values in results["profile_flags"].items():
    lines.append(f"Flags it adds to every `{module}` run: `{' '.join(_flag_args(values))}`.")
  lines.append("")
  lines += _design_lines(results)
  lines += _verdict_lines(results["verdicts"], results.get("rule", "2se"))
  lines += _tuning_lines(study, results)
  lines += tables(study, cells)
  for p in plots:
    lines += [f"![{p.stem}]({p.name})", ""]
  lines += ["## Runs", "",
            f"Run time of all runs, summed over runs and seeds as recorded when each ran (runs shared with another "
            f"study count here too): {results['compute_time_s'] / 60:.1f} min.", ""]
  if results["invocations"]:
    total = sum(i["wall_time_s"] for i in results["invocations"])
    lines.append(f"Invocations that ran something ({total / 60:.1f} min wall in all):")
    lines += [f"- {i['started']}: {i['wall_time_s'] / 60:.1f} min wall, {i['ran']} runs ran, {i['cached']} done "
              f"already, {i['failed']} failed; --parallel={i['parallel']}, load average (1, 5, 15 min) "
              f"{i['loadavg_start']} at the start, {i['loadavg_end']} at the end, {i['cpu_count']} CPUs"
              for i in results["invocations"]]
    lines.append("")
  lines += ["| run | wall time per seed (min) | status | command (seed 0) |", "|---|---|---|---|"]
  for name, r in results["runs"].items():
    times = ", ".join("-" if t is None else f"{t / 60:.1f}" for t in r["wall_time_s"].values())
    status = ", ".join(sorted(set(r["status"].values())))
    command = r["command_seed0"].replace("\n", " ")
    lines.append(f"| {r['label']} | {times} | {status} | `{command}` |")
  versions = sorted({v for r in results["runs"].values() for v in r.get("code_versions", {}).values()})
  if versions:
    lines += ["", f"Code versions of the runs aggregated ({len(versions)}): "
              + ", ".join(f"`{v[:12] + v[40:] if len(v) >= 40 else v}`" for v in versions)
              + (". A run's directory is named by its runner and flags, not its code: runs of other code versions "
                 "are reused until their directories are removed." if len(versions) > 1 else ".")]
  if results["failures"]:
    lines += ["", "## Failures", ""]
    lines += [f"- {f['run']} seed {f['seed']}: {f['status']}: {f['message']}" for f in results["failures"]]
  return "\n".join(lines) + "\n"


def _link_runs(jobs: list[Job], out_dir: pathlib.Path) -> None:
  """out_dir/runs/<run>/seed<S> -> the run directory; out_dir/logs/<run>-seed<S>.log -> its log."""
  for job in jobs:
    for link, target in ((out_dir / "runs" / job.run.name / f"seed{job.seed}", job.directory),
                         (out_dir / "logs" / f"{job.run.name}-seed{job.seed}.log", job.log)):
      try:
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
          link.unlink()
        link.symlink_to(target)
      except OSError:
        pass  # links are a convenience


# MAIN


def reproduce(study: spec.Study, *, profile: str, seeds: list[int], out_dir: pathlib.Path, runs_dir: pathlib.Path,
              parallel: int = 1, only: list[str] | None = None, dry_run: bool = False, aggregate_only: bool = False,
              echo=print, commit: str = "") -> dict | None:
  """Plans, runs (what is missing) and reports a study; returns results.json's content (None on a dry run). A
  design profile runs from one commit: `commit`, by default HEAD, which must then be clean."""
  if profile in study.designs and not commit:
    commit = design_commit(study, profile, dry_run)
  jobs = plan(study, profile, seeds, runs_dir, commit if profile in study.designs else "")
  todo = jobs
  if only:
    unknown = set(only) - {r.name for r in study.runs}
    if unknown:
      raise StudyError(f"--only: no runs {sorted(unknown)} in study {study.name}")
    by_key = {j.key: j for j in jobs}
    wanted, stack = set(), [j.key for j in jobs if j.run.name in only]
    while stack:
      key = stack.pop()
      if key not in wanted and key in by_key:
        wanted.add(key)
        stack += by_key[key].waits_for
    todo = [j for j in jobs if j.key in wanted]
  if dry_run:
    for job in todo:
      if job.alias:
        echo(f"# {job.run.name} seed {job.seed}: the grid's run at the value chosen on the validation split")
        continue
      state = "skip (summary.json exists)" if job.summary.is_file() else "run"
      echo(f"# {job.run.name} seed {job.seed}: {state}\n" + " ".join(job.argv))
    return None
  t0, load0 = time.time(), _loadavg()
  started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  if aggregate_only:
    outcomes = {j.key: Outcome("cached", wall_time_s=_recorded_time(j)) for j in jobs if j.summary.is_file()}
  else:
    outcomes = execute(todo, parallel, echo)
  out_dir.mkdir(parents=True, exist_ok=True)
  for job in jobs:
    if job.alias:
      resolve_tuned(job)  # a tuning seed's run is the grid's at the chosen value, once the grid has finished
  _link_runs(jobs, out_dir)
  invocation = {"started": started, "wall_time_s": round(time.time() - t0, 1), "profile": profile,
                "seeds": len(seeds), "parallel": parallel, "only": list(only or []), "loadavg_start": load0,
                "loadavg_end": _loadavg(), "cpu_count": os.cpu_count(),
                "ran": sum(o.status == "done" for o in outcomes.values()),
                "cached": sum(o.status == "cached" for o in outcomes.values()),
                "failed": sum(o.status in ("failed", "blocked") for o in outcomes.values())}
  if not aggregate_only:  # the study's history of invocations that ran something: its wall times
    with open(out_dir / "invocations.jsonl", "a") as f:
      f.write(json.dumps(invocation) + "\n")
  results = report(study, profile, seeds, jobs, outcomes, out_dir, invocation)
  echo(f"{study.name}: {invocation['ran']} runs ran, {invocation['cached']} were done already, "
       f"{invocation['failed']} failed or blocked; {len(results['cells'])} cells -> {out_dir / 'results.json'}, "
       f"{out_dir / 'results.md'}" + "".join(f", {p}" for p in results["plots"]))
  for f in results["failures"]:
    echo(f"  {f['run']} seed {f['seed']} {f['status']}: {f['message']}")
  return results


def _list() -> None:
  for study in studies_lib.STUDIES.values():
    print(f"{study.name}: {study.title}")
    print(f"  profiles: full, {', '.join(study.profiles)}")
    for run in study.runs:
      tuned = (f" (--{run.tune.flag} from {', '.join(f'{v:g}' for v in run.tune.values)} on a validation split)"
               if run.tune else "")
      print(f"  - {run.name} ({run.module}): {' '.join(_flag_args(dict(run.flags)))}{tuned}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.list:
    _list()
    return
  try:
    if FLAGS.claims_table:
      print(claims_table(), end="")
      return
    if FLAGS.redecide:
      for page_dir in redecide_pages():
        print(f"reproduce: new verdicts in {page_dir}/results.md")
      return
  except StudyError as err:
    sys.exit(f"reproduce: error: {err}")
  if FLAGS.write_defaults_snapshot:
    revision = write_defaults_snapshot()
    print(f"reproduce: {DEFAULTS_SNAPSHOT} now holds revision {revision} of the runners' defaults")
    return
  if not FLAGS.study:
    sys.exit("reproduce: error: --study is required (--list shows the studies)")
  if FLAGS.seeds < 1 or FLAGS.parallel < 1:
    sys.exit("reproduce: error: --seeds and --parallel must be >= 1")
  try:
    study = load_study(FLAGS.study)
    out_dir = pathlib.Path(FLAGS.out_dir or f"runs/reproduce/{study.name}")
    design = study.designs.get(FLAGS.profile)
    seeds = FLAGS.seeds if FLAGS["seeds"].present else design.seeds if design else study.seeds
    results = reproduce(study, profile=FLAGS.profile, seeds=list(range(seeds)), out_dir=out_dir,
                        runs_dir=pathlib.Path(FLAGS.runs_dir), parallel=FLAGS.parallel, only=FLAGS.only,
                        dry_run=FLAGS.dry_run, aggregate_only=FLAGS.aggregate_only)
  except (StudyError, ValueError, OSError) as err:  # OSError: an --out_dir or --runs_dir it cannot write
    sys.exit(f"reproduce: error: {err}")
  except Stopped as err:
    print(f"reproduce: {err}", file=sys.stderr)
    sys.exit(128 + err.signum)
  if results and results["failures"]:
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
