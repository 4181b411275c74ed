"""Directories and files that appear whole or not at all: write into a temporary sibling, then rename.

A run that is killed while exporting a model (`sft_policy`, `final_policy`, a reward model) leaves only a
hidden `.<name>.tmp-*` sibling, which the next export of that name removes; a later run never finds a
half-written directory under the real name, marker files included.
"""

import contextlib
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def atomic_directory(target: str | os.PathLike) -> Iterator[pathlib.Path]:
  """Yields an empty temporary sibling of `target`; on success it replaces `target` by renames.

  Single writer: in a multi-process run only one process may call it for a given `target`.

  Args:
    target: the directory to (re)write.

  Yields:
    The temporary directory to write everything into.
  """
  target = pathlib.Path(target)
  target.parent.mkdir(parents=True, exist_ok=True)
  for stale in target.parent.glob(f".{target.name}.tmp-*"):  # left by a killed export
    shutil.rmtree(stale, ignore_errors=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  old = None
  if target.exists():
    old = target.with_name(f".{target.name}.tmp-old-{os.getpid()}")
    target.rename(old)
  tmp.rename(target)
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> pathlib.Path:
  """Writes `text` to `path` through a temporary sibling and a rename: readers see the old file or the new
  one, never a prefix (a run's summary.json, whose presence tells a study the run is done)."""
  path = pathlib.Path(path)
  tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
  try:
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
  finally:
    tmp.unlink(missing_ok=True)
  return path
