"""Reward models (grpo_jax/reward_models): scores, training, metrics, data and save/load."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax import models
from grpo_jax import reward_models as rm
from grpo_jax import sampling
from grpo_jax import training
from grpo_jax.data import Example
from grpo_jax.losses import reward as reward_losses

CONFIG = models.ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=False,
                            qkv_bias=True)
_outcome = jax.jit(rm.outcome_scores, static_argnums=1)
_steps = jax.jit(rm.step_scores, static_argnums=1)


def _trained_head(config=CONFIG, seed=0):
  policy = models.init_params(config, jax.random.key(seed))
  params = rm.init_reward_params(policy, config, jax.random.key(seed + 1), head_scale=1.0)
  params["head"]["bias"] = jnp.asarray(0.3)
  return policy, params


def test_init_copies_the_backbone_and_starts_at_one_half():
  policy = models.init_params(CONFIG, jax.random.key(0))
  params = rm.init_reward_params(policy, CONFIG, jax.random.key(1))
  np.testing.assert_array_equal(params["backbone"]["embed"]["embedding"], policy["embed"]["embedding"])
  assert "lm_head" not in params["backbone"]
  tokens = jax.random.randint(jax.random.key(2), (3, 7), 0, CONFIG.vocab_size)
  scores = _outcome(params, CONFIG, tokens, jnp.ones((3, 7), bool))
  np.testing.assert_array_equal(scores, 0.0)   # σ = 1/2, BCE = ln 2
  loss, _ = reward_losses.outcome_bce_loss(scores, jnp.array([1.0, 0.0, 1.0]))
  np.testing.assert_allclose(loss, np.log(2.0), rtol=1e-6)


def test_last_token_index():
  mask = jnp.array([[False, True, True, False], [True, True, True, True], [False] * 4])
  np.testing.assert_array_equal(rm.last_token_index(mask), [2, 3, 0])


def test_outcome_and_step_scores_read_the_per_token_scores():
  _, params = _trained_head()
  tokens = jax.random.randint(jax.random.key(3), (2, 9), 0, CONFIG.vocab_size)
  mask = jnp.array([[False, False, True, True, True, True, True, False, False], [True] * 9])
  values = models.scalar_apply(params, CONFIG, tokens, attention_mask=mask)
  np.testing.assert_allclose(_outcome(params, CONFIG, tokens, mask), [values[0, 6], values[1, 8]], rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(_outcome(params, CONFIG, tokens, mask, jnp.array([4, 2])), [values[0, 4], values[1, 2]],
                             rtol=1e-5, atol=1e-6)
  ends, step_mask = jnp.array([[3, 6, 0], [1, 5, 8]]), jnp.array([[True, True, False], [True, True, True]])
  scores = _steps(params, CONFIG, tokens, mask, ends, step_mask)
  np.testing.assert_allclose(scores, [[values[0, 3], values[0, 6], 0.0], [values[1, 1], values[1, 5], values[1, 8]]],
                             rtol=1e-5, atol=1e-6)
  # A step score depends only on the tokens up to its end (causal): changing later tokens leaves it.
  changed = tokens.at[1, 6:].set((tokens[1, 6:] + 1) % CONFIG.vocab_size)
  np.testing.assert_allclose(_steps(params, CONFIG, changed, mask, ends, step_mask)[1, :2], scores[1, :2], rtol=1e-5)


def _labelled_set(n=32, length=8, k=3, seed=0):
  """Random sequences; a step is right iff the token at its end is in the lower half of the vocabulary."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, CONFIG.vocab_size, (n, length)).astype(np.int32)
  ends = np.stack([np.sort(rng.choice(np.arange(2, length), k, replace=False)) for _ in range(n)]).astype(np.int32)
  step_mask = np.arange(k)[None] < rng.integers(1, k + 1, n)[:, None]
  labels = (np.take_along_axis(tokens, ends, 1) < CONFIG.vocab_size // 2).astype(np.float32) * step_mask
  outcome = labels[:, 0]
  return rm.RewardData(tokens, np.ones((n, length), bool), ends, labels, step_mask,
                       np.arange(n, dtype=np.int32) // 4, outcome)


@pytest.mark.parametrize("kind,loss", [("prm", "bce"), ("orm", "bce"), ("orm", "pairwise"), ("orm_steps", "bce"),
                                       ("orm_steps", "pairwise")])
def test_loss_falls_on_a_tiny_labelled_set(kind, loss):
  data = _labelled_set()
  if kind == "orm":  # one scored position per sequence: the first step's end
    data = data._replace(positions=data.positions[:, :1], labels=data.labels[:, :1],
                         loss_mask=np.ones((32, 1), bool))
  if kind == "orm_steps":  # outcome labels only: right iff every step is right, on every step end
    outcome = np.all((data.labels > 0.5) | ~data.loss_mask, axis=1).astype(np.float32)
    data = data._replace(labels=outcome[:, None] * data.loss_mask, outcome=outcome)
  policy = models.init_params(CONFIG, jax.random.key(0))
  optimizer = optax.adam(3e-3)
  state = training.init_train_state(rm.init_reward_params(policy, CONFIG, jax.random.key(1)), optimizer)
  step = rm.make_reward_train_step(CONFIG, optimizer, kind=kind, loss=loss)
  state, history = rm.fit(state, step, data, steps=40, batch_size=16, seed=0, log_every=1,
                          block=4 if loss == "pairwise" else 1)
  losses = [m["loss"] for _, m in history]
  assert len(losses) == 40 and len(data.group) == 32  # 32 sequences, a few dozen labelled steps
  if loss == "bce" and kind != "orm_steps":
    np.testing.assert_allclose(losses[0], np.log(2.0), rtol=1e-5)  # zero head: every σ is 1/2
  if kind == "orm_steps" and loss == "bce":  # zero head: p = 2^-k for k steps
    first = rm.take(data, rm.batch_indices(32, 16, 0, seed=0))
    p = 0.5 ** first.loss_mask.sum(1)
    expected = -np.mean(first.outcome * np.log(p) + (1 - first.outcome) * np.log(1 - p))
    np.testing.assert_allclose(losses[0], expected, rtol=1e-5)
  assert np.mean(losses[-5:]) < 0.5 * losses[0], losses
  metrics = rm.evaluate(state.params, CONFIG, data, kind=kind)
  level = "step" if kind == "prm" else "outcome"
  count = len(data.outcome) if kind == "orm_steps" else data.loss_mask.sum()
  assert metrics[f"{level}/auc"] > 0.9 and metrics[f"{level}/count"] == count
  if loss == "pairwise":  # it trains the ranking within a problem (blocks of 4 rows) and nothing else
    if kind == "orm":  # zero head: every pair has s⁺ = s⁻ (orm_steps: its noisy-AND depends on the step count)
      np.testing.assert_allclose(losses[0], np.log(2.0), rtol=1e-5)
    assert metrics["outcome/group_auc"] > 0.9
  if kind == "orm_steps" and loss == "bce":  # trained on outcomes only, its step scores rank the hidden step labels (0.83), better
    # than giving every step its row's outcome does (0.71: right rows have only right steps)
    step_truth, real = _labelled_set().labels[data.loss_mask], data.loss_mask
    by_row = np.broadcast_to(data.outcome[:, None], real.shape)[real]
    step_auc = rm.binary_auc(rm.score(state.params, CONFIG, data)[real], step_truth)
    assert step_auc > rm.binary_auc(by_row, step_truth)  # 0.12 above it here: margin for other processors
  right = data.outcome.reshape(8, 4) > 0.5  # 8 problems of 4 rows
  assert metrics["outcome/group_pairs"] == np.sum(right.sum(1) * (~right).sum(1))


def test_gradient_accumulation_is_exact():
  data = jax.tree.map(jnp.asarray, _labelled_set(n=8))
  policy = models.init_params(CONFIG, jax.random.key(0))
  optimizer = optax.sgd(0.1)
  params = rm.init_reward_params(policy, CONFIG, jax.random.key(1), head_scale=1.0)
  results = []
  for micro in (1, 4):
    state = training.init_train_state(jax.tree.map(jnp.copy, params), optimizer)
    step = rm.make_reward_train_step(CONFIG, optimizer, kind="prm", num_micro_batches=micro)
    state, metrics = step(state, data)
    results.append((state.params, float(metrics["loss"])))
  np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-6), results[0][0], results[1][0])


