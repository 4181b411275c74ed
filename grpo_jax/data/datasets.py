"""GSM8K and MATH as `Example`s, from local files or the `datasets` library.

GSM8K records hold `question` and `answer`, the answer text ending in `#### x`;
MATH records hold `problem` and `solution`, the final answer in the last
`\\boxed{...}`. Local files are JSONL, or what `datasets` writes (parquet
files, `save_to_disk` folders: `arrow_files`). `load_task` picks any task,
synthetic included, by name.
"""

import itertools
import json
import os
import re
from typing import Any, Callable, Iterator, Mapping

from grpo_jax.data import arrow_files
from grpo_jax.data import synthetic
from grpo_jax.data.example import Example
from grpo_jax.data.answer import extract_answer, extract_boxed

_CALCULATOR = re.compile(r"<<[^<>\n]*>>")  # GSM8K calculator annotations, e.g. <<48/2=24>>

HF_SOURCES = {  # name -> (path, config) on the Hugging Face hub
    "gsm8k": ("openai/gsm8k", "main"),
    "math": ("DigitalLearningGmbH/MATH-lighteval", "default"),
}


class DatasetError(ValueError):
  """A dataset file or record that cannot be read; the message names where."""


def _field(record: Any, name: str, where: str) -> str:
  if not isinstance(record, Mapping):
    raise DatasetError(f"{where}: expected a JSON object, got {type(record).__name__}")
  value = record.get(name)
  if not isinstance(value, str):
    problem = "missing" if value is None else f"not a string ({type(value).__name__})"
    raise DatasetError(f"{where}: field {name!r} is {problem}")
  return value


def _extras(record: Mapping[str, Any], source: str, skip: tuple[str, ...]) -> dict[str, Any]:
  extras = {k: v for k, v in record.items() if k not in skip}
  return {"source": source, **extras}


def gsm8k_example(record: Any, where: str = "record", strip_annotations: bool = True) -> Example:
  """Converts one GSM8K record; `where` prefixes error messages.

  The answer is the text after the last `####`, thousands separators removed;
  the solution is the answer text, calculator annotations `<<...>>` removed
  unless `strip_annotations` is False.
  """
  question = _field(record, "question", where)
  solution = _field(record, "answer", where)
  answer = extract_answer(solution)
  if "####" not in solution or answer is None:
    raise DatasetError(f"{where}: field 'answer' has no '#### <answer>' line")
  if strip_annotations:
    solution = _CALCULATOR.sub("", solution)
  return Example(question=question.strip(), answer=answer.replace(",", ""),
                 solution=solution.strip(),
                 metadata=_extras(record, "gsm8k", ("question", "answer")))


