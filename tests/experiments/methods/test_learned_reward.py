"""Learned rewards in the runner: GRPO+PS token advantages, iterative RL's reference reset and exact resume."""

import json
import shutil

from absl import flags
import jax
import numpy as np
import pytest

from experiments import cli
from experiments import methods
from experiments.runner import config as config_lib
from experiments.runner import placement as placement_lib
from grpo_jax import data
from grpo_jax import logprobs
from grpo_jax import models
from grpo_jax import reward_models as rm
from grpo_jax import sampling
from grpo_jax.losses import reward as reward_losses
from tests import known_answers
from tests.conftest import run_grpo_math

FLAGS = flags.FLAGS
TINY = ["--max_prompt_len=16", "--max_new_tokens=24", "--num_train=200", "--num_test=8", "--batch_size=4",
        "--group_size=4", "--eval_batch_size=8", "--tensorboard=false", "--eval_every=0", "--learning_rate=1e-3"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """A tiny policy, and an ORM and a PRM on its backbone with random heads (scores that vary)."""
  root = tmp_path_factory.mktemp("learned")
  policy_dir = models.build_default_checkpoint(root / "policy", seed=1, num_hidden_layers=1, hidden_size=64,
                                               intermediate_size=128)
  params, config = models.load_hf(policy_dir)
  for i, kind in enumerate(("orm", "prm")):
    rm_params = rm.init_reward_params(params, config, jax.random.key(i), head_scale=3.0)
    rm.save_reward_model(rm_params, config, root / kind, kind=kind)
  return policy_dir, root / "orm", root / "prm"


def _run(work_dir, policy_dir, *args):
  return run_grpo_math(f"--work_dir={work_dir}", f"--init_checkpoint={policy_dir}", *TINY, *args)


def _record_collects(monkeypatch):
  """Wraps GRPO.collect: records (policy params, reference, batch) as numpy at every step."""
  calls = []
  original = methods.GRPO.collect

  def collect(self, params, position, key):
    batch, stats, position = original(self, params, position, key)
    calls.append((jax.tree.map(np.array, params), jax.tree.map(np.array, self.reference), batch))
    return batch, stats, position

  monkeypatch.setattr(methods.GRPO, "collect", collect)
  return calls


def test_process_supervision_gives_token_level_advantages(tmp_path, checkpoints, monkeypatch):
  policy_dir, _, prm_dir = checkpoints
  calls = _record_collects(monkeypatch)
  _run(tmp_path, policy_dir, "--steps=1", "--reward=prm", f"--reward_model={prm_dir}", "--supervision=process")
  batch = calls[0][2]
  adv, mask = np.asarray(batch.advantages), np.asarray(batch.loss_mask)
  varying = [len(np.unique(np.round(adv[i][mask[i]], 6))) > 1 for i in range(len(adv)) if mask[i].sum() > 1]
  assert any(varying)  # steps end inside completions: advantages change at step boundaries
  # Each row's advantages are suffix sums of normalised step rewards: they are constant between step ends,
  # so each row has at most prm_max_steps distinct values.
  assert all(len(np.unique(np.round(adv[i][mask[i]], 6))) <= 8 for i in range(len(adv)))


def test_outcome_reward_from_the_orm(tmp_path, checkpoints):
  policy_dir, orm_dir, _ = checkpoints
  _run(tmp_path, policy_dir, "--steps=1", "--reward=orm", f"--reward_model={orm_dir}")
  record = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines() if "train/reward_mean" in l]
  assert 0 < record[0]["train/reward_mean"] < 1 and record[0]["train/reward_std"] > 0  # σ(score), not 0/1


def test_iterative_rl_resets_the_reference_and_freezes_it(tmp_path, checkpoints, monkeypatch):
  policy_dir, orm_dir, _ = checkpoints
  calls = _record_collects(monkeypatch)
  _run(tmp_path, policy_dir, "--reward=orm", f"--reward_model={orm_dir}", "--iterations=2",
       "--steps_per_iteration=3", "--rm_update_prompts=4", "--rm_update_steps=3", "--rm_update_batch_size=8",
       "--beta=0.1")
  assert len(calls) == 6
  start = calls[0][0]
  jax.tree.map(np.testing.assert_array_equal, calls[0][1], start)  # iteration 1: π_ref is the start policy
  jax.tree.map(np.testing.assert_array_equal, calls[2][1], start)  # ... and stays frozen
  policy_at_reset, reference = calls[3][0], calls[3][1]
  jax.tree.map(np.testing.assert_array_equal, reference, policy_at_reset)  # iteration 2: π_ref ← π_θ, bitwise
  assert not np.array_equal(reference["embed"]["embedding"], start["embed"]["embedding"])
  for later in calls[4:]:
    jax.tree.map(np.testing.assert_array_equal, later[1], reference)  # frozen within the iteration
  assert not np.array_equal(calls[5][0]["embed"]["embedding"], reference["embed"]["embedding"])
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  rm_records = [r for r in records if "rm/iteration" in r]
  assert [r["step"] for r in rm_records] == [3, 6] and [r["step"] for r in records if "iteration/accuracy" in r] == [3, 6]
  assert rm_records[0]["rm/rows_replayed"] == 0 and rm_records[1]["rm/rows_replayed"] == round(16 * 0.1 / 0.9)