def test_group_auc_counts_only_pairs_within_a_problem():
  # Problem 7: pos 0.9 vs neg 0.2 ✓, 0.5 ✗(0.9>0.5 ✓) → pos {0.9}, neg {0.2, 0.5}: 2 wins of 2.
  # Problem 3: pos {0.1, 0.4} vs neg {0.4}: 0.1 < 0.4 ✗, 0.4 = 0.4 ½ → ½ of 2.
  # Problem 5 (all wrong) adds no pair. Pooled: (2 + ½) / 4. Globally the easy problem 7 ranks
  # high and the AUC is higher than within problems.
  scores = [0.9, 0.2, 0.5, 0.1, 0.4, 0.4, 0.8]
  labels = [1, 0, 0, 1, 1, 0, 0]
  groups = [7, 7, 7, 3, 3, 3, 5]
  auc, pairs = rm.group_auc(scores, labels, groups)
  assert pairs == 4 and auc == 2.5 / 4
  # A reward model that only knows the problem: within-problem chance, globally perfect.
  difficulty = [1.0, 1.0, 0.0, 0.0]
  assert rm.group_auc(difficulty, [1, 0, 0, 0], [1, 1, 2, 2]) == (0.5, 1)
  assert rm.binary_auc(difficulty, [1, 0, 0, 0]) == 5 / 6
  auc, pairs = rm.group_auc([0.3, 0.1], [1, 1], [1, 1])
  assert pairs == 0 and np.isnan(auc)


