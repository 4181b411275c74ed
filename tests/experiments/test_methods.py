"""The runner's methods (`experiments/methods`): PPO's roles, the data each method trains on, and every
`--algo` end to end on a tiny SFT policy.

A tiny SFT policy's accuracy depends on the processor's rounding (6% on one machine, 0% on another), so no
test here relies on it: `known_answers` makes some sampled rows right and some wrong by construction.
"""

import json

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import cli
from experiments import grpo_math
from experiments import methods
from experiments.runner import task as task_lib
from experiments.methods import dpo as dpo_lib
from experiments.methods import ppo as ppo_lib
from experiments.methods import rollouts as rollouts_lib
from grpo_jax import length_buckets
from grpo_jax import models
from grpo_jax import sampling
from grpo_jax import training
from tests.known_answers import known_answers  # noqa: F401  (a fixture)

FLAGS = flags.FLAGS
TINY = ["--max_prompt_len=16", "--max_new_tokens=24", "--num_train=400", "--num_test=16", "--batch_size=4",
        "--group_size=4", "--eval_batch_size=16", "--tensorboard=false", "--sft_examples=200", "--tiny_layers=2",
        "--tiny_hidden_size=64"]
OFFLINE = ["--offline_prompts=32"]  # RFT's and DPO's dataset (the other methods refuse the flag)


def _parse(*args):
  FLAGS.unparse_flags()
  offline = OFFLINE if any(a in ("--algo=rft", "--algo=dpo") for a in args) else []
  FLAGS(["grpo_math", *TINY, *offline, *args])


@pytest.fixture(scope="module")
def sft_policy(tmp_path_factory):
  """A tiny policy after 40 SFT steps (a stage-1 run: its sft_policy carries the lineage marker)."""
  work = tmp_path_factory.mktemp("stage1")
  _parse(f"--work_dir={work}", "--sft_steps=40", "--steps=0")
  grpo_math.run()
  FLAGS.unparse_flags()
  return work / "sft_policy"


def test_known_answers_are_scored_right_and_wrong(sft_policy, known_answers):
  method, params, _ = _method("online_rft", sft_policy)
  scored = method.rollouts.sample(params, [method.task.train_example(i) for i in range(4)], jax.random.key(0), 4)
  np.testing.assert_array_equal(scored.correct[0::4], 1.0)
  np.testing.assert_array_equal(scored.correct[1::4], 0.0)


def _method(name, sft_policy, *args):
  _parse(f"--init_checkpoint={sft_policy}", f"--algo={name}", *args)
  cfg = cli.config_from_flags()
  params, config = models.load_hf(sft_policy)
  task = task_lib.Task(cfg.task, models.load_tokenizer(sft_policy), sft_lineage=True, seed=cfg.run.seed)
  reference = jax.tree.map(jnp.copy, params)
  method = methods.METHODS[name](cfg, config, task, methods.Rollouts(cfg, config, task), reference)
  return method, params, reference


def test_ppo_step_changes_only_policy_and_value(sft_policy, known_answers):
  method, params, reference = _method("ppo", sft_policy, "--batch_size=8", "--group_size=1", "--learning_rate=1e-3",
                                      "--reward=correctness:1.0,format:0.5")  # format: non-zero advantages
  reference_before = jax.tree.map(np.array, reference)
  trained = method.init_params(params, jax.random.key(0))
  np.testing.assert_array_equal(trained["value"]["backbone"]["embed"]["embedding"], params["embed"]["embedding"])
  optimizer = method.optimizer(total_updates=4, warmup=0)
  state = training.init_train_state(trained, optimizer)
  before = jax.tree.map(np.array, state.params)
  step = training.make_train_step(method.objective(), optimizer)
  batch, stats, _ = method.collect(state.params, 0, jax.random.key(0))  # known answers: non-zero advantages
  state, metrics = step(state, batch)
  assert isinstance(batch, training.PPOBatch) and batch.tokens.shape[0] == 8  # G = 1: one sample per prompt
  for role in ("policy", "value"):
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b), before[role], state.params[role]))
    assert any(moved), role
  jax.tree.map(np.testing.assert_array_equal, reference_before, reference)  # π_ref bit-identical
  assert {"explained_variance", "advantage_mean", "return_mean", "kl_reward"} <= set(stats)
  assert {"value_loss", "pg_loss", "clip_frac", "entropy", "value_clip_frac"} <= set(metrics)
  assert "kl" not in metrics  # PPO's KL is in the rewards (stats["kl_reward"]), not the loss


def _record_scores(method):
  """Wraps `method.rollouts.sample`: the list it returns fills with each call's `Scored`."""
  calls, sample = [], method.rollouts.sample
  method.rollouts.sample = lambda *args: calls.append(sample(*args)) or calls[-1]
  return calls