@pytest.mark.parametrize("extra", [[], ["--rm_update_lora_rank=2", "--rm_update_eval_prompts=2", "--reset_reference=false",
                                         "--rm_update_learning_rate=1e-2"]], ids=["plain", "adapters"])
def test_iterative_rl_resumes_exactly(tmp_path, checkpoints, extra):
  policy_dir, orm_dir, _ = checkpoints
  common = ["--reward=orm", f"--reward_model={orm_dir}", "--iterations=2", "--steps_per_iteration=2",
            "--rm_update_prompts=4", "--rm_update_steps=3", "--rm_update_batch_size=8", "--save_every=1", *extra]
  _run(tmp_path / "straight", policy_dir, *common)
  _run(tmp_path / "stopped", policy_dir, *common, "--stop_after=3")  # inside iteration 2, after an RM update
  _run(tmp_path / "stopped", policy_dir, *common, "--resume")
  straight = models.load_hf(tmp_path / "straight" / "final_policy")[0]
  resumed = models.load_hf(tmp_path / "stopped" / "final_policy")[0]
  jax.tree.map(np.testing.assert_array_equal, straight, resumed)
  assert not np.array_equal(straight["embed"]["embedding"], models.load_hf(policy_dir)[0]["embed"]["embedding"])
  # Step 4 scores its samples with the reward model retrained at step 2: restored, it gives the same rewards.
  step4 = [[json.loads(l) for l in (tmp_path / d / "metrics.jsonl").read_text().splitlines()
            if '"train/reward_std"' in l and json.loads(l)["step"] == 4][-1] for d in ("straight", "stopped")]
  assert step4[0]["train/reward_std"] > 0 and step4[0]["train/reward_mean"] == step4[1]["train/reward_mean"]


@pytest.mark.parametrize("args,message", [
    (["--supervision=process"], "--supervision=process needs --reward=prm"),
    (["--reward=orm"], "--reward=orm|prm and --reward_model=DIR go together"),
    (["--iterations=2", "--steps_per_iteration=2"], "--iterations > 1 needs"),
    (["--reward=exact_steps", "--task=gsm8k"], "--reward=exact_steps needs --task=synthetic"),
    (["--reward=exact_steps", "--iterations=2", "--steps_per_iteration=2"], "--iterations > 1 needs"),
])
def test_bad_flag_combinations(tmp_path, args, message):
  FLAGS.unparse_flags()
  FLAGS(["grpo_math", f"--work_dir={tmp_path}", *args])
  try:
    with pytest.raises(config_lib.ConfigError, match=message.replace("|", r"\|")):
      cli.config_from_flags()
  finally:
    FLAGS.unparse_flags()
  assert not tmp_path.exists() or not any(tmp_path.iterdir())  # refused before anything is written


def test_reward_model_kind_must_match(tmp_path, checkpoints):
  policy_dir, orm_dir, _ = checkpoints
  with pytest.raises(ValueError, match="holds a reward model of kind orm"):
    _run(tmp_path, policy_dir, "--steps=1", "--reward=prm", f"--reward_model={orm_dir}")


def test_batch_stats_measure_the_reward_against_correctness_within_groups():
  rollouts = methods.Rollouts.__new__(methods.Rollouts)  # stats() reads only these two attributes
  rollouts.prompts_truncated = 0
  samples = sampling.SampleOutput(*[np.zeros((6, 2))] * len(sampling.SampleOutput._fields))
  rewards = np.array([0.9, 0.2, 0.8, 0.1, 0.7, 0.7], np.float32)  # 2 groups of 3
  correct = np.array([1, 0, 0, 1, 1, 0], np.float32)
  scored = methods.rollouts.Scored(samples, rewards, correct, 0.0, samples)
  rollouts.reward_model = None
  assert "reward_group_auc" not in rollouts.stats(scored, 3)  # a rule reward is the truth
  rollouts.reward_model = object()
  # Group 1: 0.9 beats 0.2 and 0.8; group 2: 0.1 loses to 0.7, 0.7 ties 0.7 -> (2 + 0 + ½) / 4.
  assert rollouts.stats(scored, 3)["reward_group_auc"] == 2.5 / 4
  assert "reward_group_auc" not in rollouts.stats(scored, 1)


