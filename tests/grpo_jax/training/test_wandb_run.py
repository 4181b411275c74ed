"""Tests for grpo_jax.training.wandb_run (W&B beside JSONL and TensorBoard), in offline mode: the offline run's
file is read back (metrics under the JSONL's names and steps, the config), a resumed run keeps its id, one-line
errors; and the runner end to end (`--wandb_project --wandb_mode=offline`, stopped, then `--resume`)."""

import json
import math
import pathlib
import struct
import sys
import time

from absl import flags
import pytest

from experiments import cli
from experiments import train_reward_model
from experiments.runner import logs
from experiments.runner import preemption
from grpo_jax import models
from experiments.runner import config as config_lib
from grpo_jax.training import MetricsLogger, wandb_run

import wandb
from wandb.proto import wandb_internal_pb2 as wandb_pb
from tests.conftest import run_grpo_math

_BLOCK, _HEADER = 32768, 7  # the record log W&B writes (LevelDB's log format): 32 KiB blocks, 7-byte headers


def _records(data: bytes) -> list[bytes]:
  assert data[:4] == b":W&B"
  pos, pending, records = _HEADER, b"", []
  while pos + _HEADER <= len(data):
    if _BLOCK - pos % _BLOCK < _HEADER:  # a block's tail too short for a header is padding
      pos += _BLOCK - pos % _BLOCK
      continue
    _, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
    chunk, pos = data[pos + _HEADER:pos + _HEADER + length], pos + _HEADER + length
    if kind in (1, 4):  # a whole record, or the last piece of one
      records.append(pending + chunk)
      pending = b""
    elif kind in (2, 3):  # the first or a middle piece
      pending += chunk
  return records


def read_offline_run(run_dir: pathlib.Path) -> tuple[str, dict, list[dict]]:
  """(run id, config, history rows) of a finished offline run directory, from its `run-<id>.wandb` record log
  (W&B's service process writes it: read once it holds the run's exit record)."""
  (path,) = run_dir.glob("run-*.wandb")
  deadline = time.monotonic() + 60
  while True:
    parsed = []
    for raw in _records(path.read_bytes()):
      parsed.append(wandb_pb.Record())
      parsed[-1].ParseFromString(raw)
    if any(r.WhichOneof("record_type") == "exit" for r in parsed) or time.monotonic() > deadline:
      break
    time.sleep(0.2)
  run_id, config, history = None, {}, []
  for record in parsed:
    kind = record.WhichOneof("record_type")
    if kind == "run":
      run_id = record.run.run_id
    elif kind == "config":
      config.update({item.key: json.loads(item.value_json) for item in record.config.update})
    elif kind == "history":
      row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
      history.append({k: v for k, v in row.items() if not k.startswith("_")})  # W&B's own _step, _runtime, ...
  return run_id, config, history


def _as_jsonl(history: list[dict]) -> list[dict]:
  """W&B's rows as `metrics.jsonl` writes them (non-finite numbers as strings), without its `time`."""
  return [{k: v if math.isfinite(v) else str(v) for k, v in row.items()} for row in history]


def _jsonl(work_dir: pathlib.Path) -> list[dict]:
  records = [json.loads(line) for line in (work_dir / "metrics.jsonl").read_text().splitlines()]
  return [{k: v for k, v in r.items() if k != "time"} for r in records]


def _offline_dirs(work_dir: pathlib.Path) -> list[pathlib.Path]:
  return sorted((work_dir / "wandb").glob("offline-run-*"))