def test_binary_auc_and_accuracy_hand_computed():
  # Pairs (pos, neg): (0.35, 0.1) ✓ (0.35, 0.4) ✗ (0.8, 0.1) ✓ (0.8, 0.4) ✓ → 3/4.
  assert rm.binary_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
  assert rm.binary_auc([1.0, 1.0, 0.0], [1, 0, 0]) == 0.75  # the tie counts one half
  assert rm.binary_auc([3.0, 2.0, 1.0], [1, 1, 1]) != rm.binary_auc([3.0, 2.0, 1.0], [1, 1, 1])  # NaN
  assert rm.binary_accuracy([-1.0, 2.0, 0.0, 0.5], [0, 1, 1, 0.25]) == 0.5
  np.testing.assert_array_equal(rm.outcome_from_steps(np.array([[1.0, -2.0, 5.0], [3.0, 0.0, 0.0]]),
                                                      np.array([[True, True, False], [False] * 3])), [-2.0, -np.inf])


def test_batch_indices_are_per_epoch_permutations():
  rows = np.concatenate([rm.batch_indices(5, 3, s, seed=2) for s in range(5)])
  for epoch in range(3):
    assert sorted(rows[5 * epoch:5 * epoch + 5]) == list(range(5))
  np.testing.assert_array_equal(rm.batch_indices(5, 3, 2, seed=2), rows[6:9])  # depends only on the step
  grouped = np.concatenate([rm.batch_indices(12, 8, s, seed=0, block=4) for s in range(3)])
  assert sorted(grouped[:12]) == list(range(12)) and sorted(grouped[12:]) == list(range(12))
  for start in range(0, 24, 4):  # the 4 samples of a problem stay together, in order
    assert grouped[start] % 4 == 0 and list(grouped[start:start + 4]) == list(range(grouped[start], grouped[start] + 4))
  with pytest.raises(ValueError, match="blocks of 5 rows from 12"):
    rm.batch_indices(12, 8, 0, seed=0, block=5)