def _three_samples(tokenizer):
  """Three completions of one problem as a SampleOutput with a one-token (masked) prompt."""
  example = data.Example(question="5+3+7", answer="15", solution="5+3=8\n8+7=15\n#### 15")
  texts = ["5+3=8\n8+7=13\n#### 13", "5+3=8\n8+7=15\n#### 15", "5+3=9\n9+7=16\n#### 15"]
  ids = [tokenizer.encode(t) for t in texts]
  tokens = np.full((3, 30), tokenizer.pad_token_id, np.int32)
  for i, row in enumerate(ids):
    tokens[i, :len(row)] = row
  zeros = np.zeros((3, 1), np.int32)
  samples = sampling.SampleOutput(zeros, zeros.astype(bool), tokens, np.zeros(tokens.shape, np.float32),
                                  tokens != tokenizer.pad_token_id, np.array([len(r) for r in ids], np.int32),
                                  np.zeros(3, bool))
  return samples, texts, example


def test_exact_step_reward_labels_every_step(checkpoints):
  policy_dir, _, _ = checkpoints
  tokenizer = models.load_tokenizer(policy_dir)
  samples, texts, example = _three_samples(tokenizer)
  reward = methods.learned_reward.ExactStepReward(tokenizer, max_steps=8)
  rewards, ends, mask = reward.steps(samples, texts, [example] * 3)
  outcome = reward.outcome(samples, texts, [example] * 3)
  # Segments: two steps and the answer line. A wrong step makes every later segment wrong, even a right
  # final answer (row 3).
  np.testing.assert_array_equal(mask.sum(1), [3, 3, 3])
  np.testing.assert_array_equal(rewards[:, :3], [[1, 0, 0], [1, 1, 1], [0, 0, 0]])
  np.testing.assert_array_equal(outcome, [0, 1, 0])
  np.testing.assert_array_equal(ends[0, :3], [4, 11, 19])  # the last character of each segment


def _known_steps(row, example):
  """Two-step problems (`a∘b=c`, `c∘d=e`, `#### e`), every row known: rows r = 0, 3 mod 4 the worked solution
  (step labels 1 1 1), r = 1 mod 4 its first result + 1 (0 0 0: a wrong step makes every later one wrong),
  r = 2 mod 4 its final answer + 1 (1 1 0)."""
  lines = example.solution.split("\n")
  if row % 4 == 1:
    head, result = lines[0].split("=")
    lines[0] = f"{head}={int(result) + 1}"
  elif row % 4 == 2:
    lines[-1] = f"#### {int(example.answer) + 1}"
  return "\n".join(lines)


def test_grpo_with_exact_step_rewards_trains_on_step_advantages(tmp_path, checkpoints, monkeypatch):
  """GRPO+PS on known completions: the step rewards normalised over the group's 12 steps (8 right, 4 wrong:
  r̃ = (r − ⅔) / (√2/3 + eps)), each token's advantage the sum of r̃ over the steps that end at or after it."""
  known_answers.inject_completions(monkeypatch, _known_steps)
  calls = _record_collects(monkeypatch)
  policy_dir, _, _ = checkpoints
  _run(tmp_path, policy_dir, "--steps=2", "--reward=exact_steps", "--supervision=process", "--synthetic_max_steps=2",
       "--max_new_tokens=32")
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines() if "train/reward_mean" in l]
  assert [r["step"] for r in records] == [1, 2]
  for r in records:  # the outcome reward (every step right): rows 0, 3 mod 4; a right answer: also rows 1 mod 4
    assert r["train/reward_mean"] == 0.5 and r["train/accuracy"] == 0.75
  tokenizer = models.load_tokenizer(policy_dir)
  right, wrong = (1 - 2 / 3) / (np.sqrt(2) / 3 + 1e-4), (0 - 2 / 3) / (np.sqrt(2) / 3 + 1e-4)
  labels = {0: [1, 1, 1], 1: [0, 0, 0], 2: [1, 1, 0], 3: [1, 1, 1]}
  for params, _, batch in calls:
    tokens, adv, mask = (np.asarray(x)[:, 16:] for x in (batch.tokens, batch.advantages, batch.loss_mask))
    for row in range(len(tokens)):
      text = tokenizer.decode(tokens[row][mask[row]].tolist(), skip_special_tokens=True)
      ends = [i - 1 for i, ch in enumerate(text) if ch == "\n"] + [len(text) - 1]  # each line's last character
      r_tilde = [right if y else wrong for y in labels[row % 4]]
      expected = [sum(r for end, r in zip(ends, r_tilde) if end >= t) for t in range(mask[row].sum())]
      np.testing.assert_allclose(adv[row][mask[row]], expected, rtol=1e-4, atol=1e-5, err_msg=f"row {row}")
  final = models.load_hf(tmp_path / "final_policy")[0]  # (step 1 is the warm-up's learning rate 0)
  assert not np.array_equal(calls[0][0]["embed"]["embedding"], final["embed"]["embedding"])  # it trained


