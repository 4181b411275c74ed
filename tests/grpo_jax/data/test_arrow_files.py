"""Tests for grpo_jax.data.arrow_files: GSM8K/MATH from `datasets` save_to_disk folders and parquet files, read
back through the loaders (load_gsm8k, load_math, load_task) with the JSONL loaders' one-line errors."""

import sys

import datasets
import pytest

from grpo_jax.data import arrow_files
from grpo_jax.data.datasets import DatasetError, load_gsm8k, load_math, load_task

GSM8K = {
    "question": ["Tom has 3 apples and buys 4. How many?", "A pen costs $2. Cost of 1,000 pens?"],
    "answer": ["3+4 = <<3+4=7>>7\n#### 7", "2*1000 = <<2*1000=2000>>2000\n#### 2,000"],
}
MATH = {
    "problem": ["What is $\\frac{1}{2}+\\frac{1}{4}$?", "Solve $x+1=3$."],
    "solution": ["It is $\\boxed{\\frac{3}{4}}$.", "So $x=\\boxed{2}$."],
    "level": ["Level 1", "Level 2"], "type": ["Algebra", "Prealgebra"],
}


def test_save_to_disk_folder(tmp_path):
  datasets.Dataset.from_dict(GSM8K).save_to_disk(str(tmp_path / "gsm8k"))
  examples = load_gsm8k(tmp_path / "gsm8k")
  assert [e.answer for e in examples] == ["7", "2000"]
  assert examples[0].solution == "3+4 = 7\n#### 7"  # calculator annotations dropped, as from JSONL
  assert examples[1].question == GSM8K["question"][1]
  assert load_gsm8k(tmp_path / "gsm8k", limit=1) == examples[:1]
  assert load_gsm8k(tmp_path / "gsm8k" / "data-00000-of-00001.arrow") == examples  # its one data file
  assert load_task("gsm8k", "test", path=tmp_path / "gsm8k") == examples  # one Dataset: whatever the split


def test_dataset_dict_folder_picks_the_split(tmp_path):
  splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict(MATH),
                                 "test": datasets.Dataset.from_dict({k: v[1:] for k, v in MATH.items()})})
  splits.save_to_disk(str(tmp_path / "math"))
  train = load_task("math", "train", path=tmp_path / "math")
  test = load_task("math", "test", path=tmp_path / "math")
  assert [e.answer for e in train] == ["\\frac{3}{4}", "2"] and [e.answer for e in test] == ["2"]
  assert train[1].metadata == {"source": "math", "level": "Level 2", "type": "Prealgebra"}
  with pytest.raises(DatasetError, match=r"a DatasetDict with splits train, test; no a split to read"):
    load_math(tmp_path / "math")
  assert [e.answer for e in load_math(tmp_path / "math" / "test")] == ["2"]  # the split's own folder


def test_parquet_file_glob_and_hub_layout(tmp_path):
  datasets.Dataset.from_dict(MATH).to_parquet(str(tmp_path / "math.parquet"))
  assert [e.answer for e in load_math(tmp_path / "math.parquet")] == ["\\frac{3}{4}", "2"]
  hub = tmp_path / "gsm8k" / "main"  # openai/gsm8k's layout: main/{train,test}-00000-of-00001.parquet
  hub.mkdir(parents=True)
  for i in range(2):  # two shards of the train split, one row each
    datasets.Dataset.from_dict({k: v[i:i + 1] for k, v in GSM8K.items()}).to_parquet(
        str(hub / f"train-0000{i}-of-00002.parquet"))
  datasets.Dataset.from_dict({k: v[:1] for k, v in GSM8K.items()}).to_parquet(str(hub / "test-00000-of-00001.parquet"))
  assert [e.answer for e in load_task("gsm8k", "train", path=hub)] == ["7", "2000"]  # shards in order
  assert [e.answer for e in load_task("gsm8k", "test", path=hub)] == ["7"]
  assert [e.answer for e in load_gsm8k(str(hub / "train-*.parquet"))] == ["7", "2000"]
  data = tmp_path / "lighteval" / "data"  # MATH-lighteval's layout: data/train-00000-of-00001.parquet
  data.mkdir(parents=True)
  datasets.Dataset.from_dict(MATH).to_parquet(str(data / "train-00000-of-00001.parquet"))
  assert len(load_task("math", "train", path=tmp_path / "lighteval")) == 2
  (tmp_path / "both").mkdir()  # a JSONL split beside parquet ones: the JSONL, as before
  (tmp_path / "both" / "train.jsonl").write_text(
      '{"question": "q", "answer": "#### 5"}\n')
  datasets.Dataset.from_dict(GSM8K).to_parquet(str(tmp_path / "both" / "train.parquet"))
  assert [e.answer for e in load_task("gsm8k", "train", path=tmp_path / "both")] == ["5"]


