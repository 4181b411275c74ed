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


# Length buckets (issue 53): B = 4 prompts of P = 6 columns (left-padded), G = 2 completions each of T = 16 columns,
# hand-set lengths with a long tail (one full-width row, most short).
_P, _T, _G = 6, 16, 2
_LENGTHS = np.array([1, 2, 16, 3, 2, 5, 1, 9])


def _prompted_rows(config, lengths=_LENGTHS, group_size=_G):
  """(tokens [N, P + T], attention [N, P + T]): B prompts repeated G times, then the completions of `lengths`."""
  n = len(lengths)
  rng = np.random.default_rng(7)
  prompts = np.repeat(rng.integers(5, config.vocab_size, (n // group_size, _P)), group_size, axis=0)
  prompt_mask = np.repeat(np.arange(_P)[None] >= rng.integers(0, 3, (n // group_size, 1)), group_size, axis=0)
  completions = rng.integers(5, config.vocab_size, (n, _T))
  mask = np.arange(_T)[None] < lengths[:, None]
  tokens = np.concatenate([prompts, np.where(mask, completions, 0)], axis=1).astype(np.int32)
  return jnp.asarray(tokens), jnp.asarray(np.concatenate([prompt_mask, mask], axis=1))


@pytest.mark.parametrize("buckets", [(4, 8, 16), (16,), (2, 4, 8, 16), (6, 16)])
def test_bucketed_values_equal_the_padded_value_forward(model, buckets):
  """The prefix-aware value forward in length buckets (each prompt once, each micro-batch in blocks of the narrowest
  width) gives `token_values`' completion columns wherever the completion is, 0 elsewhere."""
  from grpo_jax import length_buckets  # pylint: disable=import-outside-toplevel
  _, value, config = model
  value = jax.tree.map(lambda x: 4.0 * x if x.ndim > 1 else x, value)  # larger weights: values far apart
  tokens, attention = _prompted_rows(config)
  padded = objectives.token_values(value, config, tokens, attention)[:, _P:]
  layout = length_buckets.Buckets(buckets, 4)
  got = jax.jit(lambda v: objectives.bucketed_completion_values(
      v, config, tokens[::_G, :_P], attention[::_G, :_P], tokens[:, _P:], attention[:, _P:], group_size=_G,
      buckets=layout))(value)
  mask = np.asarray(attention[:, _P:])
  np.testing.assert_allclose(np.where(mask, got, 0.0), np.where(mask, padded, 0.0), atol=2e-5)
  np.testing.assert_array_equal(np.where(mask, 0.0, got), 0.0)
  assert float(np.std(np.asarray(padded)[mask])) > 0.1  # distinct values, not a constant on both sides
  # the first completion column is the head on the prompt's last hidden state
  np.testing.assert_allclose(got[:, 0], models.scalar_apply(value, config, tokens[:, :_P],
                                                            attention_mask=attention[:, :_P])[:, -1], atol=2e-5)


def _bucketed_ppo_case(model, group_size=_G, lengths=_LENGTHS, seed=3):
  """Trained params and a PPO batch of `_prompted_rows` with π_old and V_old off the current ones (ratios and value
  clips active), random advantages and returns."""
  policy, value, config = model
  params = {"policy": policy, "value": jax.tree.map(lambda x: 4.0 * x if x.ndim > 1 else x, value)}
  tokens, attention = _prompted_rows(config, lengths, group_size)
  loss_mask = attention.at[:, :_P].set(False)
  m = np.asarray(loss_mask, np.float32)
  rng = np.random.default_rng(seed)
  noise = lambda scale: scale * rng.normal(size=m.shape).astype(np.float32) * m  # noqa: E731
  logp = np.asarray(logprobs_lib.token_logprobs(params["policy"], config, tokens, attention)) * m
  values = np.asarray(objectives.token_values(params["value"], config, tokens, attention)) * m
  batch = training.PPOBatch(tokens, attention, loss_mask, jnp.asarray(logp + noise(0.3)), jnp.zeros(m.shape),
                            jnp.asarray(noise(1.0)), jnp.asarray(values + noise(0.3)), jnp.asarray(values + noise(1.0)))
  return params, config, batch


@pytest.mark.parametrize("aggregation,group_size,micro", [("token-mean", 2, 4), ("seq-mean-token-mean", 2, 8),
                                                          ("seq-mean-token-mean", 1, 2)])
def test_length_bucketed_ppo_update_equals_the_padded_one(model, aggregation, group_size, micro):
  """The PPO update in length-sorted micro-batches (both models' prompts once, a `lax.switch` branch per width) moves
  the policy and the critic as the padded update does, with the same losses and metrics."""
  from grpo_jax import length_buckets  # pylint: disable=import-outside-toplevel
  params, config, batch = _bucketed_ppo_case(model, group_size)
  kw = dict(config=config, value_clip=0.2, value_coef=0.5, temperature=0.8,
            loss_kwargs=dict(epsilon=0.2, aggregation=aggregation, max_len=_T))
  optimizer = optax.sgd(1.0)
  padded, padded_metrics = training.make_train_step(update_lib.bind(objectives.ppo_objective, **kw), optimizer,
                                                    donate=False)(training.init_train_state(params, optimizer), batch)
  bucketed = update_lib.BucketedRows(length_buckets.Buckets((4, 8, 16), micro), config, group_size, _P,
                                     objectives.ppo_prefill)
  step = training.make_train_step(update_lib.bind(objectives.ppo_objective, prompt_len=_P, **kw), optimizer,
                                  donate=False, bucketed=bucketed)
  got, metrics = step(training.init_train_state(params, optimizer), batch)
  for role in ("policy", "value"):  # both models moved: the comparison below means something
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), padded.params[role], params[role])
    assert max(jax.tree.leaves(moved)) > 1e-3, role
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=5e-6 + 1e-5 * float(jnp.abs(b).max())),
               got.params, padded.params)
  assert 0 < padded_metrics["clip_frac"] < 1 and 0 < padded_metrics["value_clip_frac"] < 1
  for name in ("loss", "pg_loss", "value_loss", "value_mean", "entropy", "clip_frac", "value_clip_frac", "grad_norm"):
    np.testing.assert_allclose(metrics[name], padded_metrics[name], rtol=2e-5, atol=1e-6, err_msg=name)


@pytest.mark.devices(2)
def test_sharded_length_bucketed_ppo_update_equals_one_device(model):
  """On a 2-device mesh (rows split, or the params split) each shard sorts its own rows: the padded step's params."""
  from grpo_jax import length_buckets, partitioning  # pylint: disable=import-outside-toplevel
  params, config, batch = _bucketed_ppo_case(model)
  kw = dict(config=config, value_clip=0.2, value_coef=0.5, loss_kwargs=dict(epsilon=0.2))
  objective = update_lib.bind(objectives.ppo_objective, prompt_len=_P, **kw)
  optimizer = optax.sgd(1.0)
  expected, expected_metrics = training.make_train_step(update_lib.bind(objectives.ppo_objective, **kw), optimizer,
                                                        donate=False)(training.init_train_state(params, optimizer),
                                                                      batch)
  for mesh_spec in ("data:2,fsdp:1", "data:1,fsdp:2"):
    mesh, rules = partitioning.make_mesh(mesh_spec), partitioning.get_rules("fsdp")
    shards = partitioning.data_parallel_size(mesh, rules)
    assert shards == 2
    state, shardings = partitioning.init_train_state(
        partitioning.put(params, partitioning.param_shardings(mesh, rules, params)), optimizer, mesh, rules)
    step = training.make_train_step(objective, optimizer, state_shardings=shardings, mesh=mesh, rules=rules,
                                    batch_shardings=partitioning.batch_sharding(mesh, rules),
                                    bucketed=update_lib.BucketedRows(length_buckets.Buckets((4, 8, 16), 2, shards),
                                                                     config, _G, _P, objectives.ppo_prefill))
    state, metrics = step(state, batch)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=5e-6 + 1e-5 * float(jnp.abs(b).max())),
                 state.params, expected.params)
    for name in ("loss", "pg_loss", "value_loss", "grad_norm"):
      np.testing.assert_allclose(metrics[name], expected_metrics[name], rtol=1e-5, err_msg=name)