def test_orm_steps_reward_is_the_noisy_and_of_its_step_scores(tmp_path, checkpoints):
  policy_dir = checkpoints[0]
  params, config = models.load_hf(policy_dir)
  rm_params = rm.init_reward_params(params, config, jax.random.key(5), head_scale=3.0)
  rm.save_reward_model(rm_params, config, tmp_path / "orm_steps", kind="orm_steps")
  tokenizer = models.load_tokenizer(policy_dir)
  samples, texts, _ = _three_samples(tokenizer)
  cfg = config_lib.Config().replace(reward="orm", reward_model=str(tmp_path / "orm_steps"))
  reward = methods.learned_reward.LearnedReward(cfg, tokenizer, config)
  outcome = reward.outcome(samples, texts)
  tokens = np.concatenate([samples.prompt_tokens, samples.tokens], axis=1)
  attention = np.concatenate([samples.prompt_mask, samples.mask], axis=1)
  ends = np.array([[4, 11, 19]] * 3) + 1  # each segment's last character, after the one-token prompt
  step_logits = np.asarray(rm.step_scores(rm_params, config, tokens, attention, ends, np.ones((3, 3), bool)))
  np.testing.assert_allclose(outcome, np.prod(1 / (1 + np.exp(-step_logits)), axis=1), rtol=1e-5)
  assert np.ptp(outcome) > 1e-3  # the three completions score differently
  with pytest.raises(ValueError, match="holds a reward model of kind orm_steps"):
    _run(tmp_path / "run", policy_dir, "--steps=1", "--reward=prm", f"--reward_model={tmp_path / 'orm_steps'}")


def _orm_and_prm(checkpoints):
  """(the policy's config, its tokenizer, three samples and their texts, [(reward, run Config)] for the ORM and
  the PRM of `checkpoints`)."""
  policy_dir, orm_dir, prm_dir = checkpoints
  _, config = models.load_hf(policy_dir)
  tokenizer = models.load_tokenizer(policy_dir)
  samples, texts, _ = _three_samples(tokenizer)
  cfgs = [(reward, config_lib.Config().replace(reward=reward, reward_model=str(path)))
          for reward, path in (("orm", orm_dir), ("prm", prm_dir))]
  return config, tokenizer, samples, texts, cfgs


def test_reward_model_scores_in_row_chunks_equal_one_chunk(checkpoints):
  """The reward model's forward over the rows in chunks (`--forward_rows`): 3 rows 2 at a time (the last chunk
  padded) give the outcome and step rewards of all 3 at once, up to float rounding."""
  config, tokenizer, samples, texts, cfgs = _orm_and_prm(checkpoints)
  for _, cfg in cfgs:
    whole = methods.learned_reward.LearnedReward(cfg, tokenizer, config)
    chunked = methods.learned_reward.LearnedReward(cfg, tokenizer, config, placement_lib.Placement(forward_rows=2))
    assert whole.placement.forward_chunk(config, 3, 31) == 3  # the default budget: one chunk
    np.testing.assert_allclose(chunked.outcome(samples, texts), whole.outcome(samples, texts), rtol=1e-5)
    assert np.ptp(whole.outcome(samples, texts)) > 1e-3
  hlo = methods.learned_reward.OUTCOME_SCORES.lower(whole.params, whole.config, np.zeros((3, 31), np.int32),
                                                    np.ones((3, 31), bool), rows_per_chunk=2).as_text()
  assert "tensor<2x2xf32>" in hlo  # the loop's stacked scores: 2 chunks of 2 rows


