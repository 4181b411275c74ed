"""LoRA adapters on a reward model's backbone: they start as the loaded model, train the likelihood it ranks
with (which a frozen backbone cannot), leave the base weights as loaded, and merge into a plain reward model."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax import models
from grpo_jax import reward_models as rm
from grpo_jax import training
from grpo_jax.models import lora
from grpo_jax.models.config import LORA_TARGETS
from tests.grpo_jax.test_reward_models import TIED, _loglik_params

P, T = 4, 8  # prompt and completion tokens


def _mode_data(policy, problems=96, flips=3):
  """Per problem the backbone's greedy completion and the same with `flips` tokens replaced by its least likely
  token there. The likely one is right when the prompt's first token is even, the unlikely one otherwise: no
  α (one scale for every problem) can rank both kinds, and with 96 pairs in 32 dimensions the head alone cannot
  memorise them; the likelihood has to learn the prompt's rule."""
  rng = np.random.default_rng(0)
  last = jax.jit(lambda t: models.apply(policy, TIED, t)[0][:, -1])
  right = rng.integers(1, TIED.vocab_size, (problems, P))
  wrong = right.copy()
  flip = np.stack([rng.permutation(T) < flips for _ in range(problems)])
  for j in range(T):
    right = np.concatenate([right, np.argmax(np.asarray(last(jnp.asarray(right))), -1)[:, None]], 1)
    logits = np.asarray(last(jnp.asarray(wrong)))
    wrong = np.concatenate([wrong, np.where(flip[:, j], np.argmin(logits, -1), np.argmax(logits, -1))[:, None]], 1)
  likely_right = right[:, 0] % 2 == 0
  tokens = np.stack([right, wrong], 1).reshape(2 * problems, -1).astype(np.int32)
  outcome = np.stack([likely_right, ~likely_right], 1).reshape(-1).astype(np.float32)
  n, length = tokens.shape
  data = rm.RewardData(tokens=tokens, attention_mask=np.ones((n, length), bool),
                       positions=np.full((n, 1), length - 1, np.int32), labels=outcome[:, None],
                       loss_mask=np.ones((n, 1), bool), group=np.repeat(np.arange(problems), 2).astype(np.int32),
                       outcome=outcome)
  return data, likely_right


def _train(params, config, data, optimizer, steps=20, **kwargs):
  step = rm.make_reward_train_step(config, optimizer, kind="orm", loss="pairwise", prompt_len=P, donate=False,
                                   **kwargs)
  state = training.init_train_state(params, optimizer)
  batch = jax.tree.map(jnp.asarray, data)
  for _ in range(steps):
    state, _ = step(state, batch)
  return state.params


def _likelihood_agrees(params, config, data, likely_right):
  """The share of problems whose two completions the backbone's likelihood orders as their labels do."""
  ll = rm.completion_logliks(params, config, data, prompt_len=P)
  return float(np.mean((ll[0::2] > ll[1::2]) == likely_right))