def test_ppo_rewards_land_on_the_last_token(sft_policy, known_answers):
  method, params, _ = _method("ppo", sft_policy, "--batch_size=8", "--beta=0", "--gamma=1", "--gae_lambda=1",
                              "--nowhiten_advantages")
  trained = method.init_params(params, jax.random.key(0))  # zero value head: V = 0, so A_t = R_t = score
  scored = _record_scores(method)
  batch, stats, _ = method.collect(trained, 0, jax.random.key(3))
  scores = scored[0].rewards
  np.testing.assert_array_equal(scores[0::4], 1.0)  # known answers: rows 0 mod 4 right, 1 mod 4 wrong
  np.testing.assert_array_equal(scores[1::4], 0.0)
  m = np.asarray(batch.loss_mask)
  returns, advantages = np.asarray(batch.returns), np.asarray(batch.advantages)
  assert m.sum(1)[0::4].min() > 1  # the right rows have several tokens: a score on any other token shows
  # γ = λ = 1, β = 0, V = 0: the score on the last token is every token's return and advantage, 0 off the mask.
  np.testing.assert_allclose(returns, np.where(m, scores[:, None], 0.0), atol=1e-6)
  np.testing.assert_allclose(advantages, returns, atol=1e-6)
  assert stats["reward_std"] > 0 and stats["explained_variance"] == pytest.approx(0.0, abs=1e-6)


def test_dpo_pairs_are_correct_then_wrong_of_one_prompt():
  correct = np.array([1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1], np.float32)
  prompt = np.repeat(np.arange(3), 4)
  np.testing.assert_array_equal(dpo_lib.make_pairs(correct, prompt, 1), [[0, 1], [4, 6], [9, 8]])
  np.testing.assert_array_equal(dpo_lib.make_pairs(correct, prompt, 2),
                                [[0, 1], [3, 2], [4, 6], [5, 7], [9, 8], [11, 10]])


def test_online_rft_and_sft_batches_carry_their_coefficients(sft_policy, known_answers):
  method, params, _ = _method("online_rft", sft_policy)
  scored = _record_scores(method)
  batch, stats, _ = method.collect(params, 0, jax.random.key(0))
  correct = scored[0].correct
  np.testing.assert_array_equal(correct[0::4], 1.0)  # known answers: rows 0 mod 4 right, 1 mod 4 wrong
  np.testing.assert_array_equal(correct[1::4], 0.0)
  m = np.asarray(batch.loss_mask)
  # GC = I(correct) on every completion token of the row, 0 elsewhere (prompt columns, padding).
  np.testing.assert_array_equal(np.asarray(batch.advantages), np.where(m, correct[:, None], 0.0))
  assert stats["accuracy"] == correct.mean()
  method, _, _ = _method("sft", sft_policy)
  batch, _, _ = method.collect(params, 0, None)
  np.testing.assert_array_equal(np.asarray(batch.advantages), np.asarray(batch.loss_mask, np.float32))
  # The masked tokens are each example's worked solution and the end token, cut to --max_new_tokens (24).
  tok = method.task.tokenizer
  for i, row in enumerate(np.asarray(batch.tokens)):
    e = method.task.train_example(i)  # every synthetic problem has a solution: none is skipped
    target = tok.encode(e.solution, add_special_tokens=False) + [tok.eos_token_id]
    assert row[np.asarray(batch.loss_mask)[i]].tolist() == target[:24]


def test_table10_rft_samples_the_frozen_sft_policy_and_averages_over_every_row(sft_policy, known_answers):
  """Table 10's RFT: the step's B x G rows are samples of π_ref (the SFT start), not of the params being trained;
  GC = I(correct), and the loss is the mean over all B·G rows, wrong ones included: d loss / d log π(o_{i,t}) =
  -GC_i / (N |o_i|) with N = 16, so a right row of 7 tokens gets -1/112 per token, a wrong row 0."""
  method, params, reference = _method("rft_table10", sft_policy)
  drifted = jax.tree.map(lambda x: x + 1.0, params)  # the policy being trained has moved away from the start
  seen = []
  sample = method.rollouts.sample
  method.rollouts.sample = lambda p, *args: seen.append(p) or sample(p, *args)
  batch, stats, position = method.collect(drifted, 0, jax.random.key(0))
  assert len(seen) == 1 and seen[0] is reference and position == 4
  m = np.asarray(batch.loss_mask)
  gc = np.asarray(batch.advantages)
  right = (gc * m).max(axis=1)
  np.testing.assert_array_equal(right[0::4], 1.0)  # known answers: rows 0 mod 4 right, 1 mod 4 wrong
  np.testing.assert_array_equal(right[1::4], 0.0)
  np.testing.assert_array_equal(gc, np.where(m, right[:, None], 0.0))  # nothing deduplicated, every row kept
  assert stats["prompts_per_step"] == 4 and stats["positive_rows"] == right.sum() >= 4
  # the coefficients through the paradigm's loss, by hand on the first two rows' lengths
  from grpo_jax import losses
  logp = jnp.zeros(m.shape, jnp.float32)
  grad = np.asarray(jax.grad(lambda lp: losses.paradigm_loss(lp, batch.advantages, batch.loss_mask))(logp))
  lengths = m.sum(axis=1)
  np.testing.assert_allclose(grad, np.where(m, -right[:, None] / (16 * lengths[:, None]), 0.0), rtol=1e-6)
  tok, e = method.task.tokenizer, method.task.train_example(0)
  assert lengths[0] == len(tok.encode(f"#### {e.answer}", add_special_tokens=False)) + 1  # and the end token
  assert lengths[0] == 7  # a right row of 7 tokens: -1 / (16 x 7) on each
  np.testing.assert_allclose(grad[0][m[0]], np.full(7, -1 / 112), rtol=1e-6)
  assert not grad[1].any()


