"""The PPO, paradigm and DPO objectives: hand-worked values, Table 10 coefficients, exact accumulation."""

import functools

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax import logprobs as logprobs_lib
from grpo_jax import losses
from grpo_jax import models
from grpo_jax import training
from grpo_jax.training import objectives
from grpo_jax.training import update as update_lib


@pytest.fixture(scope="module")
def model():
  config = models.tiny_config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              num_key_value_heads=1)
  policy = models.init_params(config, jax.random.key(0))
  value = models.init_scalar_params(config, jax.random.key(1), backbone=policy, head_scale=1.0)
  return policy, value, config


def _arrays(config, n=8, length=12, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(5, config.vocab_size, (n, length)).astype(np.int32)
  attention = np.ones((n, length), bool)
  attention[:, :2] = rng.random((n, 2)) > 0.5
  loss_mask = np.zeros((n, length), bool)
  for i, end in enumerate(rng.integers(6, length + 1, n)):
    loss_mask[i, 4:end] = True
    attention[i, end:] = False
  return tokens, attention, loss_mask, rng


def _totals(mask):
  return update_lib._totals(jnp.asarray(mask))


def test_token_values_are_shifted_by_one(model):
  _, value, config = model
  tokens, attention, _, _ = _arrays(config)
  raw = models.scalar_apply(value, config, jnp.asarray(tokens), attention_mask=jnp.asarray(attention))
  aligned = objectives.token_values(value, config, jnp.asarray(tokens), jnp.asarray(attention))
  np.testing.assert_array_equal(aligned[:, 0], 0.0)
  np.testing.assert_allclose(aligned[:, 1:], raw[:, :-1], rtol=1e-6)


def _ppo_batch(policy, value, config, seed=0):
  tokens, attention, mask, rng = _arrays(config, seed=seed)
  t, a = jnp.asarray(tokens), jnp.asarray(attention)
  logp = np.asarray(logprobs_lib.token_logprobs(policy, config, t, a))
  values = np.asarray(objectives.token_values(value, config, t, a))
  m = mask.astype(np.float32)
  adv = rng.normal(size=mask.shape).astype(np.float32) * m
  returns = (values + rng.normal(size=mask.shape).astype(np.float32)) * m
  # old log-probs and old values equal the current ones: ratio 1, and the value clip is inactive
  return training.PPOBatch(t, a, jnp.asarray(mask), jnp.asarray(logp * m), jnp.zeros(mask.shape),
                           jnp.asarray(adv), jnp.asarray(values * m), jnp.asarray(returns))


def test_ppo_objective_at_ratio_one_hand_computed(model):
  policy, value, config = model
  batch = _ppo_batch(policy, value, config)
  objective = functools.partial(objectives.ppo_objective, config=config, value_clip=0.2, value_coef=0.5,
                                loss_kwargs=dict(epsilon=0.2, aggregation="token-mean"))
  loss, metrics = objective({"policy": policy, "value": value}, batch, _totals(batch.loss_mask))
  m = np.asarray(batch.loss_mask, np.float32)
  pg = -np.sum(np.asarray(batch.advantages) * m) / m.sum()  # min(ρA, clip(ρ)A) = A at ρ = 1
  vf = np.sum(0.5 * (np.asarray(batch.old_values) - np.asarray(batch.returns)) ** 2 * m) / m.sum()
  np.testing.assert_allclose(metrics["pg_loss"], pg, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(metrics["value_loss"], vf, rtol=1e-4)
  np.testing.assert_allclose(loss, pg + 0.5 * vf, rtol=1e-4, atol=1e-6)
  assert float(metrics["value_clip_frac"]) == 0.0


def test_ppo_objective_rollout_correction_weights_the_policy_term_only(model):
  """Masked IS on a hand-made mismatch: tokens whose sampler ratio lies outside [0.5, 2] leave the surrogate
  (at ρ = 1 it is −A per kept token, weighted by e^Δ), the value loss is unchanged, and the mismatch is logged."""
  policy, value, config = model
  batch = _ppo_batch(policy, value, config)
  m = np.asarray(batch.loss_mask, np.float32)
  rng = np.random.default_rng(3)
  delta = rng.choice([-1.0, 0.0, 0.5], size=m.shape).astype(np.float32) * m  # ratios e^−1 (dropped), 1, e^.5
  batch = batch._replace(sampler_logp=batch.old_logp - jnp.asarray(delta))
  objective = functools.partial(objectives.ppo_objective, config=config, value_clip=0.2, value_coef=0.5,
                                loss_kwargs=dict(epsilon=0.2, aggregation="token-mean"),
                                correction_kwargs=dict(correction="token_mis", lower=0.5, upper=2.0))
  _, metrics = objective({"policy": policy, "value": value}, batch, _totals(batch.loss_mask))
  w = np.where(delta == -1.0, 0.0, np.exp(delta)) * m
  pg = -np.sum(np.asarray(batch.advantages) * w) / m.sum()
  np.testing.assert_allclose(metrics["pg_loss"], pg, rtol=1e-4, atol=1e-6)
  vf = np.sum(0.5 * (np.asarray(batch.old_values) - np.asarray(batch.returns)) ** 2 * m) / m.sum()
  np.testing.assert_allclose(metrics["value_loss"], vf, rtol=1e-4)
  np.testing.assert_allclose(metrics["rollout_is_dropped_frac"], np.mean(delta[m > 0] == -1.0), atol=1e-6)
  np.testing.assert_allclose(metrics["mismatch_logp_diff_max"], 1.0, atol=1e-5)


def test_ppo_gradients_split_by_role(model):
  """The policy's gradient comes only from the surrogate and the critic's only from the value loss."""
  policy, value, config = model
  batch = _ppo_batch(policy, value, config, seed=1)
  params = {"policy": policy, "value": value}

  def grads(coef):
    objective = functools.partial(objectives.ppo_objective, config=config, value_coef=coef,
                                  loss_kwargs=dict(epsilon=0.2))
    return jax.grad(lambda p: objective(p, batch, _totals(batch.loss_mask))[0])(params)

  g1, g3 = grads(1.0), grads(3.0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g1["policy"], g3["policy"])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(3 * a, b, rtol=1e-4, atol=1e-7), g1["value"], g3["value"])
  assert update_lib._global_norm(g1["value"]) > 0 and update_lib._global_norm(g1["policy"]) > 0
  assert float(update_lib._global_norm(g1["value"]["backbone"]["embed"])) > 0  # the critic's own backbone learns


def _flat_grad(fn, params):
  return jax.flatten_util.ravel_pytree(jax.grad(fn)(params))[0]


def test_grpo_and_ppo_gradients_equal_their_table_10_coefficients(model):
  """At ρ = 1, ∇ of the GRPO (PPO) loss = ∇ of the paradigm loss with GC = grpo (ppo) coefficient."""
  policy, value, config = model
  tokens, attention, mask, rng = _arrays(config, seed=2)
  t, a, m = jnp.asarray(tokens), jnp.asarray(attention), jnp.asarray(mask)
  logp = logprobs_lib.token_logprobs(policy, config, t, a)
  ref = jnp.where(m, logp + 0.3 * jnp.asarray(rng.normal(size=mask.shape), jnp.float32), 0.0)
  adv_seq = jnp.asarray(rng.normal(size=(mask.shape[0],)), jnp.float32)
  adv = jnp.where(m, adv_seq[:, None], 0.0)
  old = jnp.where(m, logp, 0.0)
  beta = 0.05
  batch = training.Batch(t, a, m, old, ref, adv)
  totals = _totals(m)
  grpo = functools.partial(training.grpo_objective, config=config, use_reference=True,
                           loss_kwargs=dict(epsilon=0.2, beta=beta, kl="k3"))
  gc = jnp.where(m, losses.grpo_coefficient(adv_seq, logp, ref, beta), 0.0)
  paradigm = functools.partial(objectives.paradigm_objective, config=config)
  g_grpo = _flat_grad(lambda p: grpo(p, batch, totals)[0], policy)
  g_paradigm = _flat_grad(lambda p: paradigm(p, batch._replace(advantages=gc), totals)[0], policy)
  np.testing.assert_allclose(g_grpo, g_paradigm, rtol=1e-4, atol=1e-6)

  ppo_batch = training.PPOBatch(t, a, m, old, ref, adv, jnp.zeros(mask.shape), jnp.zeros(mask.shape))
  ppo = functools.partial(objectives.ppo_objective, config=config, loss_kwargs=dict(epsilon=0.2))
  g_ppo = _flat_grad(lambda p: ppo({"policy": p, "value": value}, ppo_batch, totals)[0], policy)
  g_ppo_gc = _flat_grad(lambda p: paradigm(p, batch._replace(advantages=losses.ppo_coefficient(adv)), totals)[0],
                        policy)
  np.testing.assert_allclose(g_ppo, g_ppo_gc, rtol=1e-4, atol=1e-6)


def test_sft_and_rft_coefficients_select_tokens(model):
  """SFT: GC = 1 is the mean NLL; RFT: GC = I(correct) drops the wrong rows but keeps them in the mean."""
  policy, _, config = model
  tokens, attention, mask, _ = _arrays(config, seed=3)
  t, a, m = jnp.asarray(tokens), jnp.asarray(attention), jnp.asarray(mask)
  logp = np.asarray(logprobs_lib.token_logprobs(policy, config, t, a))
  zeros = jnp.zeros(mask.shape)
  correct = np.array([1, 0, 1, 1, 0, 0, 1, 0], np.float32)
  gc = losses.rft_coefficient(jnp.asarray(correct), m)
  loss, metrics = objectives.paradigm_objective(policy, training.Batch(t, a, m, zeros, zeros, gc), _totals(m),
                                                config=config)
  per_seq = (logp * mask).sum(-1) / mask.sum(-1)
  np.testing.assert_allclose(loss, -np.sum(correct * per_seq) / len(correct), rtol=1e-5)
  np.testing.assert_allclose(metrics["gc_nonzero_frac"], correct.mean())
  sft_loss, _ = objectives.paradigm_objective(policy, training.Batch(t, a, m, zeros, zeros, m.astype(jnp.float32)),
                                              _totals(m), config=config)
  np.testing.assert_allclose(sft_loss, -per_seq.mean(), rtol=1e-5)


def _dpo_batch(policy, config):
  tokens, attention, mask, rng = _arrays(config, seed=4)
  t, a = jnp.asarray(tokens), jnp.asarray(attention)
  logp = logprobs_lib.token_logprobs(policy, config, t, a)
  ref = jnp.where(mask, logp + 0.2 * jnp.asarray(rng.normal(size=mask.shape), jnp.float32), 0.0)
  zeros = jnp.zeros(mask.shape)
  return training.Batch(t, a, jnp.asarray(mask), zeros, ref, zeros), np.asarray(logp), np.asarray(ref), mask


def test_dpo_objective_matches_dpo_loss_and_its_coefficient(model):
  policy, _, config = model
  batch, logp, ref, mask = _dpo_batch(policy, config)
  beta = 0.3
  loss, metrics = objectives.dpo_objective(policy, batch, _totals(batch.loss_mask), config=config, beta=beta)
  seq, ref_seq = (logp * mask).sum(-1), (ref * mask).sum(-1)
  margin = beta * ((seq[0::2] - ref_seq[0::2]) - (seq[1::2] - ref_seq[1::2]))
  np.testing.assert_allclose(loss, np.mean(np.log1p(np.exp(-margin))), rtol=1e-5)
  np.testing.assert_allclose(metrics["accuracy"], np.mean(margin > 0))
  # Table 10: ∇ = −(β/K) Σ_k [GC_k ∇ log π(o⁺_k) − GC_k ∇ log π(o⁻_k)], GC = σ(−margin).
  gc_plus, gc_minus = losses.dpo_coefficient(jnp.asarray(seq[0::2] - ref_seq[0::2]),
                                             jnp.asarray(seq[1::2] - ref_seq[1::2]), beta)
  weights = np.zeros(len(seq), np.float32)
  weights[0::2], weights[1::2] = np.asarray(gc_plus), np.asarray(gc_minus)

  def surrogate(p):
    lp = logprobs_lib.token_logprobs(p, config, batch.tokens, batch.attention_mask)
    return -beta * jnp.sum(weights * jnp.sum(jnp.where(batch.loss_mask, lp, 0.0), -1)) / (len(seq) // 2)

  g = _flat_grad(lambda p: objectives.dpo_objective(p, batch, _totals(batch.loss_mask), config=config,
                                                    beta=beta)[0], policy)
  np.testing.assert_allclose(g, _flat_grad(surrogate, policy), rtol=1e-4, atol=1e-6)


def test_dpo_objective_nll_term(model):
  """`nll_coef` α adds α · mean over pairs of o⁺'s −Σ log π / (its loss-mask tokens) (Iterative RPO)."""
  policy, _, config = model
  batch, logp, _, mask = _dpo_batch(policy, config)
  plain, _ = objectives.dpo_objective(policy, batch, _totals(batch.loss_mask), config=config, beta=0.3)
  loss, metrics = objectives.dpo_objective(policy, batch, _totals(batch.loss_mask), config=config, beta=0.3,
                                           nll_coef=0.5)
  nll = np.mean(-(logp * mask).sum(-1)[0::2] / mask.sum(-1)[0::2])
  np.testing.assert_allclose(metrics["chosen_nll"], nll, rtol=1e-5)
  np.testing.assert_allclose(loss, plain + 0.5 * nll, rtol=1e-5)


@pytest.mark.parametrize("which", ["ppo", "dpo", "dpo_nll"])
def test_accumulation_is_exact(model, which):
  policy, value, config = model
  if which == "ppo":
    batch = _ppo_batch(policy, value, config, seed=5)
    params = {"policy": policy, "value": value}
    objective = functools.partial(objectives.ppo_objective, config=config, loss_kwargs=dict(epsilon=0.2))
  else:  # dpo, dpo_nll
    batch = _dpo_batch(policy, config)[0]
    params = policy
    objective = functools.partial(objectives.dpo_objective, config=config, beta=0.1,
                                  nll_coef=1.0 if which == "dpo_nll" else 0.0)
  results = []
  for micro in (1, 2):
    step = training.make_train_step(objective, optax.sgd(0.1), micro, donate=False)
    state, metrics = step(training.init_train_state(params, optax.sgd(0.1)), batch)
    results.append((state.params, metrics["loss"]))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6), results[0][0], results[1][0])
  np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5)