def test_adapters_train_the_ranking_a_frozen_backbone_cannot_move():
  policy, params = _loglik_params(alpha=1.0)
  params["head"]["kernel"] = jnp.zeros_like(params["head"]["kernel"])
  data, likely_right = _mode_data(policy)
  auc = lambda p, c: rm.evaluate(p, c, data, kind="orm", prompt_len=P)["outcome/group_auc"]  # noqa: E731
  assert 0.35 < auc(params, TIED) < 0.5  # the likelihood ranks the unlikely-right half wrong
  assert _likelihood_agrees(params, TIED, data, likely_right) < 0.5

  adapted, config = rm.adapters.add(params, TIED, jax.random.key(5), rank=4)
  assert config.lora_rank == 4 and config.lora_targets == LORA_TARGETS
  starts = np.full(len(data.tokens), P, np.int32)
  args = (data.tokens, data.attention_mask, data.positions, data.loss_mask, starts)
  np.testing.assert_allclose(rm.outcome_logits(adapted, config, *args, kind="orm"),  # B = 0: the loaded model
                             rm.outcome_logits(params, TIED, *args, kind="orm"), rtol=1e-6)

  # The frozen backbone (head and α trained, as the iterative study's reward model until now): its likelihood term
  # is bitwise the loaded one, and the head alone barely moves the ranking.
  frozen = _train(params, TIED, data, rm.frozen_backbone_optimizer(optax.adam(1e-2)), freeze_backbone=True)
  np.testing.assert_array_equal(rm.completion_logliks(frozen, TIED, data, prompt_len=P),
                                rm.completion_logliks(params, TIED, data, prompt_len=P))
  assert auc(frozen, TIED) < 0.7

  # Adapters: the same steps and learning rate move the likelihood itself to the labels' order.
  trained = _train(adapted, config, data, rm.adapters.optimizer(optax.adam(1e-2)))
  assert auc(trained, config) > 0.9
  assert _likelihood_agrees(trained, config, data, likely_right) > 0.9
  base = lambda p: lora.split(p["backbone"], lora.is_adapter)[1]  # noqa: E731
  jax.tree.map(np.testing.assert_array_equal, base(trained), base(adapted))  # the base weights as loaded
  assert not np.allclose(lora.adapters(trained["backbone"])["layers_0"]["attn"]["q_proj"]["lora_b"], 0.0)


def test_merged_adapters_save_as_a_plain_reward_model_that_scores_the_same(tmp_path):
  policy, params = _loglik_params(alpha=0.8)
  data, _ = _mode_data(policy, problems=4)
  adapted, config = rm.adapters.add(params, TIED, jax.random.key(2), rank=2, alpha=4.0, targets=("q", "v", "down"))
  adapted["backbone"] = jax.tree_util.tree_map_with_path(  # nonzero B: the adapters change the scores
      lambda path, x: x + 0.05 if lora.is_adapter(path) else x, adapted["backbone"])
  merged, plain = rm.adapters.merge(adapted, config)
  assert plain.lora_rank == 0 and not lora.adapters(merged["backbone"])
  starts = np.full(len(data.tokens), P, np.int32)
  args = (data.tokens, data.attention_mask, data.positions, data.loss_mask, starts)
  scores = np.asarray(rm.outcome_logits(adapted, config, *args, kind="orm"))
  assert not np.allclose(scores, rm.outcome_logits(params, TIED, *args, kind="orm"), atol=1e-3)
  np.testing.assert_allclose(rm.outcome_logits(merged, plain, *args, kind="orm"), scores, rtol=1e-5, atol=1e-5)
  loaded, loaded_config, _ = rm.load_reward_model(rm.save_reward_model(merged, plain, tmp_path / "rm", kind="orm"))
  np.testing.assert_allclose(rm.outcome_logits(loaded, loaded_config, *args, kind="orm"), scores, rtol=1e-5, atol=1e-5)
  assert rm.adapters.merge(params, TIED) == (params, TIED)  # no adapters: unchanged


def test_optimizer_moves_adapters_head_and_alpha_only():
  _, params = _loglik_params()
  adapted, config = rm.adapters.add(params, TIED, jax.random.key(1), rank=2)
  optimizer = rm.adapters.optimizer(optax.adamw(1e-1, weight_decay=0.5))  # weight decay would shrink the base
  grads = jax.tree.map(jnp.ones_like, adapted)
  updates, _ = optimizer.update(grads, optimizer.init(adapted), adapted)
  leaves = jax.tree_util.tree_flatten_with_path(updates)[0]
  moved = {jax.tree_util.keystr(path) for path, u in leaves if np.any(np.asarray(u) != 0)}
  trained = {jax.tree_util.keystr(path) for path, _ in leaves if rm.adapters.is_trained(path)}
  assert moved == trained and any("alpha" in k for k in trained) and any("head" in k for k in trained)
  assert any("lora_a" in k for k in trained) and not any("embed" in k for k in trained)
  with pytest.raises(ValueError, match="rank >= 1"):
    rm.adapters.add(params, TIED, jax.random.key(1), rank=0)
  with pytest.raises(ValueError, match="already has adapters"):
    rm.adapters.add(adapted, config, jax.random.key(1), rank=2)