def test_reward_model_loads_in_the_policys_layer_layout(checkpoints):
  """With --scan_layers the reward model's backbone loads stacked (one compiled layer, as the policy's) and scores
  as the unrolled one does."""
  config, tokenizer, samples, texts, cfgs = _orm_and_prm(checkpoints)
  for reward, cfg in cfgs:
    unrolled = methods.learned_reward.LearnedReward(cfg, tokenizer, config)
    scanned = methods.learned_reward.LearnedReward(cfg.replace(scan_layers=True), tokenizer, config)
    assert scanned.config.scan_layers and not unrolled.config.scan_layers
    assert models.transformer.STACKED in scanned.params["backbone"]
    assert not any(k.startswith("layers_") for k in scanned.params["backbone"])
    np.testing.assert_allclose(scanned.outcome(samples, texts), unrolled.outcome(samples, texts), rtol=1e-5)
    if reward == "prm":
      np.testing.assert_allclose(scanned.steps(samples, texts)[0], unrolled.steps(samples, texts)[0], rtol=1e-5)


@pytest.mark.parametrize("kind", ["orm", "orm_steps"])
def test_a_loglik_reward_model_scores_at_rl_time_as_it_trained(tmp_path, checkpoints, kind):
  """--reward=orm with a model saved with the loglik score: σ(pooled head logit + α · Σ over the completion of
  the backbone's token log-probs), α read back from the model directory."""
  policy_dir = checkpoints[0]
  params, config = models.load_hf(policy_dir)
  rm_params = rm.init_reward_params(params, config, jax.random.key(7), head_scale=3.0, score="loglik", alpha=0.01)
  rm.save_reward_model(rm_params, config, tmp_path / kind, kind=kind)
  tokenizer = models.load_tokenizer(policy_dir)
  samples, texts, _ = _three_samples(tokenizer)
  cfg = config_lib.Config().replace(reward="orm", reward_model=str(tmp_path / kind))
  reward = methods.learned_reward.LearnedReward(cfg, tokenizer, config)
  outcome = reward.outcome(samples, texts)
  tokens = np.concatenate([samples.prompt_tokens, samples.tokens], axis=1)
  attention = np.concatenate([samples.prompt_mask, samples.mask], axis=1)
  logp = np.asarray(logprobs.token_logprobs(params, config, tokens, attention))  # the policy = the backbone, tied
  loglik = (logp * attention)[:, 1:].sum(1)  # the completion: after the one-token prompt
  if kind == "orm":
    last = samples.lengths  # the completion's last token, after the one-token prompt
    pooled = np.asarray(rm.outcome_scores(rm_params, config, tokens, attention, last))
  else:
    ends = np.array([[4, 11, 19]] * 3) + 1
    steps = rm.step_scores(rm_params, config, tokens, attention, ends, np.ones((3, 3), bool))
    pooled = np.asarray(reward_losses.noisy_and_logits(steps, np.ones((3, 3), bool)))
  np.testing.assert_allclose(reward.outcome_logits(samples, texts), pooled + 0.01 * loglik, rtol=1e-5)
  np.testing.assert_allclose(outcome, 1 / (1 + np.exp(-(pooled + 0.01 * loglik))), rtol=1e-5)
  assert np.ptp(outcome) > 1e-3 and np.all(np.abs(0.01 * loglik) > 0.1)  # both terms matter
  chunked = methods.learned_reward.LearnedReward(cfg, tokenizer, config, placement_lib.Placement(forward_rows=2))
  np.testing.assert_allclose(chunked.outcome(samples, texts), outcome, rtol=1e-5)


def _loglik_orm(policy_dir, path, alpha: float):
  """A loglik-score ORM on the policy's backbone, saved at `path`."""
  params, config = models.load_hf(policy_dir)
  rm_params = rm.init_reward_params(params, config, jax.random.key(8), head_scale=3.0, score="loglik", alpha=alpha)
  rm.save_reward_model(rm_params, config, path, kind="orm")


def _record_updates(monkeypatch, record) -> list:
  """The list that each `RewardModelUpdates.update` appends `record(updates)` to, after the update."""
  seen = []
  original = methods.learned_reward.RewardModelUpdates.update

  def update(self, policy, iteration, key):
    metrics = original(self, policy, iteration, key)
    seen.append(record(self))
    return metrics

  monkeypatch.setattr(methods.learned_reward.RewardModelUpdates, "update", update)
  return seen


