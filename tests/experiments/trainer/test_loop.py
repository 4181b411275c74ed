"""The one training loop (`experiments/trainer/loop.py`): a new method is one class plus its registration, and
the loop runs it end to end from a Python config (the README's example)."""

import gc
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import methods
from experiments.methods import rft
from experiments.runner import config as config_lib
from experiments.runner import git_commit
from experiments.trainer import loop
from grpo_jax import models
from grpo_jax.models import lora
from grpo_jax import training
from tests.known_answers import known_answers  # noqa: F401  (a fixture)


class SignedRFT(rft._Paradigm):
  """Online RFT that also pushes down wrong samples: GC = 1 if correct, else -0.1."""
  name = "signed_rft"

  def collect(self, params, position, key):
    b, g = self.config.rollout.batch_size, self.config.rollout.group_size
    examples = [self.task.train_example(position + i) for i in range(b)]
    scored = self.rollouts.sample(params, examples, key, g)
    mask = jnp.asarray(scored.samples.mask)
    gc = jnp.where(jnp.asarray(scored.correct) > 0, 1.0, -0.1)
    zeros = jnp.zeros(mask.shape, jnp.float32)
    batch = training.batch_from_samples(scored.samples, mask, zeros, zeros, gc)
    return batch, self.rollouts.stats(scored), position + b


TINY = dict(max_prompt_len=16, max_new_tokens=24, num_train=200, num_test=8, batch_size=2, group_size=4,
            eval_batch_size=8, tiny_layers=1, tiny_hidden_size=32, sft_steps=0, steps=2, eval_every=0,
            tensorboard=False, learning_rate=1e-2)


def test_a_new_method_is_one_class_and_its_registration(tmp_path, monkeypatch, known_answers):
  monkeypatch.setitem(methods.METHODS, "signed_rft", SignedRFT)
  monkeypatch.setitem(config_lib.CHOICES, "algo", (*config_lib.CHOICES["algo"], "signed_rft"))
  summary = loop.run(config_lib.Config().replace(**TINY, algo="signed_rft", work_dir=str(tmp_path)))
  assert summary["algo"] == "signed_rft"
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if "train/loss" in r]
  assert [r["step"] for r in train] == [1, 2]
  # Known answers: rows 0 mod 4 right, 1 mod 4 wrong, so both signs of the coefficient train.
  assert all(0.25 <= r["train/accuracy"] <= 0.75 for r in train)
  start, final = (models.load_hf(tmp_path / d)[0] for d in ("base_model", "final_policy"))
  assert not np.array_equal(start["embed"]["embedding"], final["embed"]["embedding"])
  assert json.loads((tmp_path / "config.json").read_text())["algo"] == "signed_rft"


def test_stop_after_returns_nothing_and_saves(tmp_path):
  config = config_lib.Config().replace(**TINY, stop_after=1, work_dir=str(tmp_path))
  assert loop.run(config) == {}
  assert (tmp_path / "checkpoints" / "1").is_dir() and not (tmp_path / "final_policy").exists()
  resumed = loop.run(config.replace(stop_after=0, resume=True))
  assert resumed["algo"] == "grpo" and (tmp_path / "final_policy").is_dir()
  assert resumed["config"] == json.loads((tmp_path / "config.json").read_text())  # the summary names its config
  assert resumed["code_version"] == git_commit.head_commit() != ""  # and its code: a git commit here, or "unknown"


def test_a_bfloat16_run_logs_a_mismatch_that_the_correction_weights_follow(tmp_path):
  """In bfloat16 the sampler's decode and the trainer's forward round differently: every step logs a nonzero
  mismatch, and token-TIS weights are e^Δ of the same tokens (on-policy GRPO: π_old is the update's forward), so
  their extremes are those of the logged |Δ| (the cap C = 100 is far)."""
  config = config_lib.Config().replace(**TINY, dtype="bfloat16", rollout_correction="token_tis",
                                       rollout_correction_upper=100.0, work_dir=str(tmp_path))
  loop.run(config)
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if "train/loss" in r]
  assert len(train) == 2
  for r in train:
    assert 0 < r["train/mismatch_logp_diff_mean"] <= r["train/mismatch_logp_diff_max"] < np.log(100.0)
    assert r["train/mismatch_kl"] > 0
    assert (r["train/mismatch_ratio_outside"] > 0) == (r["train/mismatch_logp_diff_max"] > np.log(2.0))
    # max_t |Δ_t| = max(log max_t w_t, −log min_t w_t) with w_t = e^{Δ_t}
    extreme = max(np.log(r["train/rollout_is_weight_max"]), -np.log(r["train/rollout_is_weight_min"]))
    np.testing.assert_allclose(extreme, r["train/mismatch_logp_diff_max"], rtol=1e-4, atol=1e-6)
    assert r["train/rollout_is_weight_min"] < 1 < r["train/rollout_is_weight_max"]
    assert r["train/rollout_is_dropped_frac"] == 0.0