def test_offline_run_holds_metrics_and_config(tmp_path):
  config = {"learning_rate": 3e-4, "algo": "grpo", "group_size": 8, "epsilon_high": None}
  run = wandb_run.start(tmp_path, "grpo-test", config, mode="offline", name="tiny")
  logger = MetricsLogger(tmp_path, 2, tensorboard=False, wandb_run=run)
  logger.log(0, {"accuracy": 0.25}, prefix="eval/")
  logger.log(1, {"loss": 1.5, "reward_mean": 0.5}, prefix="train/")
  logger.log(2, {"loss": 0.75, "reward_mean": 1.0}, prefix="train/")
  logger.close()
  run_id = (tmp_path / wandb_run.RUN_ID_FILE).read_text().strip()
  (run_dir,) = _offline_dirs(tmp_path)
  got_id, got_config, history = read_offline_run(run_dir)
  assert got_id == run_id and run_dir.name.endswith(run_id)
  assert {k: got_config[k] for k in config} == config
  assert _as_jsonl(history) == _jsonl(tmp_path)  # the same names, values and steps
  assert history[1] == {"step": 1, "train/loss": 1.5, "train/reward_mean": 0.5}


def test_resume_continues_the_same_run(tmp_path):
  first = wandb_run.start(tmp_path, "grpo-test", {"steps": 4}, mode="offline")
  first_id = first.id
  MetricsLogger(tmp_path, 4, tensorboard=False, wandb_run=first).close()
  resumed = wandb_run.start(tmp_path, "grpo-test", {"steps": 8}, resume=True, mode="offline")
  assert resumed.id == first_id
  logger = MetricsLogger(tmp_path, 8, tensorboard=False, wandb_run=resumed)
  logger.log(5, {"loss": 0.5}, prefix="train/")
  logger.close()
  ids = [read_offline_run(d)[0] for d in _offline_dirs(tmp_path)]
  assert ids == [first_id, first_id]  # `wandb sync` uploads both into the one run
  assert read_offline_run(_offline_dirs(tmp_path)[1])[1]["steps"] == 8  # a value --resume may change
  fresh = wandb_run.start(tmp_path, "grpo-test", {}, mode="offline")  # not resuming: a new run
  fresh.finish()
  assert fresh.id != first_id and (tmp_path / wandb_run.RUN_ID_FILE).read_text().strip() == fresh.id


def test_run_id_file(tmp_path):
  ids = iter(["a1", "b2"])
  assert wandb_run.run_id(tmp_path, True, lambda: next(ids)) == "a1"  # resuming without a stored id: a new one
  assert wandb_run.run_id(tmp_path, True, lambda: next(ids)) == "a1"
  assert wandb_run.run_id(tmp_path, False, lambda: next(ids)) == "b2"