def test_pooled_rft_and_sft_report_prompts_and_positive_rows(sft_policy, known_answers):
  method, params, _ = _method("rft", sft_policy)
  method.prepare(params, jax.random.key(0))
  _, stats, _ = method.collect(params, 0, None)
  # 16 rows of the deduplicated pool, all at GC = 1, from however many distinct prompts they came from
  assert stats["positive_rows"] == 16 and 1 <= stats["prompts_per_step"] <= 16
  assert stats["prompts_per_step"] == len(set(method.prompt_of_row[
      [methods.rft.offline.epoch_order(len(method.data.tokens), i, 0) for i in range(16)]].tolist()))
  method, _, _ = _method("sft", sft_policy)
  _, stats, _ = method.collect(params, 0, None)
  assert stats["prompts_per_step"] == stats["positive_rows"] == 16


def test_likelihood_temperature_is_the_imitation_methods_likelihood(sft_policy, known_answers):
  """--likelihood_temperature=0.7: Online RFT's loss is the paradigm loss of log softmax(logits / 0.7)."""
  from grpo_jax import logprobs as logprobs_lib
  from grpo_jax import losses
  method, params, _ = _method("online_rft", sft_policy, "--likelihood_temperature=0.7")
  batch, _, _ = method.collect(params, 0, jax.random.key(0))
  totals = {"num_sequences": batch.tokens.shape[0], "num_tokens": jnp.sum(batch.loss_mask)}
  loss, _ = method.objective()(params, batch, totals)
  for t, same in ((0.7, True), (1.0, False)):
    logp = logprobs_lib.token_logprobs(params, method.model_config, batch.tokens, batch.attention_mask, temperature=t)
    want = losses.paradigm_loss(logp, batch.advantages, batch.loss_mask)
    assert (abs(float(loss) - float(want)) < 1e-5) == same, t
  _parse("--algo=grpo", "--likelihood_temperature=0.7")  # GRPO trains --temperature's (0.7): it may say so
  assert cli.config_from_flags().algorithm.likelihood_temperature == 0.7
  for algo, t in (("grpo", 0.5), ("dpo", 0.7)):  # not GRPO's own; DPO trains T = 1's
    _parse(f"--algo={algo}", f"--likelihood_temperature={t}")
    with pytest.raises(ValueError, match="--likelihood_temperature is the imitation methods'"):
      cli.config_from_flags()


def test_ppo_explained_variance():
  returns = np.array([[1.0, 2.0, 3.0, 0.0]])
  mask = np.array([[1, 1, 1, 0]], bool)
  assert float(ppo_lib.explained_variance(returns, returns, mask)) == 1.0
  assert float(ppo_lib.explained_variance(np.full_like(returns, 2.0), returns, mask)) == pytest.approx(0.0)
  assert float(ppo_lib.explained_variance(np.array([[1.0, 3.0, 2.0, 9.0]]), returns, mask)) == pytest.approx(1 - 1.0)
  assert float(ppo_lib.explained_variance(returns, np.ones_like(returns), mask)) == 0.0  # Var(R) = 0


@pytest.mark.parametrize("algo", ["ppo", "online_rft", "rft", "rft_table10", "dpo", "sft"])
def test_every_algo_runs_end_to_end(sft_policy, tmp_path, algo, known_answers):
  validation = ["--num_validation=8"] if algo == "rft_table10" else []  # and a validation split, once
  _parse(f"--work_dir={tmp_path}", f"--init_checkpoint={sft_policy}", f"--algo={algo}", "--steps=2",
         "--eval_every=0", "--learning_rate=1e-3", "--reward=correctness:1.0,format:0.5", *validation)
  summary = grpo_math.run()
  FLAGS.unparse_flags()
  assert summary["algo"] == algo and 0 <= summary["final_accuracy"] <= 1 and summary["peak_rss_mib"] > 0
  if validation:
    assert summary["num_validation_problems"] == 8 and 0 <= summary["final_val_accuracy"] <= 1
  else:
    assert "final_val_accuracy" not in summary
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if "train/loss" in r] == [1, 2]
  final, start = models.load_hf(tmp_path / "final_policy")[0], models.load_hf(sft_policy)[0]
  moved = not np.array_equal(final["embed"]["embedding"], start["embed"]["embedding"])
  assert moved  # known answers: some samples are right, so even online RFT (GC = I(correct)) has data
  if algo in ("ppo", "online_rft", "rft_table10"):
    assert all(0.25 <= r["train/accuracy"] for r in records if "train/accuracy" in r)
  if algo in ("rft", "dpo"):
    data = [r for r in records if any(k.startswith("data/") for k in r)]
    assert data and data[0]["data/offline_samples"] == 32 * 4
    if algo == "rft":  # at least the 32 injected right answers (one per prompt), distinct per prompt
      assert data[0]["data/rft_examples"] >= 32
    else:  # every prompt has an injected right and wrong sample: one pair each
      assert data[0]["data/dpo_pairs"] == 32


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_pp"])
def test_advantage_estimators_replace_the_group_normalisation(sft_policy, known_answers, estimator):
  method, params, reference = _method("grpo", sft_policy, f"--advantage_estimator={estimator}", "--beta=0.1")
  method.reference = jax.tree.map(lambda x: x * 1.5, reference)  # π_ref ≠ π_θ: a non-zero KL on every token
  batch, stats, _ = method.collect(params, 0, jax.random.key(0))
  b, g = method.config.rollout.batch_size, method.config.rollout.group_size
  adv, mask = np.asarray(batch.advantages), np.asarray(batch.loss_mask)
  assert adv.shape[0] == b * g
  if estimator == "rloo":  # Â_i = r_i − mean of the other G − 1 rewards of its prompt (correctness: 0/1)
    per_row = adv[np.arange(len(adv)), mask.argmax(1)]  # at the first completion token (prompt columns: 0)
    groups = per_row.reshape(b, g)
    np.testing.assert_allclose(groups.sum(1), 0.0, atol=1e-5)  # leave-one-out baselines sum to zero per group
    np.testing.assert_allclose(groups[:, 0] - groups[:, 1], g / (g - 1), rtol=1e-5)  # r_0 − r_1 = 1, scaled
    assert method.objective().keywords["loss_kwargs"]["beta"] == 0.1  # the KL stays in the loss
  else:  # KL in the per-token reward, returns whitened over the batch's tokens: mean 0, std 1 where masked in
    assert adv.ndim == 2
    values = adv[mask]
    assert abs(values.mean()) < 1e-4 and values.std() == pytest.approx(1.0, rel=1e-3)
    assert len(np.unique(np.round(adv[0][mask[0]], 5))) > 1  # the k1 penalty differs token by token
    assert method.objective().keywords["loss_kwargs"]["beta"] == 0.0  # and is not in the loss
    assert not method.objective().keywords["use_reference"]