def _bad(tmp_path, columns: dict, kind: str):
  if kind == "parquet":
    path = tmp_path / "bad.parquet"
    datasets.Dataset.from_dict(columns).to_parquet(str(path))
    return path, str(path)
  datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "bad"))
  return tmp_path / "bad", str(tmp_path / "bad" / "data-00000-of-00001.arrow")


@pytest.mark.parametrize("kind", ["parquet", "save_to_disk"])
@pytest.mark.parametrize("loader, columns, message", [
    (load_gsm8k, {"question": ["q"]}, "no column 'answer' (it has: question)"),
    (load_gsm8k, {"question": ["q", None], "answer": ["#### 1", "#### 2"]}, "row 1: field 'question' is missing"),
    (load_gsm8k, {"question": ["q", "r"], "answer": ["#### 1", "2"]}, "row 1: field 'answer' has no '#### <answer>'"),
    (load_gsm8k, {"question": [3], "answer": ["#### 3"]}, "row 0: field 'question' is not a string (int)"),
    (load_math, {"problem": ["p"], "answer": ["1"]}, "no column 'solution' (it has: problem, answer)"),
    (load_math, {"problem": ["p"], "solution": ["no box"]}, "row 0: field 'solution' has no non-empty \\boxed"),
])
def test_errors_name_file_and_row(tmp_path, kind, loader, columns, message):
  path, file = _bad(tmp_path, columns, kind)
  with pytest.raises(DatasetError) as info:
    loader(path)
  text = str(info.value)
  assert text.startswith(f"{file}: ") and message in text and "\n" not in text


def test_unreadable_sources_are_one_line(tmp_path):
  corrupt = tmp_path / "corrupt.parquet"
  corrupt.write_bytes(b"not parquet at all\n" * 10)
  cases = [(corrupt, f"{corrupt}: not a parquet file ("),
           (tmp_path / "none-*.parquet", "none-*.parquet: no file matches"),
           (tmp_path / "missing.parquet", "missing.parquet: no such file or folder")]
  (tmp_path / "broken").mkdir()
  (tmp_path / "broken" / "state.json").write_text("{}")
  cases.append((tmp_path / "broken", "state.json: not a `datasets` state file (KeyError"))
  for path, message in cases:
    with pytest.raises(DatasetError) as info:
      load_gsm8k(path)
    assert message in str(info.value) and "\n" not in str(info.value), (path, str(info.value))
  (tmp_path / "empty").mkdir()
  with pytest.raises(DatasetError, match=r"empty/train.jsonl: no such file"):
    load_task("gsm8k", "train", path=tmp_path / "empty")


def test_missing_pyarrow_is_one_line(tmp_path, monkeypatch):
  datasets.Dataset.from_dict(GSM8K).to_parquet(str(tmp_path / "g.parquet"))
  monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow` fail
  with pytest.raises(DatasetError, match=r"needs pyarrow, which is not installed .*pip install 'grpo_jax\[hf\]'"):
    load_gsm8k(tmp_path / "g.parquet")


def test_is_source():
  assert arrow_files.is_source("a/train.parquet") and arrow_files.is_source("a/train-*.parquet")
  assert arrow_files.is_source("a/data-00000-of-00001.arrow") and not arrow_files.is_source("a/train.jsonl")