def math_example(record: Any, where: str = "record") -> Example:
  """Converts one MATH record: the answer is the last `\\boxed{...}` of the solution."""
  problem = _field(record, "problem", where)
  solution = _field(record, "solution", where)
  answer = extract_boxed(solution)
  if not answer:
    raise DatasetError(f"{where}: field 'solution' has no non-empty \\boxed{{...}} answer")
  return Example(question=problem.strip(), answer=answer, solution=solution.strip(),
                 metadata=_extras(record, "math", ("problem", "solution")))


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
  """Yields ("<path>:<line>", record) per non-blank line, line numbers 1-based.

  Raises:
    DatasetError: at once for a missing file; while iterating, for malformed JSON.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise DatasetError(f"{path}: no such file")
  return _records(path)


def _records(path: str) -> Iterator[tuple[str, Any]]:
  with open(path, "rb") as f:  # bytes, so an undecodable line is reported with its number
    for number, raw in enumerate(f, start=1):
      where = f"{path}:{number}"
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise DatasetError(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise DatasetError(f"{where}: malformed JSON ({e.msg})") from None
      yield where, record


def _load(path, convert: Callable[..., Example], limit: int | None, columns: tuple[str, str],
          split: str | None) -> list[Example]:
  try:
    if arrow_files.is_source(path) or (split and os.path.isdir(path)):
      records = arrow_files.read_rows(path, columns, split)
    else:
      records = read_jsonl(path)
    return [convert(record, where) for where, record in itertools.islice(records, limit)]
  except arrow_files.ArrowFileError as err:
    raise DatasetError(str(err)) from None


def load_gsm8k(path: str | os.PathLike, limit: int | None = None, split: str | None = None) -> list[Example]:
  """Reads GSM8K records (fields `question`, `answer`) from a JSONL file, a parquet file or glob, or a
  `datasets` `save_to_disk` folder (`arrow_files`; `split` picks a split of a folder of splits).

  Raises:
    DatasetError: naming the path and the 1-based line (JSONL) or 0-based row of the first bad record, or
      the file without a needed column.
  """
  return _load(path, gsm8k_example, limit, ("question", "answer"), split)


def load_math(path: str | os.PathLike, limit: int | None = None, split: str | None = None) -> list[Example]:
  """Reads MATH records (fields `problem`, `solution`; `level`, `type` kept as metadata) from the files
  `load_gsm8k` reads.

  Raises:
    DatasetError: as `load_gsm8k`.
  """
  return _load(path, math_example, limit, ("problem", "solution"), split)


def load_hf_dataset(name: str, split: str, limit: int | None = None) -> list[Example]:
  """Loads GSM8K or MATH through the `datasets` library (downloads on first use).

  Args:
    name: "gsm8k" or "math" (sources in `HF_SOURCES`).
    split: "train" or "test".
    limit: keep at most this many examples.

  Raises:
    DatasetError: for an unknown name, a missing `datasets` package, or a bad record.
  """
  if name not in HF_SOURCES:
    raise DatasetError(f"unknown dataset {name!r}; expected one of {sorted(HF_SOURCES)}")
  try:
    # An optional dependency, needed only for a hub download (third-party, no cycle).
    import datasets  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise DatasetError(
        f"loading {name!r} from the hub needs the `datasets` package (pip install datasets); "
        "or pass path= to a local JSONL file") from None
  hub_path, config = HF_SOURCES[name]
  rows = datasets.load_dataset(hub_path, config, split=split)
  convert = gsm8k_example if name == "gsm8k" else math_example
  rows = itertools.islice(rows, limit)
  return [convert(record, f"{hub_path}[{split}][{i}]") for i, record in enumerate(rows)]


def load_task(name: str, split: str, *, path: str | os.PathLike | None = None,
              limit: int | None = None, num_train: int = 10_000, num_test: int = 500,
              seed: int = 0,
              config: synthetic.SyntheticConfig = synthetic.SyntheticConfig()
              ) -> list[Example]:
  """Loads a task's split by name.

  Args:
    name: "synthetic", "gsm8k" or "math".
    split: "train" or "test".
    path: for gsm8k/math, a JSONL or parquet file (or glob), a `save_to_disk`
      folder, or a folder holding `<split>.jsonl`, `<split>[-*].parquet` or
      a `DatasetDict`'s splits; None loads from the hub (`load_hf_dataset`).
    limit: keep at most this many examples (gsm8k/math).
    num_train: synthetic train size.
    num_test: synthetic test size.
    seed: synthetic seed.
    config: synthetic difficulty.

  Returns:
    The examples of the split.
  """
  if split not in ("train", "test"):
    raise DatasetError(f"unknown split {split!r}; expected 'train' or 'test'")
  if name == "synthetic":
    train, test = synthetic.make_splits(num_train, num_test, seed, config)
    return train if split == "train" else test
  loaders = {"gsm8k": load_gsm8k, "math": load_math}
  if name not in loaders:
    raise DatasetError(f"unknown task {name!r}; expected one of ['gsm8k', 'math', 'synthetic']")
  if path is None:
    return load_hf_dataset(name, split, limit)
  if os.path.isdir(path) and not arrow_files.is_source(path):
    jsonl = os.path.join(path, f"{split}.jsonl")
    if os.path.isfile(jsonl) or not arrow_files.has_split(path, split):
      return loaders[name](jsonl, limit)
  return loaders[name](path, limit, split=split)
