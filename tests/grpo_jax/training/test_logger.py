"""training.MetricsLogger: metrics.jsonl rewinds to a checkpoint; an error starts on a line of its own; no
tensorboardX is one line."""

import json
import sys

import pytest

from grpo_jax import training
from grpo_jax.training import logger as logger_lib


def _steps(path):
  return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_rewind_drops_what_was_logged_after_the_offset(tmp_path):
  log = training.MetricsLogger(tmp_path, 4, tensorboard=False)
  log.log(0, {"eval/accuracy": 0.5})
  log.log(1, {"loss": 1.0})
  offset = log.offset()  # saved with the checkpoint of step 1
  log.log(2, {"loss": 2.0})
  log.log(3, {"loss": 3.0})  # then the run is killed
  log.close()
  resumed = training.MetricsLogger(tmp_path, 4, tensorboard=False)  # appends, as a resumed run does
  assert resumed.rewind(offset) == 2
  assert resumed.rewind(offset) == 0 and resumed.rewind(None) == 0
  resumed.log(2, {"loss": 2.5})
  resumed.close()
  assert _steps(tmp_path / "metrics.jsonl") == [0, 1, 2]
  assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["loss"] == 2.5


def test_an_open_progress_bar_is_ended_once(tmp_path, capsys):
  log = training.MetricsLogger(tmp_path, 10, tensorboard=False)
  log.progress(1, "loss 1.0")
  training.end_progress_line()
  training.end_progress_line()  # nothing open: nothing written
  err = capsys.readouterr().err
  assert err.startswith("\r[") and err.endswith("\n") and err.count("\n") == 1
  log.newline()  # after the line was ended: no blank line
  assert capsys.readouterr().err == ""
  assert not logger_lib._open_line
  log.close()


def test_tensorboard_without_tensorboardx_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorboardX", None)  # `import tensorboardX` now raises ImportError
  with pytest.raises(ValueError, match=r"^tensorboard event files need tensorboardX, which is not installed") as err:
    training.MetricsLogger(tmp_path / "run", 4, tensorboard=True)
  assert "\n" not in str(err.value) and "pip install 'tensorboardX>=2.6'" in str(err.value)
  assert not (tmp_path / "run").exists()