def test_errors_are_one_line(tmp_path, monkeypatch):
  with pytest.raises(ValueError, match=r"^W&B mode must be one of online, offline, disabled, not 'cloud'$"):
    wandb_run.start(tmp_path, "p", {}, mode="cloud")
  for fields, message in [({"wandb_mode": "offline"}, "need --wandb_project"),
                          ({"wandb_run_name": "x"}, "need --wandb_project"),
                          ({"wandb_project": "p", "wandb_mode": "cloud"}, "--wandb_mode must be online, offline")]:
    with pytest.raises(config_lib.ConfigError, match=message):
      config_lib.Config().replace(**fields)
  def no_login(**kwargs):
    raise wandb.errors.UsageError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])\nmore")

  monkeypatch.setattr(wandb, "init", no_login)
  with pytest.raises(wandb_run.StartError) as info:
    wandb_run.start(tmp_path, "p", {}, mode="online")
  cause = "UsageError: api_key not configured (no-tty). call wandb.login(key=[your_api_key])"
  assert info.value.cause == cause and isinstance(info.value, ValueError)
  assert str(info.value) == (f"W&B could not start the run ({cause}); log in (wandb login), or log offline "
                             "(mode=\"offline\") and upload later with `wandb sync`")  # the library's words, no flag
  # the runner names its flag (issue 54: the library did): the one line a user sees is the runner's
  run = config_lib.Config().replace(wandb_project="p", wandb_mode="online").run
  with pytest.raises(config_lib.RunError) as info:
    logs.start(tmp_path, run, {}, 2)
  assert str(info.value) == (f"W&B could not start the run ({cause}); log in (wandb login), or log offline with "
                             "--wandb_mode=offline and upload later with `wandb sync`")
  monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` fail
  with pytest.raises(wandb_run.NotInstalledError) as info:
    wandb_run.start(tmp_path, "p", {}, mode="offline")
  assert str(info.value).startswith("W&B logging needs wandb, which is not installed (")
  assert str(info.value).endswith("): pip install 'grpo_jax[wandb]'") and "\n" not in str(info.value)
  with pytest.raises(config_lib.RunError) as info:
    logs.check(tmp_path, run)
  assert str(info.value).endswith("): pip install 'grpo_jax[wandb]', or leave --wandb_project empty")
  (tmp_path / wandb_run.RUN_ID_FILE).unlink()  # written by the failed online start
  with pytest.raises(ValueError):
    wandb_run.start(tmp_path, "p", {}, mode="offline")
  assert not (tmp_path / wandb_run.RUN_ID_FILE).exists()  # the package is checked first


TINY = ["--max_prompt_len=16", "--max_new_tokens=8", "--num_train=64", "--num_test=4", "--batch_size=2",
        "--group_size=2", "--eval_batch_size=4", "--tensorboard=false", "--tiny_layers=1", "--tiny_hidden_size=32",
        "--sft_steps=0", "--steps=2", "--eval_every=0", "--wandb_project=grpo-test", "--wandb_mode=offline"]


def _run(work_dir, *args):
  return run_grpo_math(f"--work_dir={work_dir}", *TINY, *args)


def test_runner_logs_to_wandb_and_resume_continues_the_run(tmp_path):
  assert _run(tmp_path, "--stop_after=1") == {}
  summary = _run(tmp_path, "--resume")
  first, second = _offline_dirs(tmp_path)
  (id1, config1, history1), (id2, config2, history2) = read_offline_run(first), read_offline_run(second)
  assert id1 == id2 == (tmp_path / wandb_run.RUN_ID_FILE).read_text().strip()
  recorded = json.loads(json.dumps(summary["config"]))  # the whole config, as the summary records it
  assert {k: config1[k] for k in recorded} == recorded | {"resume": False, "stop_after": 1}
  assert config1["steps"] == 2 and config1["wandb_project"] == "grpo-test"
  assert config2["resume"] is True
  steps = [(row["step"], sorted(k for k in row if k != "step")) for row in history1 + history2]
  assert [s for s, _ in steps] == [0, 1, 2, 2]  # start eval, step 1 | step 2, final eval
  assert "train/loss" in steps[1][1] and "eval/accuracy" in steps[0][1] and "eval/accuracy" in steps[3][1]


def test_reward_model_runner_logs_to_wandb(tmp_path):
  policy = models.build_default_checkpoint(tmp_path / "policy", num_hidden_layers=1, hidden_size=32,
                                           intermediate_size=64)
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["train_reward_model", f"--policy={policy}", f"--rm_dir={tmp_path / 'rm'}", "--rm_kind=orm",
               "--rm_steps=2", "--max_prompt_len=16", "--max_new_tokens=8", "--num_train=40", "--num_test=8",
               "--sft_examples=0", "--tensorboard=false", "--rm_prompts=4", "--rm_eval_prompts=4",
               "--rm_samples_per_prompt=2", "--rm_sample_batch=4", "--rm_batch_size=8", "--rm_eval_every=2",
               "--wandb_project=grpo-test", "--wandb_mode=offline"])
  try:
    train_reward_model.run(*train_reward_model.config_from_flags())
  finally:
    flags.FLAGS.unparse_flags()
  (run_dir,) = _offline_dirs(tmp_path / "rm")
  _, config, history = read_offline_run(run_dir)
  assert config["rm_kind"] == "orm" and config["rm_steps"] == 2 and config["wandb_project"] == "grpo-test"
  assert history and _as_jsonl(history) == _jsonl(tmp_path / "rm")  # NaN AUCs (one class) included


class _StopAfterFirstCheck:
  """`preemption.StopSignals` as if SIGINT came during the first logged training step (not while sampling)."""
  signum = 2

  def __init__(self):
    self.calls = 0

  def stop_requested(self):
    self.calls += 1
    return self.calls > 1


def test_reward_model_runner_resumed_continues_the_same_wandb_run(tmp_path):
  """REVIEW B1: a resumed reward-model run logs to the W&B run it started (its id kept), not to a new one, and its
  steps continue the first run's."""
  policy = models.build_default_checkpoint(tmp_path / "policy", num_hidden_layers=1, hidden_size=32,
                                           intermediate_size=64)
  argv = ["train_reward_model", f"--policy={policy}", f"--rm_dir={tmp_path / 'rm'}", "--rm_kind=orm",
          "--rm_steps=12", "--save_every=10", "--max_prompt_len=16", "--max_new_tokens=8", "--num_train=40",
          "--num_test=8", "--sft_examples=0", "--tensorboard=false", "--rm_prompts=4", "--rm_eval_prompts=4",
          "--rm_samples_per_prompt=2", "--rm_sample_batch=4", "--rm_batch_size=8", "--rm_eval_every=100",
          "--wandb_project=grpo-test", "--wandb_mode=offline"]
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(argv)
    with pytest.raises(preemption.Interrupted):
      train_reward_model.run(*train_reward_model.config_from_flags(), signals=_StopAfterFirstCheck())
    first_id = (tmp_path / "rm" / wandb_run.RUN_ID_FILE).read_text().strip()
    flags.FLAGS.unparse_flags()
    flags.FLAGS([*argv, "--resume"])
    train_reward_model.run(*train_reward_model.config_from_flags())
  finally:
    flags.FLAGS.unparse_flags()
  assert (tmp_path / "rm" / wandb_run.RUN_ID_FILE).read_text().strip() == first_id
  (id1, _, history1), (id2, config2, history2) = (read_offline_run(d) for d in _offline_dirs(tmp_path / "rm"))
  assert id1 == id2 == first_id and config2["resume"] is True
  # The step counter continues: the first run logged the start evaluation and step 10 (saved there, then stopped),
  # the resumed one steps 11-12 and the final evaluation; together they are metrics.jsonl's records.
  steps = [(row["step"], "eval/outcome/accuracy" in row) for row in history1 + history2]
  assert steps == [(0, True), (10, False), (12, False), (12, True)], steps
  assert _as_jsonl(history1 + history2) == _jsonl(tmp_path / "rm")


def test_a_damaged_run_id_file_is_named_before_the_run_writes(tmp_path, main_in_process):
  """A resumed run whose wandb_run_id holds no id stops with one line naming the file; config.json is untouched."""
  assert _run(tmp_path, "--stop_after=1") == {}
  config = (tmp_path / "config.json").read_bytes()
  for damage in (b"\xff\xfe", b"id with spaces\n", b"a/b"):
    (tmp_path / wandb_run.RUN_ID_FILE).write_bytes(damage)
    error = main_in_process(cli.main_for("grpo_math"), ["grpo_math", f"--work_dir={tmp_path}", *TINY, "--resume"])
    assert error.startswith(f"grpo_math: error: {tmp_path / wandb_run.RUN_ID_FILE}: "), error
    assert "\n" not in error and (tmp_path / "config.json").read_bytes() == config
  assert len(_offline_dirs(tmp_path)) == 1


def test_stored_run_id(tmp_path):
  assert wandb_run.stored_run_id(tmp_path) is None
  (tmp_path / wandb_run.RUN_ID_FILE).write_text("\n")
  assert wandb_run.stored_run_id(tmp_path) is None  # empty: a new run
  (tmp_path / wandb_run.RUN_ID_FILE).write_text("ab12cd34\n")
  assert wandb_run.stored_run_id(tmp_path) == "ab12cd34"
  (tmp_path / wandb_run.RUN_ID_FILE).write_bytes(b"\xff")
  with pytest.raises(ValueError, match="wandb_run_id: cannot read the W&B run id"):
    wandb_run.run_id(tmp_path, True)
  assert wandb_run.run_id(tmp_path, False, lambda: "fresh") == "fresh"  # a new run does not read it