def test_build_reward_data_from_samples(tmp_path):
  models.save_char_tokenizer(tmp_path)
  tok = models.load_tokenizer(tmp_path)
  example = Example(question="(8-7+7)*4", answer="32", solution="8-7=1\n1+7=8\n8*4=32\n#### 32")
  texts = ["8-7=1\n1+7=8\n8*4=32\n#### 32", "8-7=2\n2+7=9\n#### 9"]
  prompt = tok.encode("(8-7+7)*4\n", add_special_tokens=False)
  p, t = 12, 30
  prompt_tokens, prompt_mask = training.pad_left([prompt, prompt], p, tok.pad_token_id)
  comp = np.full((2, t), tok.pad_token_id, np.int32)
  lengths = []
  for i, text in enumerate(texts):
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    comp[i, :len(ids)] = ids
    lengths.append(len(ids))
  lengths = np.array(lengths)
  samples = sampling.SampleOutput(prompt_tokens, prompt_mask, comp, np.zeros((2, t), np.float32),
                                  np.arange(t)[None] < lengths[:, None], lengths, np.zeros(2, bool))
  orm = rm.build_reward_data(samples, texts, [example] * 2, tok, kind="orm")
  np.testing.assert_array_equal(orm.positions[:, 0], p + lengths - 1)  # the end token
  np.testing.assert_array_equal(orm.labels[:, 0], [1.0, 0.0])
  assert orm.tokens[0, orm.positions[0, 0]] == tok.eos_token_id
  labels = rm.exact_step_labels(texts, [example] * 2)
  prm = rm.build_reward_data(samples, texts, [example] * 2, tok, kind="prm", max_steps=5, step_label_rows=labels)
  np.testing.assert_array_equal(prm.loss_mask.sum(1), [4, 3])
  np.testing.assert_array_equal(prm.labels, [[1, 1, 1, 1, 0], [0, 0, 0, 0, 0]])
  chars = [tok.decode([int(prm.tokens[i, j])]) for i in range(2) for j in prm.positions[i][prm.loss_mask[i]]]
  assert chars == ["1", "8", "2", "2", "2", "9", "9"]
  np.testing.assert_array_equal(prm.outcome, [1.0, 0.0])
  assert prm.group[0] == prm.group[1] == rm.problem_id(example)
  # orm_steps: the PRM's positions, every real one labelled with the outcome.
  orm_steps = rm.build_reward_data(samples, texts, [example] * 2, tok, kind="orm_steps", max_steps=5)
  np.testing.assert_array_equal(orm_steps.positions, prm.positions)
  np.testing.assert_array_equal(orm_steps.loss_mask, prm.loss_mask)
  np.testing.assert_array_equal(orm_steps.labels, [[1, 1, 1, 1, 0], [0, 0, 0, 0, 0]])
  with pytest.raises(ValueError, match="row 1: 2 step labels for 3 segments"):
    rm.build_reward_data(samples, texts, [example] * 2, tok, kind="prm", max_steps=5,
                         step_label_rows=[labels[0], labels[1][:2]])


@pytest.mark.parametrize("tied", [False, True])
def test_save_load_round_trip_gives_identical_scores(tmp_path, tied):
  config = models.ModelConfig(**{**CONFIG.__dict__, "tie_word_embeddings": tied})
  _, params = _trained_head(config)
  out = rm.save_reward_model(params, config, tmp_path / "rm", kind="prm")
  loaded, loaded_config, kind = rm.load_reward_model(out)
  assert kind == "prm" and loaded_config.hidden_size == config.hidden_size
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  tokens = jax.random.randint(jax.random.key(4), (3, 10), 0, config.vocab_size)
  mask = jnp.ones((3, 10), bool)
  np.testing.assert_array_equal(rm.outcome_scores(loaded, loaded_config, tokens, mask),
                                rm.outcome_scores(params, config, tokens, mask))
  # The backbone directory is a plain HF checkpoint.
  backbone, _ = models.load_hf(out)
  np.testing.assert_array_equal(backbone["embed"]["embedding"], params["backbone"]["embed"]["embedding"])


