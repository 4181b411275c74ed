"""Tests for grpo_jax.data.datasets: JSONL loaders, their errors, the hub path and load_task."""

import json
import sys
import types

import pytest

from grpo_jax.data import datasets as ds
from grpo_jax.data.datasets import DatasetError, load_gsm8k, load_hf_dataset, load_math, load_task

GSM8K_RECORD = {
    "question": "Natalia sold clips to 48 friends in April, and half as many in May. How many?",
    "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72\n#### 1,072",
}
MATH_RECORD = {
    "problem": "What is $\\frac{1}{2}+\\frac{1}{4}$?",
    "solution": "We get $\\boxed{1}$ wrong first; then $\\boxed{\\frac{3}{4}}$.",
    "level": "Level 1", "type": "Algebra",
}


def _write(tmp_path, lines, name="data.jsonl"):
  path = tmp_path / name
  path.write_text("\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n")
  return path


def test_load_gsm8k(tmp_path):
  path = _write(tmp_path, [GSM8K_RECORD, "", "   ", GSM8K_RECORD])
  examples = load_gsm8k(path)
  assert len(examples) == 2
  e = examples[0]
  assert e.answer == "1072"
  assert e.question == GSM8K_RECORD["question"]
  assert e.solution == "In May she sold 48/2 = 24 clips.\n48+24 = 72\n#### 1,072"
  assert e.metadata["source"] == "gsm8k"
  assert load_gsm8k(path, limit=1) == examples[:1]
  assert "<<48/2=24>>" in ds.gsm8k_example(GSM8K_RECORD, strip_annotations=False).solution


def test_load_math(tmp_path):
  (e,) = load_math(_write(tmp_path, [MATH_RECORD]))
  assert e.answer == "\\frac{3}{4}"  # the last box, nested braces whole
  assert e.solution == MATH_RECORD["solution"]
  assert e.metadata["level"] == "Level 1" and e.metadata["source"] == "math"


@pytest.mark.parametrize("loader, lines, line_no, message", [
    (load_gsm8k, [GSM8K_RECORD, "{not json"], 2, "malformed JSON"),
    (load_gsm8k, [GSM8K_RECORD, "", "[1, 2]"], 3, "expected a JSON object, got list"),
    (load_gsm8k, ['"a string"'], 1, "expected a JSON object, got str"),
    (load_gsm8k, [{"question": "q"}], 1, "field 'answer' is missing"),
    (load_gsm8k, [{"question": 3, "answer": "#### 3"}], 1, r"field 'question' is not a string"),
    (load_gsm8k, [{"question": "q", "answer": "no marker 5"}], 1, "no '#### <answer>' line"),
    (load_gsm8k, [{"question": "q", "answer": "#### "}], 1, "no '#### <answer>' line"),
    (load_math, [MATH_RECORD, {"problem": "p"}], 2, "field 'solution' is missing"),
    (load_math, [{"problem": "p", "solution": "no box"}], 1, "no non-empty \\\\boxed"),
    (load_math, [{"problem": "p", "solution": "\\boxed{}"}], 1, "no non-empty \\\\boxed"),
    (load_math, [{"problem": "p", "solution": "\\boxed{1"}], 1, "no non-empty \\\\boxed"),
])
def test_errors_name_file_and_line(tmp_path, loader, lines, line_no, message):
  path = _write(tmp_path, lines)
  with pytest.raises(DatasetError, match=message) as info:
    loader(path)
  assert str(info.value).startswith(f"{path}:{line_no}: ")
  assert "\n" not in str(info.value)


def test_missing_file_names_path(tmp_path):
  path = tmp_path / "nope.jsonl"
  with pytest.raises(DatasetError, match="no such file") as info:
    load_gsm8k(path, limit=0)
  assert str(path) in str(info.value)
  assert issubclass(DatasetError, ValueError)


def test_load_task(tmp_path):
  _write(tmp_path, [GSM8K_RECORD], "train.jsonl")
  _write(tmp_path, [GSM8K_RECORD, GSM8K_RECORD], "test.jsonl")
  assert len(load_task("gsm8k", "test", path=tmp_path)) == 2
  assert len(load_task("gsm8k", "train", path=tmp_path / "test.jsonl", limit=1)) == 1
  math_path = _write(tmp_path, [MATH_RECORD], "math.jsonl")
  assert load_task("math", "test", path=math_path)[0].answer == "\\frac{3}{4}"
  train = load_task("synthetic", "train", num_train=50, num_test=10, seed=1)
  test = load_task("synthetic", "test", num_train=50, num_test=10, seed=1)
  assert len(train) == 50 and len(test) == 10
  assert not {e.question for e in train} & {e.question for e in test}
  with pytest.raises(DatasetError, match="unknown task 'svamp'"):
    load_task("svamp", "test", path=tmp_path)
  with pytest.raises(DatasetError, match="unknown split 'dev'"):
    load_task("gsm8k", "dev", path=tmp_path)


def test_hf_missing_package_is_clear(monkeypatch):
  monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
  with pytest.raises(DatasetError, match="needs the `datasets` package"):
    load_hf_dataset("gsm8k", "test")
  with pytest.raises(DatasetError, match="unknown dataset 'svamp'"):
    load_hf_dataset("svamp", "test")


def test_hf_converts_rows_without_network(monkeypatch):
  calls = []

  def load_dataset(path, name, split):
    calls.append((path, name, split))
    return [GSM8K_RECORD, GSM8K_RECORD, {"question": "q"}] if "gsm8k" in path else [MATH_RECORD]

  monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
  assert [e.answer for e in load_hf_dataset("gsm8k", "train", limit=2)] == ["1072", "1072"]
  assert load_task("math", "test")[0].answer == "\\frac{3}{4}"  # no path: the hub
  with pytest.raises(DatasetError, match=r"openai/gsm8k\[test\]\[2\]: field 'answer' is missing"):
    load_hf_dataset("gsm8k", "test")
  assert calls[0] == ("openai/gsm8k", "main", "train")


def test_non_utf8_line_names_file_and_line(tmp_path):
  path = tmp_path / "latin1.jsonl"
  good = json.dumps(GSM8K_RECORD).encode()
  path.write_bytes(good + b"\n" + '{"question": "caf\u00e9", "answer": "#### 1"}'.encode("latin-1") + b"\n")
  with pytest.raises(DatasetError, match="not UTF-8 text") as info:
    load_gsm8k(path)
  assert str(info.value).startswith(f"{path}:2: ") and "0xe9" in str(info.value)