def test_iterative_updates_of_a_loglik_model_train_head_and_alpha_only(tmp_path, checkpoints, monkeypatch):
  """Algorithm 1's reward-model updates on a loglik-score ORM: its backbone stays bitwise as loaded, its head
  and α move."""
  policy_dir = checkpoints[0]
  _loglik_orm(policy_dir, tmp_path / "orm", alpha=0.01)
  states = _record_updates(monkeypatch, lambda updates: jax.tree.map(np.array, updates.state.params))
  _run(tmp_path / "run", policy_dir, "--reward=orm", f"--reward_model={tmp_path / 'orm'}", "--iterations=2",
       "--steps_per_iteration=1", "--rm_update_prompts=4", "--rm_update_steps=3", "--rm_update_batch_size=8")
  assert len(states) == 2
  loaded = rm.load_reward_model(tmp_path / "orm")[0]
  jax.tree.map(np.testing.assert_array_equal, states[-1]["backbone"], jax.tree.map(np.array, loaded["backbone"]))
  assert not np.array_equal(states[-1]["head"]["kernel"], np.asarray(loaded["head"]["kernel"]))
  assert float(states[-1]["alpha"]) != pytest.approx(0.01, abs=1e-7)


def test_iterative_updates_with_adapters_train_the_likelihood_and_keep_the_base(tmp_path, checkpoints, monkeypatch):
  """--rm_update_lora_rank: the loglik-score ORM's retraining moves adapters on its backbone (so the likelihood it
  ranks with changes: a frozen backbone's cannot), its head and α; the loaded weights stay bitwise."""
  from grpo_jax.models import lora
  policy_dir = checkpoints[0]
  _loglik_orm(policy_dir, tmp_path / "orm", alpha=0.5)
  seen = _record_updates(monkeypatch, lambda updates: (jax.tree.map(np.array, updates.state.params),
                                                       updates.reward.config,
                                                       updates.reward.params is updates.state.params))
  _run(tmp_path / "run", policy_dir, "--reward=orm", f"--reward_model={tmp_path / 'orm'}", "--iterations=2",
       "--steps_per_iteration=1", "--rm_update_prompts=4", "--rm_update_steps=3", "--rm_update_batch_size=8",
       "--rm_update_lora_rank=2", "--rm_update_lora_alpha=4", "--rm_update_learning_rate=1e-2")
  assert len(seen) == 2
  trained, reward_config, scores_with_them = seen[-1]
  assert reward_config.lora_rank == 2 and scores_with_them  # the RL reward is the retrained model's
  loaded = rm.load_reward_model(tmp_path / "orm")[0]
  adapters, base = lora.split(trained["backbone"], lora.is_adapter)
  jax.tree.map(np.testing.assert_array_equal, base, jax.tree.map(np.array, loaded["backbone"]))
  assert not np.allclose(adapters["layers_0"]["mlp"]["down_proj"]["lora_b"], 0.0)
  assert float(trained["alpha"]) != pytest.approx(0.5, abs=1e-7)
  tokens = np.asarray(jax.random.randint(jax.random.key(0), (4, 20), 1, reward_config.vocab_size))
  mask, starts = np.ones_like(tokens, bool), np.full(4, 8, np.int32)
  before = rm.completion_loglik(loaded, reward_config.replace(lora_rank=0, lora_alpha=0.0, lora_targets=()),
                                tokens, mask, starts)
  after = rm.completion_loglik(trained, reward_config, tokens, mask, starts)
  assert np.abs(np.asarray(after) - np.asarray(before)).max() > 1e-3  # the likelihood itself moved


def _rm_records(work_dir):
  return [r for r in (json.loads(l) for l in (work_dir / "metrics.jsonl").read_text().splitlines())
          if "rm/iteration" in r]