def test_load_errors(tmp_path):
  _, params = _trained_head()
  with pytest.raises(models.CheckpointError, match="reward model directory does not exist"):
    rm.load_reward_model(tmp_path / "nope")
  models.save_hf(models.init_params(CONFIG, jax.random.key(0)), CONFIG, tmp_path / "policy")
  with pytest.raises(models.CheckpointError, match="missing reward_head.safetensors in .*not a reward model"):
    rm.load_reward_model(tmp_path / "policy")
  out = rm.save_reward_model(params, CONFIG, tmp_path / "rm", kind="orm")
  head = (out / rm.HEAD_FILE).read_bytes()
  (out / rm.HEAD_FILE).write_bytes(head[:len(head) // 2])
  with pytest.raises(models.CheckpointError, match="reward_head.safetensors: unreadable"):
    rm.load_reward_model(out)
  small = {"backbone": params["backbone"], "head": {"kernel": jnp.zeros(16), "bias": jnp.zeros(())}}
  rm.save_reward_model(small, CONFIG, tmp_path / "bad", kind="orm")
  with pytest.raises(models.CheckpointError, match=r"tensor kernel has shape \(16,\), expected \(32,\)"):
    rm.load_reward_model(tmp_path / "bad")
  (out / "model.safetensors").unlink()
  (out / rm.HEAD_FILE).write_bytes(head)
  with pytest.raises(models.CheckpointError, match="no \\*.safetensors files|missing tensor"):
    rm.load_reward_model(out)
  with pytest.raises(ValueError, match="unknown reward model kind"):
    rm.save_reward_model(params, CONFIG, tmp_path / "x", kind="value")


def test_truncated_backbone_is_one_checkpoint_error_naming_the_file(tmp_path):
  _, params = _trained_head()
  out = rm.save_reward_model(params, CONFIG, tmp_path / "rm", kind="orm")
  weights = out / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
  with pytest.raises(models.CheckpointError, match="unreadable safetensors file") as info:
    rm.load_reward_model(out)
  assert str(weights) in str(info.value) and "\n" not in str(info.value)


def _rows(n=5, length=9, k=3):
  rng = np.random.default_rng(0)
  return rm.RewardData(tokens=rng.integers(0, 61, (n, length), np.int32), attention_mask=rng.random((n, length)) < .8,
                       positions=rng.integers(0, length, (n, k), np.int32), labels=rng.random((n, k), np.float32),
                       loss_mask=rng.random((n, k)) < .5, group=np.arange(n, dtype=np.int32) // 2,
                       outcome=(np.arange(n) % 2).astype(np.float32))


def test_training_rows_round_trip_beside_the_model(tmp_path):
  _, params = _trained_head()
  out = rm.save_reward_model(params, CONFIG, tmp_path / "rm", kind="prm")
  assert rm.load_training_rows(out) is None  # a model saved without them
  rows = _rows()
  assert rm.save_training_rows(rows, out, prompt_len=4) == out / rm.ROWS_FILE
  loaded, prompt_len = rm.load_training_rows(out)
  assert prompt_len == 4 and not list(out.glob("*.tmp"))
  for name, value in rows._asdict().items():
    np.testing.assert_array_equal(getattr(loaded, name), value)
    assert getattr(loaded, name).dtype == value.dtype
  assert rm.load_reward_model(out)[2] == "prm"  # the model still loads with the rows beside it


def test_training_rows_errors_name_the_file(tmp_path, monkeypatch):
  rows = _rows()
  tmp_path.joinpath("a").mkdir()
  file = rm.save_training_rows(rows, tmp_path / "a", prompt_len=4)
  file.write_bytes(file.read_bytes()[:file.stat().st_size // 2])
  with pytest.raises(models.CheckpointError, match="training_rows.npz: unreadable") as info:
    rm.load_training_rows(tmp_path / "a")
  assert str(file) in str(info.value) and "\n" not in str(info.value)
  tmp_path.joinpath("b").mkdir()
  np.savez(tmp_path / "b" / rm.ROWS_FILE, prompt_len=4, **{k: v for k, v in rows._asdict().items() if k != "labels"})
  with pytest.raises(models.CheckpointError, match="lacks labels: not a reward model's training rows"):
    rm.load_training_rows(tmp_path / "b")
  rm.save_training_rows(rows._replace(outcome=rows.outcome[:3]), tmp_path / "b", prompt_len=4)
  with pytest.raises(models.CheckpointError, match="its fields differ in rows"):
    rm.load_training_rows(tmp_path / "b")
  def full_disk(f, **arrays):
    f.write(b"PK")
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(np, "savez_compressed", full_disk)  # a write that fails part-way keeps the file it had
  with pytest.raises(OSError, match="No space left"):
    rm.save_training_rows(rows, tmp_path / "b", prompt_len=4)
  monkeypatch.undo()
  assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [rm.ROWS_FILE]
  with pytest.raises(models.CheckpointError, match="its fields differ in rows"):
    rm.load_training_rows(tmp_path / "b")

# The "loglik" score: s = pooled head logit + α · Σ_completion log p_backbone(o_t | q, o_<t).
TIED = models.ModelConfig(**{**CONFIG.__dict__, "tie_word_embeddings": True})


def _loglik_params(seed=0, alpha=0.7):
  policy = models.init_params(TIED, jax.random.key(seed))
  params = rm.init_reward_params(policy, TIED, jax.random.key(seed + 1), head_scale=1.0, score="loglik", alpha=alpha)
  params["head"]["bias"] = jnp.asarray(0.3)
  return policy, params


def _completion_loglik_by_hand(policy, tokens, mask, start):
  """Σ over completion positions t >= start of log softmax(logits at t - 1)[token t], from the full model."""
  logits, _ = models.apply(policy, TIED, jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
  logp = np.asarray(jax.nn.log_softmax(np.asarray(logits, np.float64), axis=-1))
  total = np.zeros(tokens.shape[0])
  for i in range(tokens.shape[0]):
    for t in range(start, tokens.shape[1]):
      if mask[i, t]:
        total[i] += logp[i, t - 1, tokens[i, t]]
  return total


def test_loglik_score_adds_alpha_times_the_backbones_completion_loglik():
  policy, params = _loglik_params()
  assert rm.score_of(params) == "loglik" and float(params["alpha"]) == pytest.approx(0.7)
  p, t = 4, 6
  tokens = np.asarray(jax.random.randint(jax.random.key(3), (3, p + t), 1, TIED.vocab_size))
  mask = np.ones((3, p + t), bool)
  mask[1, :2] = False  # a left-padded prompt
  mask[2, p + 3:] = False  # a short completion
  starts = np.full(3, p, np.int32)
  ll = np.asarray(rm.completion_loglik(params, TIED, jnp.asarray(tokens), jnp.asarray(mask), starts))
  np.testing.assert_allclose(ll, _completion_loglik_by_hand(policy, tokens, mask, p), rtol=1e-5)
  from grpo_jax import logprobs
  logp = np.asarray(logprobs.token_logprobs(policy, TIED, jnp.asarray(tokens), jnp.asarray(mask)))
  completion = mask & (np.arange(p + t)[None] >= p)
  np.testing.assert_allclose(ll, (logp * completion).sum(1), rtol=1e-6)
  # orm: the head at the scored position plus α · loglik.
  last = rm.last_token_index(jnp.asarray(mask))
  head = np.asarray(rm.outcome_scores(params, TIED, jnp.asarray(tokens), jnp.asarray(mask), last))
  positions, step_mask = np.asarray(last)[:, None], np.ones((3, 1), bool)
  s = rm.outcome_logits(params, TIED, tokens, mask, positions, step_mask, starts, kind="orm")
  np.testing.assert_allclose(s, head + 0.7 * ll, rtol=1e-5)
  # orm_steps: the noisy-AND logit of the step scores plus α · loglik.
  ends = np.array([[5, 7, 9], [6, 9, 0], [5, 6, 0]], np.int32)
  emask = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 0]], bool)
  steps = np.asarray(rm.step_scores(params, TIED, tokens, mask, ends, emask))
  s = rm.outcome_logits(params, TIED, tokens, mask, ends, emask, starts, kind="orm_steps")
  np.testing.assert_allclose(s, np.asarray(reward_losses.noisy_and_logits(steps, emask)) + 0.7 * ll, rtol=1e-5)
  # The head score is the pooled logit alone.
  head_only = {"backbone": params["backbone"], "head": params["head"]}
  np.testing.assert_allclose(rm.outcome_logits(head_only, TIED, tokens, mask, positions, step_mask, starts,
                                               kind="orm"), head, rtol=1e-6)
  with pytest.raises(ValueError, match="tied word embeddings"):
    rm.init_reward_params(models.init_params(CONFIG, jax.random.key(0)), CONFIG, jax.random.key(1), score="loglik")
  with pytest.raises(ValueError, match="unknown reward model score"):
    rm.init_reward_params(policy, TIED, jax.random.key(1), score="likelihood")


def _likelihood_only_data(policy, problems=6, p=4, t=8, flips=3):
  """Per problem one right completion (the backbone's greedy continuation) and one wrong one: the same with
  `flips` tokens replaced by the backbone's least likely token there. Both have the same length and
  structure; only their likelihood under the backbone tells them apart."""
  rng = np.random.default_rng(0)
  rows, outcome, group = [], [], []
  for g in range(problems):
    seq = list(rng.integers(1, TIED.vocab_size, p))
    wrong = list(seq)
    flip_at = set(rng.choice(t, flips, replace=False).tolist())
    for j in range(t):
      logits = np.asarray(models.apply(policy, TIED, jnp.asarray([seq]))[0])[0, -1]
      seq.append(int(np.argmax(logits)))
      wl = np.asarray(models.apply(policy, TIED, jnp.asarray([wrong]))[0])[0, -1]
      wrong.append(int(np.argmin(wl)) if j in flip_at else int(np.argmax(wl)))
    rows += [seq, wrong]
    outcome += [1.0, 0.0]
    group += [g, g]
  tokens = np.asarray(rows, np.int32)
  n, length = tokens.shape
  positions = np.full((n, 1), length - 1, np.int32)
  return rm.RewardData(tokens=tokens, attention_mask=np.ones((n, length), bool), positions=positions,
                       labels=np.asarray(outcome, np.float32)[:, None], loss_mask=np.ones((n, 1), bool),
                       group=np.asarray(group, np.int32), outcome=np.asarray(outcome, np.float32))


def test_loglik_score_ranks_samples_that_differ_only_in_likelihood_and_keeps_a_frozen_backbone():
  p = 4
  policy, params = _loglik_params(alpha=1.0)
  params["head"]["kernel"] = jnp.zeros_like(params["head"]["kernel"])  # start from the likelihood alone
  data = _likelihood_only_data(policy, p=p)
  ll = rm.completion_logliks(params, TIED, data, prompt_len=p)
  gaps = ll[0::2] - ll[1::2]
  assert np.all(gaps > 1.0), gaps  # wide margins: right samples are far more likely under the backbone
  assert rm.evaluate(params, TIED, data, kind="orm", prompt_len=p)["outcome/group_auc"] == 1.0
  # The head score reads only the hidden state at the last token: before training it cannot rank at all.
  head_only = {"backbone": params["backbone"], "head": params["head"]}
  assert rm.evaluate(head_only, TIED, data, kind="orm")["outcome/group_auc"] == 0.5
  optimizer = rm.frozen_backbone_optimizer(optax.adam(1e-2))
  step = rm.make_reward_train_step(TIED, optimizer, kind="orm", loss="pairwise", prompt_len=p, freeze_backbone=True,
                                   donate=False)
  state = training.init_train_state(params, optimizer)
  batch = jax.tree.map(jnp.asarray, data)
  for _ in range(20):
    state, metrics = step(state, batch)
  jax.tree.map(np.testing.assert_array_equal, state.params["backbone"], params["backbone"])
  assert float(metrics["loss"]) < float(np.log(2.0))
  assert float(state.params["alpha"]) > 1.0  # the pairwise loss pushes α up: the likelihood ranks every pair
  assert rm.evaluate(state.params, TIED, data, kind="orm", prompt_len=p)["outcome/group_auc"] == 1.0
  with pytest.raises(ValueError, match="needs prompt_len"):
    rm.evaluate(params, TIED, data, kind="orm")


@pytest.mark.parametrize("kind", ["orm", "orm_steps"])
def test_loglik_save_load_round_trip_scores_the_same(tmp_path, kind):
  policy, params = _loglik_params(alpha=-0.4)
  data = _likelihood_only_data(policy, problems=2)
  out = rm.save_reward_model(params, TIED, tmp_path / "rm", kind=kind)
  loaded, config, loaded_kind = rm.load_reward_model(out)
  assert loaded_kind == kind and rm.score_of(loaded) == "loglik"
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  starts = np.full(len(data.tokens), 4, np.int32)
  args = (data.tokens, data.attention_mask, data.positions, data.loss_mask, starts)
  np.testing.assert_array_equal(rm.outcome_logits(loaded, config, *args, kind=kind),
                                rm.outcome_logits(params, TIED, *args, kind=kind))
  # A head-score model stays one (no alpha written, none loaded).
  out = rm.save_reward_model({"backbone": params["backbone"], "head": params["head"]}, TIED, tmp_path / "h", kind=kind)
  assert rm.score_of(rm.load_reward_model(out)[0]) == "head"
