"""The git commit of a checkout: what a run's summary records as its code, and what a study pins its runs to."""

import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]


def head_commit(root: pathlib.Path = ROOT) -> str:
  """The commit checked out at `root`, with "-dirty" when tracked files differ from it; "unknown" outside git."""
  try:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                           text=True, timeout=30)
  except (OSError, subprocess.SubprocessError):
    return "unknown"
  if head.returncode:
    return "unknown"
  return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