def test_staleness_is_measured_on_fresh_held_out_samples_before_and_after_each_round(tmp_path, checkpoints,
                                                                                     monkeypatch):
  """--rm_update_eval_prompts: each round scores further fresh samples of the current policy, never trained on,
  with the reward model before its retraining and after it (logged as rm/held_out_before_*, rm/held_out_after_*)."""
  policy_dir, orm_dir, _ = checkpoints
  calls = []  # (what rm.evaluate scored, with which params) inside the updates
  fits = []
  evaluate, fit = rm.evaluate, rm.fit
  monkeypatch.setattr(rm, "evaluate", lambda params, config, data, **kw: calls.append(
      (np.array(data.tokens), jax.tree.map(np.array, params))) or evaluate(params, config, data, **kw))
  monkeypatch.setattr(rm, "fit", lambda state, step, data, **kw: fits.append(np.array(data.tokens)) or fit(
      state, step, data, **kw))
  _run(tmp_path, policy_dir, "--reward=orm", f"--reward_model={orm_dir}", "--iterations=2",
       "--steps_per_iteration=2", "--rm_update_prompts=4", "--rm_update_steps=3", "--rm_update_batch_size=8",
       "--rm_update_eval_prompts=3", "--rm_update_learning_rate=1e-2")
  records = _rm_records(tmp_path)
  assert [r["step"] for r in records] == [2, 4]
  for r in records:
    assert r["rm/held_out_before_outcome/count"] == r["rm/held_out_after_outcome/count"] == 3 * 4  # 3 prompts x G
    assert r["rm/before_outcome/count"] == r["rm/rows_new"] == 4 * 4
    assert {"rm/held_out_before_outcome/group_auc", "rm/held_out_after_outcome/group_auc"} <= set(r)
  assert len(calls) == 8 and len(fits) == 2  # per round: new and held-out before, new and held-out after
  for round_ in range(2):
    new_before, held_before, new_after, held_after = calls[4 * round_:4 * round_ + 4]
    np.testing.assert_array_equal(held_before[0], held_after[0])
    np.testing.assert_array_equal(new_before[0], new_after[0])
    trained_rows = {row.tobytes() for row in fits[round_]}
    assert not {row.tobytes() for row in held_before[0]} & trained_rows  # never trained on
    assert {row.tobytes() for row in new_before[0]} <= trained_rows
    jax.tree.map(np.testing.assert_array_equal, held_before[1], new_before[1])  # before: the model as it was
    jax.tree.map(np.testing.assert_array_equal, held_after[1], new_after[1])
    assert not np.array_equal(held_before[1]["head"]["kernel"], held_after[1]["head"]["kernel"])  # it trained
  # round 2's "before" is the model round 1 left: the staleness of what the last round trained
  jax.tree.map(np.testing.assert_array_equal, calls[4][1], calls[3][1])


def test_the_two_by_two_switches_reference_reset_and_retraining_apart(tmp_path, checkpoints, monkeypatch):
  """--reset_reference=false keeps π_ref at the start policy over iterations; --rm_update_steps=0 keeps the reward
  model as loaded, its measurements logged with after = before."""
  policy_dir, orm_dir, _ = checkpoints
  calls = _record_collects(monkeypatch)
  _run(tmp_path, policy_dir, "--reward=orm", f"--reward_model={orm_dir}", "--iterations=2",
       "--steps_per_iteration=2", "--rm_update_prompts=4", "--rm_update_steps=0", "--rm_update_eval_prompts=2",
       "--reset_reference=false", "--beta=0.1")
  assert len(calls) == 4
  for later in calls[1:]:
    jax.tree.map(np.testing.assert_array_equal, later[1], calls[0][0])  # π_ref: the start policy throughout
  assert not np.array_equal(calls[2][0]["embed"]["embedding"], calls[0][0]["embed"]["embedding"])
  records = _rm_records(tmp_path)
  assert len(records) == 2 and "rm/loss" not in records[0]
  for r in records:
    for key in [k for k in r if k.startswith(("rm/before_", "rm/held_out_before_"))]:
      assert r[key.replace("before_", "after_", 1)] == r[key]
  # The rewards of iteration 2 come from the loaded model: the same as a one-round run's on the same samples
  _run(tmp_path / "one_round", policy_dir, "--reward=orm", f"--reward_model={orm_dir}", "--steps=4", "--beta=0.1")
  curves = [[json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines() if '"train/reward_mean"' in l]
            for d in (tmp_path, tmp_path / "one_round")]
  assert len(curves[0]) == 4 and [r["train/reward_mean"] for r in curves[0]] == [r["train/reward_mean"]
                                                                                 for r in curves[1]]


