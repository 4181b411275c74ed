"""scripts/bench_rollout_peers.py, its Hugging Face path: the stop schedule makes every completion exactly its
scheduled length, ending in EOS; bad workloads are refused in one line. (Its vLLM path needs vLLM's own venv,
`scripts/setup_vllm_cpu.sh`, and is run by hand.)"""

import importlib.util
import json
import math
import pathlib

import pytest
import torch

from grpo_jax import models

_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench_rollout_peers.py"
_spec = importlib.util.spec_from_file_location("bench_rollout_peers", _SCRIPT)
peers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)

EOS = 1
# 3 prompts of unequal lengths x 3 samples; lengths prompt-major, from 1 (EOS at once) to 9.
PROMPTS = [[5, 6], [7, 8, 9, 10, 11], [12, 13, 14]]
LENGTHS = [1, 4, 7, 2, 2, 9, 5, 1, 3]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return models.build_default_checkpoint(tmp_path_factory.mktemp("peers") / "ckpt", seed=0, num_hidden_layers=2,
                                         hidden_size=64, intermediate_size=128)


def write_workload(path, **overrides):
  workload = {"prompts": PROMPTS, "samples_per_prompt": 3, "lengths": LENGTHS, "eos_token_id": EOS, **overrides}
  path.write_text(json.dumps(workload))
  return str(path)


def test_stop_schedule_masks_by_hand():
  # A prompt of width 4 and 2 tokens made: the processor sees the 3rd new token's scores (step 2).
  processor = peers.StopSchedule(torch.tensor([2, 3, 5]), prompt_width=4, eos=EOS)
  scores = torch.arange(12, dtype=torch.float32).reshape(3, 4)
  out = processor(torch.zeros(3, 6, dtype=torch.long), scores)
  inf = math.inf
  assert out.tolist() == [[0.0, 1.0, 2.0, 3.0],       # length 2: done (EOS was its 2nd token), left alone
                          [-inf, 0.0, -inf, -inf],     # length 3: its last token must be EOS
                          [8.0, -inf, 10.0, 11.0]]     # length 5: EOS forbidden
  assert scores[1, 0] == 4.0  # the input is not modified in place


@pytest.mark.parametrize("prompts_per_call", [0, 2])
def test_hf_completions_have_their_scheduled_lengths(checkpoint, tmp_path, prompts_per_call):
  workload = peers.load_workload(write_workload(tmp_path / "w.json"))
  run, facts = peers.hf_engine(str(checkpoint), workload, threads=[1], prompts_per_call=prompts_per_call,
                               pad_token_id=0)
  assert facts["batching"] == ("one generate call of 9 rows" if prompts_per_call == 0 else
                               "2 generate calls of up to 2 prompts x 3 rows")
  for seed in (0, 1):
    completions = run(seed)
    assert [len(c) for c in completions] == LENGTHS
    for tokens in completions:
      assert tokens[-1] == EOS and EOS not in tokens[:-1]


def test_hf_main_reports_useful_tokens(checkpoint, tmp_path, capsys):
  path = write_workload(tmp_path / "w.json")
  peers.main(["--engine=hf", f"--model_dir={checkpoint}", f"--workload={path}", "--repeats=2", "--threads=1"])
  report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert report["engine"] == "hf" and report["threads"] == "torch 1"
  assert (report["completions"], report["useful_tokens"], report["max_length"]) == (9, sum(LENGTHS), 9)
  assert len(report["seconds"]) == 2 and report["lengths_checked"]
  rates = [sum(LENGTHS) / s for s in report["seconds"]]  # the mean of the per-repeat rates, rounded
  assert report["tok_per_s_mean"] == pytest.approx(sum(rates) / 2, rel=1e-3)


def test_hf_keeps_the_fastest_thread_count(checkpoint, tmp_path, capsys):
  path = write_workload(tmp_path / "w.json")
  peers.main(["--engine=hf", f"--model_dir={checkpoint}", f"--workload={path}", "--repeats=1", "--threads=1,2"])
  report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  tried = report["threads_tried_s"]
  assert set(tried) == {"1", "2"} and report["threads"] == f"torch {min(tried, key=tried.get)}"


@pytest.mark.parametrize("engine,threads,message", [
    ("hf", "1,x", "--threads must be an int >= 0 or several separated by commas, got '1,x'"),
    ("hf", "-1", "--threads must be an int >= 0 or several separated by commas, got '-1'"),
    ("vllm", "1,2", "--threads must be an int >= 0, got '1,2'"),
])
def test_bad_threads_are_one_line(tmp_path, engine, threads, message):
  path = write_workload(tmp_path / "w.json")
  with pytest.raises(SystemExit) as err:
    peers.main([f"--engine={engine}", f"--model_dir={tmp_path}", f"--workload={path}", f"--threads={threads}"])
  assert str(err.value) == f"bench_rollout_peers: {message}"


def test_a_wrong_length_is_refused():
  with pytest.raises(SystemExit, match="hf: completion 1 made 2 tokens, its schedule says 3"):
    peers.check_lengths("hf", [[4, 1], [4, 1], [4, 4, 1]], [2, 3, 3])


@pytest.mark.parametrize("overrides,message", [
    ({"lengths": LENGTHS[:-1]}, "lengths must hold prompts x samples_per_prompt = 9 ints"),
    ({"lengths": [0] + LENGTHS[1:]}, "lengths[0] must be a positive int, got 0"),
    ({"prompts": [[5, 6], [], [12]]}, "prompts[1] must be a non-empty list of non-negative ints"),
    ({"samples_per_prompt": 0}, "samples_per_prompt must be a positive int, got 0"),
    ({"prompts": [[5, EOS], [7], [12]]}, f"a prompt holds eos_token_id {EOS}"),
])
def test_bad_workloads_are_one_line(tmp_path, overrides, message):
  path = write_workload(tmp_path / "w.json", **overrides)
  with pytest.raises(SystemExit) as err:
    peers.load_workload(path)
  assert str(err.value) == f"bench_rollout_peers: --workload={path}: {message}"


def test_missing_fields_and_unreadable_files_are_one_line(tmp_path):
  path = tmp_path / "w.json"
  path.write_text(json.dumps({"prompts": PROMPTS}))
  with pytest.raises(SystemExit) as err:
    peers.load_workload(str(path))
  assert str(err.value).endswith("missing samples_per_prompt, lengths, eos_token_id")
  path.write_text("{not json")
  with pytest.raises(SystemExit) as err:
    peers.load_workload(str(path))
  assert str(err.value).startswith(f"bench_rollout_peers: --workload={path}: cannot read it as JSON")


def test_token_ids_beyond_the_vocabulary_are_refused(checkpoint, tmp_path):
  path = write_workload(tmp_path / "w.json", prompts=[[5, 6], [7, 500], [12]])
  with pytest.raises(SystemExit) as err:
    peers.main(["--engine=hf", f"--model_dir={checkpoint}", f"--workload={path}"])
  assert "--workload holds token id 500" in str(err.value) and "a vocabulary of 101" in str(err.value)