@pytest.mark.parametrize("args, on_policy", [((), True), (("--num_epochs=2",), False),
                                             (("--minibatch_size=8",), False), (("--recompute_old_logprobs",), False)])
def test_grpo_skips_the_old_policy_forward_only_when_exact(sft_policy, args, on_policy):
  method, params, _ = _method("grpo", sft_policy, *args)
  assert method.on_policy() == on_policy and method.objective().keywords["on_policy"] == on_policy
  batch, _, _ = method.collect(params, 0, jax.random.key(0))
  completion = np.asarray(batch.loss_mask)
  old = np.asarray(batch.old_logp)[completion]
  if on_policy:
    assert np.all(old == 0)  # not computed: the objective uses stop_gradient(π_θ)
  else:
    assert np.all(old <= 0) and np.any(old < 0)  # the log-probs of the sampled tokens


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_batches_carry_the_samplers_logprobs_at_the_policys_temperature(sft_policy, temperature):
  """The sampler's log-probs in the batch are the trained policy's, softmax(logits / T): they equal the recomputed
  π_old up to float rounding (not the T = 1 values); at T = 1 without a correction they are π_old itself, and a
  correction recomputes π_old with a forward instead (one call of the π_old program, none without)."""
  for correction in ("none", "seq_mis"):
    method, params, _ = _method("grpo", sft_policy, f"--temperature={temperature}", "--num_epochs=2", "--beta=0",
                                f"--rollout_correction={correction}")
    calls = []
    forward = method.group_logprobs
    method.group_logprobs = lambda *a, **k: calls.append(1) or forward(*a, **k)  # noqa: E731
    batch, _, _ = method.collect(params, 0, jax.random.key(0))
    m = np.asarray(batch.loss_mask)
    sampler, old = np.asarray(batch.sampler_logp)[m], np.asarray(batch.old_logp)[m]
    assert np.all(sampler <= 0) and np.any(sampler < -0.01)
    np.testing.assert_allclose(sampler, old, atol=1e-4)
    if temperature == 1.0 and correction == "none":
      assert not calls and np.array_equal(sampler, old)  # π_old is the sampler's log-probs
    else:
      assert len(calls) == 1
    assert method.objective().keywords["correction_kwargs"]["correction"] == correction


@pytest.mark.parametrize("algo, correction", [("ppo", "seq_tis"), ("grpo", "token_mis")])
def test_rollout_corrections_run_end_to_end(sft_policy, tmp_path, algo, correction):
  """The policy's own samples (no `known_answers`: its injected tokens carry a made-up sampler log-prob, log ½)."""
  _parse(f"--work_dir={tmp_path}", f"--init_checkpoint={sft_policy}", f"--algo={algo}", "--steps=2",
         "--eval_every=0", f"--rollout_correction={correction}", "--temperature=1.0", "--num_test=4")
  grpo_math.run()
  FLAGS.unparse_flags()
  train = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
           if "train/loss" in line]
  assert len(train) == 2
  for r in train:  # float32: the sampler and the trainer agree to float rounding, so the weights are 1
    assert 0 <= r["train/mismatch_logp_diff_max"] < 1e-3 and r["train/mismatch_ratio_outside"] == 0
    assert r["train/rollout_is_weight_min"] == pytest.approx(1, abs=1e-3) == r["train/rollout_is_weight_max"]
    assert r["train/rollout_is_dropped_frac"] == 0


