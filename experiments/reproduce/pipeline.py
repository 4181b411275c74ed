"""One invocation of reproduce: plan a study, run what is missing, and write its pages."""

import datetime
import json
import os
import pathlib
import time

from experiments.reproduce import archive as archive_lib
from experiments.reproduce import design as design_lib
from experiments.reproduce import execute
from experiments.reproduce import pages
from experiments.reproduce import plan as plan_lib
from experiments.reproduce import tune
from experiments.studies import spec


def reproduce(study: spec.Study, *, profile: str, seeds: list[int], out_dir: pathlib.Path, runs_dir: pathlib.Path,
              parallel: int = 1, only: list[str] | None = None, dry_run: bool = False, aggregate_only: bool = False,
              echo=print, commit: str = "", archive: pathlib.Path | None = None) -> dict | None:
  """Plans, runs (what is missing) and reports a study; returns results.json's content (None on a dry run). A
  design profile runs from one commit: `commit`, by default HEAD, which must then be clean. With `archive`, the
  finished runs kept there are put back first, and each finished seed is kept there as it ends (`archive.py`)."""
  if profile in study.designs and not commit:
    commit = design_lib.design_commit(study, profile, dry_run)
  jobs = plan_lib.plan(study, profile, seeds, runs_dir, commit if profile in study.designs else "")
  todo = _needed_by(jobs, only, study) if only else jobs
  if dry_run:
    _print_plan(todo, echo, archive)
    return None
  if archive is not None:
    _check_writable(archive, "--archive_dir")  # before any run, not when the first seed has finished
    restored = archive_lib.restore(jobs, archive)
    if restored:
      echo(f"{study.name}: {len(restored)} finished runs restored from {archive}")
    _keep(jobs, archive, echo)  # runs that finished before the archive was named
  t0, load0 = time.time(), execute.loadavg()
  started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  if aggregate_only:
    outcomes = {j.key: execute.Outcome("cached", wall_time_s=execute.recorded_time(j))
                for j in jobs if j.summary.is_file()}
  else:
    _check_writable(runs_dir, "--runs_dir")  # once, before any run: not one failure a run
    on_finish = (lambda job, outcome: _keep(jobs, archive, echo)) if archive is not None else None
    outcomes = execute.execute(todo, parallel, echo, on_finish)
  out_dir.mkdir(parents=True, exist_ok=True)
  for job in jobs:
    if job.alias:
      tune.resolve_tuned(job)  # a tuning seed's run is the grid's at the chosen value, once the grid has finished
  _link_runs(jobs, out_dir)
  invocation = {"started": started, "wall_time_s": round(time.time() - t0, 1), "profile": profile,
                "seeds": len(seeds), "parallel": parallel, "only": list(only or []), "loadavg_start": load0,
                "loadavg_end": execute.loadavg(), "cpu_count": os.cpu_count(),
                "ran": sum(o.status == "done" for o in outcomes.values()),
                "cached": sum(o.status == "cached" for o in outcomes.values()),
                "failed": sum(o.status in ("failed", "blocked") for o in outcomes.values())}
  if not aggregate_only:  # the study's history of invocations that ran something: its wall times
    with open(out_dir / "invocations.jsonl", "a") as f:
      f.write(json.dumps(invocation) + "\n")
  results = pages.report(study, profile, seeds, jobs, outcomes, out_dir, invocation)
  echo(f"{study.name}: {invocation['ran']} runs ran, {invocation['cached']} were done already, "
       f"{invocation['failed']} failed or blocked; {len(results['cells'])} cells -> {out_dir / 'results.json'}, "
       f"{out_dir / 'results.md'}" + "".join(f", {p}" for p in results["plots"]))
  for f in results["failures"]:
    echo(f"  {f['run']} seed {f['seed']} {f['status']}: {f['message']}")
  return results


def _keep(jobs: list[plan_lib.Job], archive: pathlib.Path, echo) -> None:
  """Saves what has newly finished into the archive, said in one line."""
  saved = archive_lib.save(jobs, archive)
  if saved:
    echo(f"kept in {archive}: {', '.join(saved)}")


def _check_writable(directory: pathlib.Path, flag: str) -> None:
  """Raises OSError naming `flag`=`directory` when it cannot be made or written (a file in its way, no
  permission)."""
  try:
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f".write-probe-{os.getpid()}"
    probe.write_text("")
    probe.unlink()
  except OSError as err:
    raise OSError(f"{flag}={directory} cannot be written: {err.strerror or err}") from None


def _needed_by(jobs: list[plan_lib.Job], only: list[str], study: spec.Study) -> list[plan_lib.Job]:
  """--only: the jobs of these runs and of the runs they wait for, in plan order."""
  unknown = set(only) - {r.name for r in study.runs}
  if unknown:
    raise plan_lib.StudyError(f"--only: no runs {sorted(unknown)} in study {study.name}")
  by_key = {j.key: j for j in jobs}
  wanted, stack = set(), [j.key for j in jobs if j.run.name in only]
  while stack:
    key = stack.pop()
    if key not in wanted and key in by_key:
      wanted.add(key)
      stack += by_key[key].waits_for
  return [j for j in jobs if j.key in wanted]


def _print_plan(jobs: list[plan_lib.Job], echo, archive: pathlib.Path | None = None) -> None:
  """--dry_run: each job's command, and whether it would run or be skipped."""
  for job in jobs:
    if job.alias:
      echo(f"# {job.run.name} seed {job.seed}: the grid's run at the value chosen on the validation split")
      continue
    state = ("skip (summary.json exists)" if job.summary.is_file() else
             "skip (kept in the archive)" if archive is not None and archive_lib.is_kept(job, archive) else "run")
    echo(f"# {job.run.name} seed {job.seed}: {state}\n" + " ".join(job.argv))


def _link_runs(jobs: list[plan_lib.Job], out_dir: pathlib.Path) -> None:
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