def test_resume_keeps_the_count_of_truncated_prompts(tmp_path):
  """`train/prompts_truncated` counts since the start of the run: a resumed run goes on from the checkpoint's
  count instead of from 0. Every prompt is longer than 4 tokens, so after step s it is s·B."""
  config = config_lib.Config().replace(**{**TINY, "max_prompt_len": 4}, stop_after=1, work_dir=str(tmp_path))
  loop.run(config)
  loop.run(config.replace(stop_after=0, resume=True))
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [(r["step"], r["train/prompts_truncated"]) for r in records if "train/loss" in r] == [(1, 2.0), (2, 4.0)]


@pytest.mark.parametrize("algo, mesh, copies", [
    ("grpo", "", 4),  # π_θ, Adam's μ and ν, π_ref
    pytest.param("grpo", "fsdp:2", 4, marks=pytest.mark.devices(2)),
    pytest.param("ppo", "fsdp:2", 7, marks=pytest.mark.devices(2)),  # and the value model's backbone, its μ, ν
])
def test_stage_2_holds_no_copy_of_the_start_policy_beyond_the_needed_ones(tmp_path, monkeypatch, algo, mesh, copies):
  """The start params are handed over to the train state: at every collect of stage 2, of a run and of its resume
  (which replaces the state built from them by the checkpoint's), the live arrays of the embedding's shape (one per
  policy-sized tree) are the needed ones only, not one more for the start policy the loop was given."""
  counts = []
  gc.collect()
  before = jax.live_arrays()  # earlier tests' arrays, in this worker process: held, not counted

  class Probe(methods.METHODS[algo]):
    def collect(self, params, position, key):
      shape, old = self.policy(params)["embed"]["embedding"].shape, {id(x) for x in before}
      counts.append(sum(x.shape == shape and id(x) not in old for x in jax.live_arrays()))
      return super().collect(params, position, key)

  monkeypatch.setitem(methods.METHODS, algo, Probe)
  config = config_lib.Config().replace(**TINY, algo=algo, mesh=mesh, stop_after=1, work_dir=str(tmp_path))
  loop.run(config)
  loop.run(config.replace(stop_after=0, resume=True))
  assert counts == [copies] * 2


@pytest.mark.parametrize("answers, evaluated, stops", [
    ((False, False), True, False),  # no signal: the step's evaluation runs
    ((True,), False, True),  # noted during the step: its evaluation is skipped, the step saved at once
    ((False, True), True, True),  # noted during the evaluation: answered right after it
])
def test_a_signal_noted_by_the_end_of_a_step_skips_its_evaluation(answers, evaluated, stops, capsys):
  """Preemption saves the step in flight within a grace period: a signal noted by the end of a step at which the
  run evaluates stops the run before the evaluation (which can take longer than the grace period)."""
  asked, evaluations, logged = [], [], []
  config = config_lib.Config().replace(steps=10, eval_every=2)
  method = types.SimpleNamespace(config=config, evaluate=lambda *a: evaluations.append(a) or {"accuracy": 0.5},
                                 policy=lambda params: params)
  logger = types.SimpleNamespace(newline=lambda: None, log=lambda step, values, prefix: logged.append(step) or {
      prefix + k: v for k, v in values.items()})
  steps = loop._Steps(method, logger, lora.TrainedPart(enabled=False), None, None, None, 8, 1)
  state = types.SimpleNamespace(params={"w": 1.0})
  stop = steps.iterate_and_evaluate(state, 4, None, lambda: asked.append(1) or answers[len(asked) - 1])
  assert stop == stops and bool(evaluations) == evaluated and logged == ([4] if evaluated else [])
  assert len(asked) == len(answers)  # every process asks the same number of times, whatever the answer
  assert ("step 4: evaluation skipped, the run is stopping" in capsys.readouterr().err) == (not evaluated)