def test_shared_prompt_forwards_match_the_full_ones(sft_policy, known_answers):
  """GRPO with `shared_prompt_forward` (each prompt once per group): the same π_ref, loss and gradient as the
  full forwards on the same samples, up to float rounding; minibatches keep whole groups."""
  args = ("--beta=0.1", "--temperature=0.7", "--minibatch_size=8", "--num_epochs=2")
  shared, params, reference = _method("grpo", sft_policy, *args)
  full, _, _ = _method("grpo", sft_policy, *args, "--noshared_prompt_forward")
  assert shared.grouped() and shared.rows_per_item == 4 and not full.grouped() and full.rows_per_item == 1
  for method in (shared, full):
    method.reference = jax.tree.map(lambda x: x * 1.1, reference)  # π_ref ≠ π_θ
  batch_shared, _, _ = shared.collect(params, 0, jax.random.key(3))
  batch_full, _, _ = full.collect(params, 0, jax.random.key(3))
  np.testing.assert_array_equal(batch_shared.tokens, batch_full.tokens)
  for name in ("ref_logp", "old_logp"):  # π_old: recomputed (two epochs), at T = 0.7
    np.testing.assert_allclose(getattr(batch_shared, name), getattr(batch_full, name), atol=2e-5, err_msg=name)
  totals = {"num_sequences": jnp.float32(8), "num_tokens": jnp.sum(batch_full.loss_mask[:8])}
  rows = jnp.arange(8)  # two whole groups
  part = jax.tree.map(lambda x: x[rows], batch_full)
  value_and_grad = lambda objective: jax.jit(jax.value_and_grad(objective, has_aux=True))  # eager: 20 s of compiles
  (loss_s, _), grad_s = value_and_grad(shared.objective())(params, part, totals)
  (loss_f, _), grad_f = value_and_grad(full.objective())(params, part, totals)
  np.testing.assert_allclose(loss_s, loss_f, atol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), grad_s, grad_f)
  parts = shared.minibatches(batch_shared, jax.random.key(0), 0, 8)
  for p in parts:  # every minibatch is whole groups: rows 4k..4k+3 share their prompt
    prompts = np.asarray(p.tokens)[:, :16].reshape(2, 4, 16)
    assert (prompts == prompts[:, :1]).all()


@pytest.fixture
def short_samples(monkeypatch):
  """The sampler's rows cut to 1-9 tokens (row r keeps 1 + r mod 9 of its own), so a step's longest completion is
  well under `--max_new_tokens` (24) and the batch can drop columns."""
  real_sample = rollouts_lib.sampling.sample

  def sample(*args, **kwargs):
    s = sampling.SampleOutput(*[np.array(x) for x in real_sample(*args, **kwargs)])
    keep = 1 + np.arange(len(s.tokens)) % 9
    s.mask[:] = np.arange(s.tokens.shape[1]) < keep[:, None]
    s.tokens[~s.mask] = 0
    s.logprobs[~s.mask] = 0.0
    s.lengths[:], s.truncated[:] = keep, False
    return s

  monkeypatch.setattr(rollouts_lib.sampling, "sample", sample)


@pytest.mark.parametrize("algo", ["grpo", "ppo", "online_rft"])
def test_batches_keep_the_columns_up_to_the_longest_completion(sft_policy, short_samples, known_answers, algo):
  """`--completion_pad_multiple=4`: rows of at most 9 tokens give batches of at most 12 completion columns instead
  of 24, the same tokens, masks and log-probs as the full batch's first columns, and the same loss and gradient. Known
  answers (`#### <answer>` and EOS, at most 9 tokens) make rows right and wrong: non-zero advantages and GC."""
  args = ("--temperature=0.7",) + (("--beta=0.1",) if algo != "online_rft" else ())  # Online RFT has no KL term
  args += ("--sampler=static",)  # `short_samples` shortens the static sampler's rows
  trimmed, params, reference = _method(algo, sft_policy, *args, "--completion_pad_multiple=4")
  full, _, _ = _method(algo, sft_policy, *args, "--completion_pad_multiple=0")
  for method in (trimmed, full):
    method.reference = jax.tree.map(lambda x: x * 1.1, reference)  # π_ref ≠ π_θ
  if algo == "ppo":
    params = trimmed.init_params(params, jax.random.key(1))
  batch_t, stats_t, _ = trimmed.collect(params, 0, jax.random.key(3))
  batch_f, _, _ = full.collect(params, 0, jax.random.key(3))
  p = 16  # --max_prompt_len
  longest = int(np.asarray(batch_f.attention_mask)[:, p:].sum(1).max())
  width = -(-longest // 4) * 4  # the longest completion rounded up to a multiple of 4
  assert longest <= 9 and batch_t.tokens.shape[1] == p + width and batch_f.tokens.shape[1] == p + 24
  if algo == "grpo":
    assert stats_t["completion_width"] == width
  assert not np.asarray(batch_f.attention_mask)[:, p + longest:].any()  # the dropped columns are padding
  for name, a in batch_t._asdict().items():
    np.testing.assert_allclose(a, np.asarray(getattr(batch_f, name))[:, :p + width], atol=2e-5, err_msg=name)
  totals = {"num_sequences": jnp.float32(len(batch_t.tokens)), "num_tokens": jnp.sum(batch_t.loss_mask)}
  value_and_grad = lambda method: jax.jit(jax.value_and_grad(method.objective(), has_aux=True))  # noqa: E731
  (loss_t, metrics_t), grad_t = value_and_grad(trimmed)(params, batch_t, totals)
  (loss_f, metrics_f), grad_f = value_and_grad(full)(params, batch_f, totals)
  # Rows right and wrong: non-zero advantages (GRPO, PPO) and GC (online RFT) enter the gradients compared below.
  assert np.any(np.asarray(batch_f.advantages) > 0) and np.any(np.asarray(batch_f.advantages) != 1.0)
  assert float(loss_f) != 0.0
  np.testing.assert_allclose(loss_t, loss_f, rtol=1e-5, atol=1e-6)
  for name in set(metrics_t) & {"pg_loss", "kl", "value_loss"}:
    np.testing.assert_allclose(metrics_t[name], metrics_f[name], rtol=1e-5, atol=1e-6, err_msg=name)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6), grad_t, grad_f)


