"""A design profile's commit: every run of it from one commit, and the commit that declared the design."""

import json
import pathlib
import subprocess
import sys

from experiments.reproduce import plan as plan_lib
from experiments.runner.git_commit import head_commit
from experiments.studies import common
from experiments.studies import spec


def spec_files(study: spec.Study) -> list[str]:
  """The files, relative to the repository, whose commits declare a study's design: its module in
  `experiments.studies` (when it is a registered study), the shared module of the studies when that module reads
  it (`studies.common`: margins, tasks, shared starts), and the verdict rule."""
  files = ["experiments/studies/verdicts.py"]
  for module in list(sys.modules.values()):  # the study's own module, not another that holds it (a test's)
    if (getattr(module, "STUDY", None) is study and getattr(module, "__file__", None)
        and getattr(module, "__name__", "").startswith("experiments.studies.")):
      try:
        files[:0] = [_relative(module)] + ([_relative(common)] if common in vars(module).values() else [])
      except ValueError:  # a study module outside the repository: no commit of ours declares it
        pass
  return files


def _relative(module) -> str:
  return str(pathlib.Path(module.__file__).resolve().relative_to(plan_lib.ROOT))


def declaration(study: spec.Study, commit: str, root: pathlib.Path = plan_lib.ROOT) -> dict:
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
    raise plan_lib.StudyError(
        f"study {study.name}, profile {profile}: a design runs every arm from one commit, and {plan_lib.ROOT} "
        f"is {'not a git checkout' if commit == 'unknown' else 'changed since its last commit'}; "
        "commit, or run from a worktree pinned to a commit (git worktree add DIR COMMIT)")
  return commit


def check_one_commit(jobs: list[plan_lib.Job], commit: str) -> None:
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
    raise plan_lib.StudyError(
        f"a design's table takes every run from one commit, {commit[:12]}, and these are not from it: "
        f"{said}; remove them, or aggregate from a worktree pinned to their commit")
