"""Rows of Hugging Face `datasets` files on disk, read with pyarrow: no hub, no `datasets` import.

Accepted sources (`read_rows`):
  a parquet or arrow file, or a glob of them    "gsm8k/main/train-*.parquet"
  a `Dataset.save_to_disk` folder              holds state.json and data-*.arrow (Arrow IPC streams)
  a `DatasetDict.save_to_disk` folder + split  holds dataset_dict.json and one such folder per split
  a folder + split                             holding <split>.parquet or <split>-*.parquet, or the same
                                               under data/ (the hub's parquet layout)

pyarrow comes with `datasets` (`pip install 'grpo_jax[hf]'`); it is imported only when such a file is read.
"""

import glob
import json
import os
from typing import Any, Iterator, Sequence

ARROW_MARKERS = ("state.json", "dataset_dict.json")  # what `save_to_disk` writes beside the data


class ArrowFileError(ValueError):
  """A file or folder that cannot be read as rows; the message is one line naming it."""


def _pyarrow():
  try:
    import pyarrow  # pylint: disable=import-outside-toplevel
    import pyarrow.parquet  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError as err:
    raise ArrowFileError(f"reading parquet or `datasets` folders needs pyarrow, which is not installed ({err}): "
                         "pip install 'grpo_jax[hf]'") from None
  return pyarrow


def is_source(path: str | os.PathLike) -> bool:
  """Whether `path` names a parquet or arrow file, a glob, or a `save_to_disk` folder (not a JSONL file)."""
  path = os.fspath(path)
  if glob.has_magic(path) or path.endswith((".parquet", ".arrow")):
    return True
  return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, m)) for m in ARROW_MARKERS)


def has_split(directory: str | os.PathLike, split: str) -> bool:
  """Whether a folder holds `split` as parquet files or as a `DatasetDict` split."""
  directory = os.fspath(directory)
  return bool(_split_parquet(directory, split)) or os.path.isfile(os.path.join(directory, "dataset_dict.json"))


def _split_parquet(directory: str, split: str) -> list[str]:
  for folder in (directory, os.path.join(directory, "data")):
    files = sorted(glob.glob(os.path.join(glob.escape(folder), f"{split}.parquet")) +
                   glob.glob(os.path.join(glob.escape(folder), f"{split}-*.parquet")))
    if files:
      return files
  return []


def _one_line(err: Exception) -> str:
  return str(err).strip().split("\n", 1)[0]


def _saved_arrow_files(directory: str) -> list[str]:
  """The data files of a `Dataset.save_to_disk` folder, in order."""
  state_path = os.path.join(directory, "state.json")
  try:
    with open(state_path, encoding="utf-8") as f:
      state = json.load(f)
    names = [entry["filename"] for entry in state["_data_files"]]
  except (OSError, ValueError, KeyError, TypeError) as err:
    raise ArrowFileError(f"{state_path}: not a `datasets` state file ({type(err).__name__}: {_one_line(err)})"
                         ) from None
  return [os.path.join(directory, name) for name in names]


def source_files(path: str | os.PathLike, split: str | None = None) -> list[str]:
  """The parquet or arrow files behind `path` (see the module docstring), in row order.

  Raises:
    ArrowFileError: one line naming the path, when nothing matches or a `DatasetDict` lacks the split.
  """
  path = os.fspath(path)
  if glob.has_magic(path):
    files = sorted(glob.glob(path))
    if not files:
      raise ArrowFileError(f"{path}: no file matches")
    return files
  if os.path.isfile(path):
    return [path]
  if not os.path.isdir(path):
    raise ArrowFileError(f"{path}: no such file or folder")
  if os.path.isfile(os.path.join(path, "state.json")):
    return _saved_arrow_files(path)
  dict_file = os.path.join(path, "dataset_dict.json")
  if os.path.isfile(dict_file):
    try:
      with open(dict_file, encoding="utf-8") as f:
        splits = json.load(f)["splits"]
    except (OSError, ValueError, KeyError, TypeError) as err:
      raise ArrowFileError(f"{dict_file}: not a `datasets` split list ({type(err).__name__}: {_one_line(err)})"
                           ) from None
    if split is None or split not in splits:
      wanted = "a split" if split is None else f"split {split!r}"
      raise ArrowFileError(f"{path}: a DatasetDict with splits {', '.join(splits)}; no {wanted} to read "
                           f"(pass the split's folder)")
    return _saved_arrow_files(os.path.join(path, split))
  files = _split_parquet(path, split) if split else []
  if not files:
    raise ArrowFileError(f"{path}: no {split or '<split>'}.jsonl, {split or '<split>'}[-*].parquet or `datasets` "
                         "save_to_disk folder in it")
  return files


def _read_table(pa, file: str):
  try:
    if file.endswith(".arrow"):
      with pa.memory_map(file) as source:
        try:
          return pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:  # `datasets` writes streams; an Arrow file (random-access format) also reads
          return pa.ipc.open_file(source).read_all()
    return pa.parquet.read_table(file)
  except (pa.ArrowException, OSError) as err:
    kind = "an Arrow" if file.endswith(".arrow") else "a parquet"
    raise ArrowFileError(f"{file}: not {kind} file ({_one_line(err)})") from None


def read_rows(path: str | os.PathLike, columns: Sequence[str], split: str | None = None
              ) -> Iterator[tuple[str, dict[str, Any]]]:
  """Yields ("<file>: row <i>", record) per row, i 0-based within its file (as `ds[i]`, `df.iloc[i]`).

  Args:
    path: a source the module docstring lists.
    columns: columns every file must have; the other columns come along in each record.
    split: the split to read from a folder of splits.

  Raises:
    ArrowFileError: at once for a missing source or pyarrow; while iterating, for an unreadable file or one
      without a required column, naming the file.
  """
  files = source_files(path, split)
  pa = _pyarrow()
  return _rows(pa, files, tuple(columns))


def _rows(pa, files: list[str], columns: tuple[str, ...]) -> Iterator[tuple[str, dict[str, Any]]]:
  for file in files:
    table = _read_table(pa, file)
    missing = [c for c in columns if c not in table.column_names]
    if missing:
      raise ArrowFileError(f"{file}: no column {missing[0]!r} (it has: {', '.join(table.column_names) or 'none'})")
    index = 0
    for batch in table.to_batches(max_chunksize=1024):
      for record in batch.to_pylist():
        yield f"{file}: row {index}", record
        index += 1