def test_the_engine_and_the_static_sampler_roll_out_alike(sft_policy):
  """`--sampler=engine` (3 slots for 5 prompts x 4 samples, so slots refill as the SFT policy's completions end
  at their own lengths) and `--sampler=static`: the same completions, rewards and held-out metrics."""
  from experiments.runner import evaluation as evaluation_lib
  from experiments.runner import placement as placement_lib
  got = {}
  for sampler in ("engine", "static"):
    method, params, _ = _method("grpo", sft_policy, f"--sampler={sampler}", "--num_slots=3", "--eval_samples=4")
    examples = [method.task.train_example(i) for i in range(5)]
    scored = method.rollouts.sample(params, examples, jax.random.key(3), 4)
    metrics = evaluation_lib.evaluate(params, method.model_config, method.task, method.config, jax.random.key(4),
                                      placement_lib.Placement())
    got[sampler] = scored, metrics
  (engine, engine_metrics), (static, static_metrics) = got["engine"], got["static"]
  lengths = np.asarray(static.samples.lengths)
  assert lengths.min() < lengths.max() and not bool(np.all(static.samples.truncated))  # end tokens, unequal lengths
  for name in ("tokens", "lengths", "truncated", "mask"):
    np.testing.assert_array_equal(getattr(engine.samples, name), getattr(static.samples, name))
  np.testing.assert_allclose(engine.samples.logprobs, static.samples.logprobs, atol=1e-5)
  np.testing.assert_array_equal(engine.rewards, static.rewards)
  assert engine_metrics == static_metrics and "maj@4" in engine_metrics


# Rewards of each sampling round's 4 groups of 4 (1: varied within the group, 0: all equal).
_VARIED = {0: [1, 0, 0, 1], 1: [0, 1, 0, 0], 2: [0, 0, 0, 0], 3: [0, 0, 1, 1]}


@pytest.mark.parametrize("max_rounds", [2, 4])
def test_dynamic_sampling_keeps_varied_groups_and_refills(sft_policy, monkeypatch, max_rounds):
  """DAPO dynamic sampling (issue 55): the step's batch holds the groups whose rewards vary, in the order sampled,
  from as many rounds as it takes (at most --dynamic_sampling_max_rounds); short of B, the first zero-variance
  groups fill it, left out of the loss. Rewards are set per group: round 0 keeps groups 0 and 3, round 1 group 1,
  round 2 none, round 3 groups 2 and 3 (of which one is needed)."""
  method, params, _ = _method("grpo", sft_policy, "--dynamic_sampling",
                              f"--dynamic_sampling_max_rounds={max_rounds}")
  b, g = method.config.rollout.batch_size, method.config.rollout.group_size
  rounds = []
  real_sample = method.rollouts.sample

  def sample(params, examples, key, group_size):
    scored = real_sample(params, examples, key, group_size)
    varied = np.repeat(_VARIED[len(rounds)], g).astype(bool)
    rewards = np.where(varied & (np.arange(b * g) % g == 0), 1.0, 0.0).astype(np.float32)  # one right per group
    rounds.append((examples, np.asarray(scored.host.tokens)))
    return scored._replace(rewards=rewards)

  monkeypatch.setattr(method.rollouts, "sample", sample)
  batch, stats, position = method.collect(params, 0, jax.random.key(0))
  if max_rounds == 2:  # groups (0,0), (0,3), (1,1), then the first zero-variance one, (0,1), masked out
    picked, in_loss = [(0, 0), (0, 3), (1, 1), (0, 1)], [True, True, True, False]
  else:
    picked, in_loss = [(0, 0), (0, 3), (1, 1), (3, 2)], [True] * 4
  assert len(rounds) == stats["sampling_rounds"] == {2: 2, 4: 4}[max_rounds]
  assert position == b * len(rounds)  # every round draws B new prompts
  assert [e.question for e in rounds[0][0]] != [e.question for e in rounds[1][0]]
  p = method.config.task.max_prompt_len
  tokens, mask = np.asarray(batch.tokens), np.asarray(batch.loss_mask)
  for slot, ((r, group), kept) in enumerate(zip(picked, in_loss)):
    expected = rounds[r][1][group * g:(group + 1) * g]  # the completions, as sampled
    width = tokens.shape[1] - p
    np.testing.assert_array_equal(tokens[slot * g:(slot + 1) * g, p:], expected[:, :width])
    assert mask[slot * g:(slot + 1) * g].any() == kept
  adv = np.abs(np.asarray(batch.advantages) * mask).reshape(b, -1)
  assert (adv[np.asarray(in_loss)].max(1) > 0).all()  # every kept group has a non-zero advantage
  assert stats["zero_variance_groups"] == pytest.approx(1 - np.mean(in_loss))


