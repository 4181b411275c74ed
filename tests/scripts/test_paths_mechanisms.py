"""scripts/paths_mechanisms.py: the runs it plans, its statistics on hand-made inputs, its refusals (the measurement
itself takes tens of minutes and is run by hand; docs/train.md gives its figures)."""

import argparse
import importlib.util
import math
import pathlib

import numpy as np
import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("paths_mechanisms", _ROOT / "scripts" / "paths_mechanisms.py")
pm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pm)

A, B, C, D = ((2, "*", 3),), ((3, "*", 4),), ((5, "+", 6),), ((7, "+", 8),)


def _args(tmp_path, **kw):
  base = dict(out_dir=str(tmp_path), seeds=2, sft_examples=10000, sft_steps=1500, rl_steps=20, batch_size=16,
              group_size=8, learning_rate=1e-4, temperature=0.7, num_test=200, problems=100, samples=16, chain=True)
  return argparse.Namespace(**{**base, **kw})


def test_the_plan_starts_every_rl_seed_from_the_one_sft_policy_on_the_flagfiles_task(tmp_path):
  runs = {r.name: r for r in pm.plan(_args(tmp_path))}
  assert list(runs) == ["sft", "grpo/seed0", "grpo/seed1", "sft_chain"]
  sft_policy = str(tmp_path.resolve() / "sft" / "sft_policy")
  for s in (0, 1):
    flags = runs[f"grpo/seed{s}"].flags
    assert flags["init_checkpoint"] == sft_policy and flags["seed"] == s and flags["algo"] == "grpo"
    assert (flags["steps"], flags["batch_size"], flags["group_size"], flags["temperature"]) == (20, 16, 8, 0.7)
    assert runs[f"grpo/seed{s}"].needs == ("sft",)
  assert runs["sft"].flags["steps"] == 0 and runs["sft"].flags["sft_steps"] == 1500
  assert "task" not in runs["sft_chain"].flags  # the default chain task
  # the paths task's flags are the flagfile's
  cfg = dict(line[2:].split("=", 1) for line in (_ROOT / "experiments/configs/synthetic_paths.cfg").read_text()
             .splitlines() if line.startswith("--"))
  assert {k: str(v) for k, v in pm.PATHS_TASK.items()} == {k: v for k, v in cfg.items() if k != "num_test"}
  assert [r.name for r in pm.plan(_args(tmp_path, chain=False))][-1] == "grpo/seed1"


def test_path_shares_by_hand():
  mine = [[A, A, B], [C], []]
  pool = [[A], [D], [B]]
  assert pm.path_share(mine, pool) == pytest.approx(2 / 4)  # A, A held; B not on problem 0; C not on problem 1
  assert pm.modal_share(mine) == pytest.approx(3 / 4)  # A twice of 3, C once of 1
  assert math.isnan(pm.path_share([[]], [[A]])) and math.isnan(pm.modal_share([[]]))


def test_staleness_differences_by_hand():
  out = pm.staleness([-2.0, -3.0], [-4.0, -3.5], [-6.0], [-1.0], [[A, A]], [[A, B]], [[C, A]])
  assert out["pool_dlogp"] == pytest.approx(-1.25) and out["fresh_dlogp"] == pytest.approx(5.0)
  assert out["rl_paths_in_pool"] == 1.0 and out["control_paths_in_pool"] == 0.5
  assert out["modal_rl"] == 1.0 and out["modal_sft"] == 0.5
  assert (out["pool_size"], out["fresh_size"]) == (2, 1)


