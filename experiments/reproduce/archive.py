"""A design's finished runs kept in the repository, so that a study longer than a session outlives its machine.

A design profile runs for hours over several sessions, and a session's machine (with `--runs_dir` on it) may not
come back. What its pages need of a finished run is small: the run's top-level files (summary.json, metrics.jsonl,
config.json) and its record (argv, commit, wall time). So, as runs finish, `save` copies these into the archive,
`docs/reproduce/<study>/<profile>/runs/<runner>-<hash>/seed<S>/` (commit it), and the next invocation's `restore`
puts them back where the plan looks, and the finished runs are skipped.

A run's weights stay out, with one exception: a seed is saved only once every run of it has finished, so no run
still to come reads a saved run's weights (a seed cut short by the end of a session runs again, whole). A shared
run (one process, seed 0's, that every seed reads) is saved when it finishes, with the paths the others read from
it (a start policy): one copy for the whole study.
"""

import pathlib
import shutil

from experiments.reproduce import plan as plan_lib

MAX_FILE_BYTES = 4 << 20  # a top-level file larger than this is left out (sample dumps); summaries are far smaller


def default_dir(study_name: str, profile: str) -> pathlib.Path:
  """Where a design profile's runs are kept: beside its committed page."""
  return plan_lib.ROOT / "docs" / "reproduce" / study_name / profile / "runs"


def chosen_dir(flag: str, study_name: str, profile: str, declared: bool) -> pathlib.Path | None:
  """`--archive_dir`'s value: `none` keeps nothing, a path keeps there, and empty keeps a declared design's runs in
  `default_dir` (other profiles keep nothing)."""
  if flag == "none":
    return None
  if flag:
    return pathlib.Path(flag)
  return default_dir(study_name, profile) if declared else None


def _kept(job: plan_lib.Job, archive: pathlib.Path) -> pathlib.Path:
  return archive / job.directory.parent.name / job.directory.name


def _record(job: plan_lib.Job, archive: pathlib.Path) -> pathlib.Path:
  return archive / job.directory.parent.name / job.record.name


def is_kept(job: plan_lib.Job, archive: pathlib.Path) -> bool:
  """Whether the archive holds this job's finished run."""
  return (_kept(job, archive) / "summary.json").is_file()


def _read_paths(job: plan_lib.Job, jobs: list[plan_lib.Job]) -> list[pathlib.Path]:
  """The paths under a job's directory that other jobs' command lines name (a start policy; the directory itself
  when a flag names it whole)."""
  root, found = str(job.directory), set()
  for other in jobs:
    if other is job:
      continue
    for arg in other.argv:
      value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
      if value == root:
        found.add(job.directory)
      elif value.startswith(root + "/"):
        found.add(pathlib.Path(value))
  return sorted(found)


def _copy_run(job: plan_lib.Job, archive: pathlib.Path, extra: list[pathlib.Path]) -> None:
  """Copies a finished run's top-level files, its record and the paths `extra` (from its directory) into the
  archive, through a temporary directory renamed into place, so that a copy cut short is never taken for a run."""
  target = _kept(job, archive)
  partial = target.with_name(target.name + ".partial")
  shutil.rmtree(partial, ignore_errors=True)
  partial.mkdir(parents=True)
  for path in sorted(job.directory.iterdir()):
    if path.is_file() and path.stat().st_size <= MAX_FILE_BYTES:
      shutil.copy2(path, partial / path.name)
  for path in extra:
    if path == job.directory:  # read whole: all but its resumable checkpoints
      for child in path.iterdir():
        if child.is_dir() and child.name not in _CHECKPOINTS:
          shutil.copytree(child, partial / child.name, dirs_exist_ok=True)
    elif path.exists():
      destination = partial / path.relative_to(job.directory)
      destination.parent.mkdir(parents=True, exist_ok=True)
      (shutil.copytree if path.is_dir() else shutil.copy2)(path, destination)
  if job.record.is_file():
    shutil.copy2(job.record, _record(job, archive))
  shutil.rmtree(target, ignore_errors=True)
  partial.rename(target)


_CHECKPOINTS = ("checkpoints", "sft_checkpoints")  # a finished run's resume state: never read by another run


def save(jobs: list[plan_lib.Job], archive: pathlib.Path) -> list[str]:
  """Copies into `archive` every finished shared run and every seed whose runs have all finished, that it does
  not hold yet; returns what it saved ("run seed S")."""
  own = [j for j in jobs if not j.alias]
  shared = {j.key for j in own if j.run.shared}
  seeds = {j.seed for j in own}
  saved = []
  for job in own:
    if job.key in shared and job.summary.is_file() and not is_kept(job, archive):
      _copy_run(job, archive, _read_paths(job, jobs))
      saved.append(f"{job.run.name} seed {job.seed}")
  for seed in sorted(seeds):
    runs = [j for j in own if j.seed == seed and j.key not in shared]
    if runs and all(j.summary.is_file() for j in runs):
      for job in runs:
        if not is_kept(job, archive):
          _copy_run(job, archive, [])
          saved.append(f"{job.run.name} seed {job.seed}")
  return saved


def restore(jobs: list[plan_lib.Job], archive: pathlib.Path) -> list[str]:
  """Puts each kept run whose summary is missing under --runs_dir back where the plan looks (replacing what an
  interrupted attempt left there); returns what it restored ("run seed S")."""
  restored = []
  for job in jobs:
    if job.alias or job.summary.is_file() or not is_kept(job, archive):
      continue
    shutil.rmtree(job.directory, ignore_errors=True)
    job.directory.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(_kept(job, archive), job.directory)
    if _record(job, archive).is_file():
      shutil.copy2(_record(job, archive), job.record)
    restored.append(f"{job.run.name} seed {job.seed}")
  return restored