def test_length_buckets_collect_and_update_as_the_padded_layout(sft_policy, monkeypatch):
  """`--token_layout=buckets` (issue 53): the same rollouts, π_ref and advantages at every column of the padded
  batch (the bucketed one keeps all --max_new_tokens columns, zeros past the ends), and an update to the same
  params; π_old recomputed (temperature 0.9) goes through the bucketed forward too, in blocks of 8 columns (the
  floor of tokens a block lowered to 0: with 2 rows a micro-batch the default runs one block of 24)."""
  method, _, _ = _method("grpo", sft_policy, "--token_layout=buckets", "--batch_size=4", "--group_size=4")
  assert method.scoring_buckets().widths == (24,) and method.scoring_buckets().num_micro_batches == 8
  monkeypatch.setattr(length_buckets, "MIN_BLOCK_TOKENS", 0)
  assert method.scoring_buckets().widths == (8, 12, 24)
  got = {}
  for layout in ("padded", "buckets"):
    method, params, _ = _method("grpo", sft_policy, f"--token_layout={layout}", "--batch_size=4", "--group_size=4",
                                "--temperature=0.9", "--recompute_old_logprobs", "--learning_rate=1e-3")
    batch, stats, _ = method.collect(params, 0, jax.random.key(0))
    optimizer = method.optimizer(total_updates=4, warmup=0)
    step = training.make_train_step(method.objective(), optimizer, bucketed=method.bucketed_update())
    state, metrics = step(training.init_train_state(params, optimizer), batch)
    got[layout] = batch, stats, state.params, metrics, method
  (padded, _, padded_params, padded_metrics, _), (bucketed, stats, params, metrics, method) = got.values()
  assert method.bucketed_update().buckets.widths == (8, 12, 24) and method.bucketed_update().buckets.num_micro_batches == 8
  p = method.config.task.max_prompt_len
  lengths = np.asarray(bucketed.attention_mask.sum(1) - padded.attention_mask[:, :p].sum(1))
  assert lengths.min() < lengths.max()  # unequal lengths
  width = padded.tokens.shape[1]
  assert method.config.rollout.max_new_tokens == 24  # the tests' flags
  assert bucketed.tokens.shape[1] == method.config.task.max_prompt_len + 24 >= width  # all columns vs the longest
  assert stats["completion_width"] == 24.0
  for name in ("tokens", "attention_mask", "loss_mask", "advantages"):
    np.testing.assert_array_equal(getattr(bucketed, name)[:, :width], getattr(padded, name))
    assert not np.asarray(getattr(bucketed, name)[:, width:]).any()
  for name in ("old_logp", "ref_logp"):
    np.testing.assert_allclose(getattr(bucketed, name)[:, :width], getattr(padded, name), atol=2e-5)
  # π_old here is π_θ (one step, no update before it), so the policy gradient is ~0 in both layouts; the bucketed
  # forwards (blocks of the narrowest width) and the bucketed update (the ladder's widths) round differently
  # (|Δ old_logp| ~1e-6, a ratio of 1 ± 1e-6, a gradient norm ~1e-8 where the padded one is 0), and Adam normalises
  # that gradient into steps of up to a tenth of the learning rate (1e-3): the params agree to 1e-4, the gradients
  # (grad_norm below) to 1e-6.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4), params, padded_params)
  for name in ("loss", "kl", "entropy", "grad_norm"):
    np.testing.assert_allclose(metrics[name], padded_metrics[name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("group_size", [1, 2])
def test_ppo_length_buckets_collect_and_update_as_the_padded_layout(sft_policy, group_size):
  """PPO with `--token_layout=buckets` (issue 53): π_old (recomputed, temperature 0.9), π_ref and V_ψ in length
  buckets give the padded batch (log-probs, old values, returns, advantages) at its columns and zeros past them, and
  one update moves both models as the padded one does."""
  import optax  # pylint: disable=import-outside-toplevel
  got = {}
  for layout in ("padded", "buckets"):
    method, params, _ = _method("ppo", sft_policy, f"--token_layout={layout}", f"--batch_size={8 // group_size}",
                                f"--group_size={group_size}", "--temperature=0.9", "--recompute_old_logprobs",
                                "--beta=0.05", "--reward=correctness:1.0,format:0.5")
    trained = method.init_params(params, jax.random.key(0))
    head = trained["value"]["head"]  # a zero head at init: values of 0 would compare nothing
    trained["value"]["head"] = dict(head, kernel=jax.random.normal(jax.random.key(1), head["kernel"].shape))
    reference = jax.tree.map(lambda x: x * 1.01, method.reference)  # π_ref off π_old: a KL reward on every token
    method.use_reference(reference)
    batch, stats, _ = method.collect(trained, 0, jax.random.key(0))
    start = jax.tree.map(np.array, trained)  # (the update donates the state)
    optimizer = optax.sgd(1e-2)
    step = training.make_train_step(method.objective(), optimizer, bucketed=method.bucketed_update())
    state, metrics = step(training.init_train_state(trained, optimizer), batch)
    got[layout] = batch, stats, state.params, metrics, method, start
  (padded, padded_stats, padded_params, padded_metrics, *_), (bucketed, stats, params, metrics, method, start) = (
      got.values())
  assert method.rows_per_item == group_size and method.scoring_forwards() == ("π_old", "π_ref")
  assert method.bucketed_update().buckets.widths == (8, 12, 24)
  assert method.forward_layout()["buckets"].num_micro_batches == 8
  p, width = method.config.task.max_prompt_len, padded.tokens.shape[1]
  lengths = np.asarray(bucketed.attention_mask[:, p:].sum(1))
  assert lengths.min() < lengths.max() and bucketed.tokens.shape[1] == p + 24 >= width  # all columns vs the longest
  for name in ("tokens", "attention_mask", "loss_mask"):
    np.testing.assert_array_equal(getattr(bucketed, name)[:, :width], getattr(padded, name))
  for name in ("old_logp", "ref_logp", "old_values", "returns", "advantages"):
    np.testing.assert_allclose(getattr(bucketed, name)[:, :width], getattr(padded, name), atol=2e-5, err_msg=name)
    assert not np.asarray(getattr(bucketed, name)[:, width:]).any()
  assert float(jnp.abs(padded.old_values).max()) > 0.1 and float(jnp.abs(padded.advantages).max()) > 0.1
  for name in ("explained_variance", "return_mean", "value_start_mean", "kl_reward"):
    np.testing.assert_allclose(stats[name], padded_stats[name], rtol=1e-4, atol=1e-6)
  assert padded_stats["kl_reward"] != 0.0
  for role in ("policy", "value"):  # both models moved, to the same params
    assert max(jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), padded_params[role],
                                            start[role]))) > 1e-4, role
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), params, padded_params)
  for name in ("loss", "pg_loss", "value_loss", "entropy", "grad_norm"):
    np.testing.assert_allclose(metrics[name], padded_metrics[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("name,flags,expected", [
    ("grpo", (), ("π_ref",)),  # on-policy: no π_old; β = 0.04
    ("grpo", ("--beta=0",), ()),
    ("grpo", ("--recompute_old_logprobs",), ("π_old", "π_ref")),
    ("grpo", ("--num_epochs=2",), ("π_old", "π_ref")),  # temperature 0.7: the sampler's log-probs are not π_old's
    ("grpo", ("--num_epochs=2", "--temperature=1.0", "--beta=0"), ()),  # ... at T = 1 they are
    ("grpo", ("--advantage_estimator=reinforce_pp", "--temperature=1.0", "--rollout_correction=token_tis"),
     ("π_old", "π_ref")),
    ("ppo", ("--group_size=1",), ("π_old", "π_ref")),
    ("ppo", ("--group_size=1", "--temperature=1.0", "--beta=0"), ()),
])
def test_collect_runs_the_forwards_the_method_declares(sft_policy, name, flags, expected):
  """`scoring_forwards` is the one answer `collect` and `trainer.programs` read (issue 54): the forwards a step
  runs are exactly those it names, counted on the functions themselves."""
  method, params, _ = _method(name, sft_policy, "--batch_size=2", "--group_size=2", *flags)
  assert method.scoring_forwards() == expected
  calls = []
  for attr in ("group_logprobs", "logprobs"):
    owner = method if attr == "group_logprobs" else method.rollouts
    if hasattr(owner, attr):
      real = getattr(owner, attr)
      setattr(owner, attr, lambda p, *a, real=real: calls.append(p is method.reference) or real(p, *a))
  trained = method.init_params(params, jax.random.key(0))
  method.collect(trained, 0, jax.random.key(0))
  assert sorted("π_ref" if is_reference else "π_old" for is_reference in calls) == sorted(expected)


@pytest.mark.parametrize("name,flags", [("grpo", ("--recompute_old_logprobs",)), ("ppo", ("--group_size=1",))])
def test_collect_never_waits_only_to_time_itself(sft_policy, monkeypatch, name, flags):
  """Issue 54: `collect` dispatches its forwards and returns; no wait on the batch is added to time the scoring
  (the update's metrics are the step's sync, docs/train.md), and the times it logs are still there."""
  method, params, _ = _method(name, sft_policy, "--batch_size=2", *flags)
  trained = method.init_params(params, jax.random.key(0))
  waits = []
  monkeypatch.setattr(jax, "block_until_ready", lambda tree: waits.append(tree) or tree)
  batch, stats, _ = method.collect(trained, 0, jax.random.key(0))
  assert not waits
  assert stats["time_sampling"] > 0 and stats["time_scoring"] >= 0
  assert np.isfinite(np.asarray(batch.old_logp)).all()


def test_the_host_state_a_checkpoint_records_comes_back(sft_policy):
  # Issue 54: the loop passes the checkpoint's metadata in; the method restores its own counters (a checkpoint
  # saved before the count was recorded leaves it as it is).
  method, _, _ = _method("grpo", sft_policy)
  method.rollouts.prompts_truncated = 3
  meta = method.host_state()
  assert meta == {"prompts_truncated": 3}
  resumed, _, _ = _method("grpo", sft_policy)
  resumed.restore_host_state({"step": 7, **meta})
  assert resumed.rollouts.prompts_truncated == 3
  resumed.restore_host_state({"step": 7})
  assert resumed.rollouts.prompts_truncated == 3