def test_step_advantages_and_their_correlation_with_the_labels_by_hand():
  # two samples of one problem: right in 2 steps (labels 1, 1, answer 1); wrong at its second step (1, 0, answer 0)
  labels = [np.array([1.0, 1.0, 1.0]), np.array([1.0, 0.0, 0.0])]
  outcome, process = pm.step_advantages(labels, [True, False])
  np.testing.assert_allclose(outcome, [[1, 1, 1], [-1, -1, -1]], atol=1e-3)  # ±0.5 / (0.5 + 1e-4)
  # process: R = (1,1,1,1,0,0), mean 2/3, std √2/3, so 1 -> 1/√2 and 0 -> -√2; suffix sums
  h = 1 / math.sqrt(2)
  np.testing.assert_allclose(process, [[3 * h, 2 * h, h], [h - 4 * h, -4 * h, -2 * h]], atol=1e-3)
  stats = pm.step_statistics([(labels, [True, False], [2, 2])])
  assert stats["wrong_right_steps"] == 0.5 and stats["wrong_with_right_step"] == 1.0
  assert (stats["steps"], stats["wrong"]) == (4, 1)
  # steps (labels 1, 1, 1, 0): outcome advantages (1, 1, -1, -1): r = 0.25 / √(3/16) = 1/√3;
  # process (3, 2, -3, -4)·h: r = 3.5 / √(37 · 3/4)
  assert stats["corr_outcome"] == pytest.approx(1 / math.sqrt(3), abs=1e-4)
  assert stats["corr_process"] == pytest.approx(3.5 / math.sqrt(37 * 0.75), abs=1e-4)
  # a group whose answers are all wrong: no outcome signal, but its steps still differ
  outcome, process = pm.step_advantages([np.array([1.0, 0.0]), np.array([0.0, 0.0])], [False, False])
  assert np.all(outcome == 0) and process[0, 0] > 0 > process[1, 0]


def test_the_table_carries_each_seeds_values_and_their_mean_and_standard_error():
  a = {"pool_dlogp": -1.0, "fresh_dlogp": 2.0, "rl_paths_in_pool": 0.5, "control_paths_in_pool": 0.8,
       "modal_sft": 0.3, "modal_rl": 0.6}
  b = {"wrong_right_steps": 0.6, "wrong_with_right_step": 0.9, "corr_outcome": 0.2, "corr_process": 0.7}
  result = {"start_accuracy": "40.0%", "rl_accuracy": "45.0% 47.0%",
            "staleness": {"0": a, "1": {**a, "pool_dlogp": -3.0}},
            "steps": {"paths": {"0": b, "1": {**b, "corr_process": 0.9}}, "chain": {}}}
  table = pm.markdown(result, [0, 1])
  assert "| Δ log π of the offline pool (RL − SFT, nats per completion) | -1.00 | -3.00 | -2.00 ± 1.00 |" in table
  assert "| paths: corr(process advantage, step label) | 0.700 | 0.900 | 0.800 ± 0.100 |" in table
  assert "chain:" not in table


@pytest.mark.parametrize("argv, message", [
    (["--seeds=0"], "--seeds=0: must be at least 1"),
    (["--problems=300", "--num_test=200"], "--problems=300: at most --num_test=200"),
])
def test_bad_arguments_are_one_line(argv, message, capsys, tmp_path):
  assert pm.main([f"--out_dir={tmp_path}", *argv]) == 2
  assert capsys.readouterr().err.strip() == message


def test_a_policys_log_likelihood_is_the_sum_of_its_tokens_log_softmax_at_the_temperature(tmp_path):
  """`Policy.loglik` (left-padded prompts, right-padded completions, the end token appended, rows in chunks)
  against an unpadded forward of each sequence alone."""
  import jax
  from grpo_jax import models
  path = models.build_default_checkpoint(tmp_path / "tiny", seed=0, num_hidden_layers=1, hidden_size=32,
                                         intermediate_size=64)
  policy = pm.Policy(path, max_prompt_len=8, max_new_tokens=16, temperature=0.7)
  prompts, completions = ["2*3+4\n", "5+6*7\n", "9\n"], ["2*3=6\n6+4=10\n", "", "#### 9"]
  got = policy.loglik(prompts, completions, rows=2)  # two chunks, the second padded
  tok = policy.tokenizer
  for prompt, completion, value in zip(prompts, completions, got):
    p = tok.encode(prompt, add_special_tokens=False)
    c = tok.encode(completion, add_special_tokens=False) + [tok.eos_token_id]
    logits = models.apply(policy.params, policy.config, jax.numpy.asarray([p + c]))[0][0]
    logp = jax.nn.log_softmax(np.asarray(logits, np.float64) / 0.7, axis=-1)
    want = sum(float(logp[len(p) - 1 + j, t]) for j, t in enumerate(c))
    assert value == pytest.approx(want, abs=1e-3)
  samples = policy.sample(prompts[:2], 3, jax.random.PRNGKey(0))
  assert [len(s) for s in samples] == [3, 3] and all(isinstance(t, str) for s in samples for t in s)