def _orm_with_rows(checkpoints, path, num_rows=30, length=16 + 24):
  """The fixture's ORM copied to `path` with `num_rows` training rows of `length` tokens (row i all token i + 3)."""
  shutil.copytree(checkpoints[1], path)
  i = np.arange(num_rows)
  rows = rm.RewardData(tokens=np.repeat((i + 3)[:, None], length, 1).astype(np.int32),
                       attention_mask=np.ones((num_rows, length), bool), positions=np.full((num_rows, 1), length - 1,
                                                                                         np.int32),
                       labels=(i % 2).astype(np.float32)[:, None], loss_mask=np.ones((num_rows, 1), bool),
                       group=(i // 2).astype(np.int32), outcome=(i % 2).astype(np.float32))
  rm.save_training_rows(rows, path, prompt_len=16)
  return {row.tobytes() for row in rows.tokens}


def test_the_replay_starts_with_the_reward_models_training_rows(tmp_path, checkpoints, monkeypatch, capsys):
  """Algorithm 1's "10% historical data" from the first round on: the rows the reward model trained on
  (training_rows.npz beside it) are the buffer's start, so round 1 trains on 16 new rows and round(16 * 0.1 / 0.9)
  = 2 of them; --replay_reward_model_rows=false starts it empty."""
  policy_dir = checkpoints[0]
  history = _orm_with_rows(checkpoints, tmp_path / "orm")
  fits = []
  fit = rm.fit
  monkeypatch.setattr(rm, "fit", lambda state, step, data, **kw: fits.append(np.array(data.tokens)) or fit(
      state, step, data, **kw))
  common = ["--reward=orm", f"--reward_model={tmp_path / 'orm'}", "--iterations=2", "--steps_per_iteration=1",
            "--rm_update_prompts=4", "--rm_update_steps=2", "--rm_update_batch_size=8"]
  _run(tmp_path / "run", policy_dir, *common)
  assert "replay: starts with 30 of the reward model's 30 training rows" in capsys.readouterr().err
  assert [r["rm/rows_replayed"] for r in _rm_records(tmp_path / "run")] == [2, 2]
  assert len(fits) == 2 and [len(f) for f in fits] == [18, 18]
  assert not {row.tobytes() for row in fits[0][:16]} & history  # the policy's fresh samples first
  assert {row.tobytes() for row in fits[0][16:]} <= history  # then the reward model's own training rows
  _run(tmp_path / "empty", policy_dir, *common, "--replay_reward_model_rows=false")
  assert [r["rm/rows_replayed"] for r in _rm_records(tmp_path / "empty")] == [0, 2]
  assert "replay: starts with" not in capsys.readouterr().err


def test_training_rows_of_another_layout_are_refused_before_training(tmp_path, checkpoints):
  _orm_with_rows(checkpoints, tmp_path / "orm", length=16 + 20)
  with pytest.raises(ValueError, match=r"training_rows.npz: rows of 16 prompt \+ 20 completion tokens and 1 scored "
                                       r"positions, this run's 16 \+ 24 and 1: set --max_prompt_len"):
    _run(tmp_path / "run", checkpoints[0], "--reward=orm", f"--reward_model={tmp_path / 'orm'}", "--iterations=2",
         "--steps_per_iteration=1", "--rm_update_prompts=4")
  assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("args,message", [
    (["--rm_update_lora_alpha=8"], "--rm_update_lora_alpha"),
    (["--rm_update_lora_rank=-1"], "--rm_update_lora_rank must be >= 0"),
    (["--rm_update_lora_rank=2"], "--rm_update_lora_rank is read only with --iterations > 1"),
    (["--rm_update_eval_prompts=4"], "--rm_update_eval_prompts is read only with --iterations > 1"),
    (["--reset_reference=false"], "--reset_reference is read only with --iterations > 1"),
    (["--replay_reward_model_rows=false"], "--replay_reward_model_rows is read only with --iterations > 1"),
])
def test_bad_adapter_flags(tmp_path, args, message):
  FLAGS.unparse_flags()
  FLAGS(["grpo_math", f"--work_dir={tmp_path}", *args])
  try:
    with pytest.raises(config_lib.ConfigError, match=message):
      cli.config_from_flags()
  finally:
    FLAGS.unparse_flags()


def test_model_config_is_what_learned_reward_loads(checkpoints):
  """`model_config` (aot_compile's reward shapes) gives the config and kind LearnedReward runs with, without weights;
  a preset name stands for its shapes, tied, of the --reward's kind."""
  config, tokenizer, _, _, cfgs = _orm_and_prm(checkpoints)
  for reward, cfg in cfgs:
    for run in (cfg, cfg.replace(scan_layers=True, dtype="bfloat16")):
      loaded = methods.learned_reward.LearnedReward(run, tokenizer, config.replace(attention="xla"))
      assert loaded.config.attention == "xla" and loaded.kind == reward
      assert methods.learned_reward.model_config(run, config.replace(attention="xla")) == (loaded.config, reward)
    named, kind = methods.learned_reward.model_config(cfg.replace(reward_model="qwen2.5-7b"), config)
    assert kind == reward and named.tie_word_embeddings and named.hidden_size == 3584
  assert methods.learned_reward.model_config(config_lib.Config(), config) is None  # a rule reward
