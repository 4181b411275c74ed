import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax import models
from grpo_jax import training
from grpo_jax.training import update as update_lib


@pytest.fixture(scope="module")
def model():
  config = models.tiny_config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              num_key_value_heads=1)
  return models.init_params(config, jax.random.key(0)), config


def _batch(config, n=8, length=12):
  rng = np.random.default_rng(0)
  tokens = rng.integers(5, config.vocab_size, (n, length)).astype(np.int32)
  attention = np.ones((n, length), bool)
  attention[:, :3] = rng.random((n, 3)) > 0.5  # some left padding
  attention[:, 3] = True
  loss_mask = np.zeros((n, length), bool)
  ends = rng.integers(5, length + 1, n)
  for i, e in enumerate(ends):
    loss_mask[i, 4:e] = True
    attention[i, e:] = False
  old = -rng.uniform(1, 4, (n, length)).astype(np.float32) * loss_mask
  ref = old + 0.1 * rng.normal(size=(n, length)).astype(np.float32) * loss_mask
  adv = np.repeat(rng.normal(size=(n, 1)), length, 1).astype(np.float32) * loss_mask
  return training.Batch(*map(jnp.asarray, (tokens, attention, loss_mask, old, ref, adv)))


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean"])
def test_gradient_accumulation_is_exact(model, aggregation):
  params, config = model
  batch = _batch(config)
  objective = update_lib.bind(training.grpo_objective, config=config, use_reference=True, chunk_size=5, loss_kwargs=dict(
      epsilon=0.2, beta=0.04, aggregation=aggregation))
  optimizer = optax.sgd(1.0)
  results = []
  for micro in (1, 2, 4):
    step = training.make_train_step(objective, optimizer, num_micro_batches=micro, donate=False)
    state, metrics = step(training.init_train_state(params, optimizer), batch)
    results.append((state.params, metrics))
  for other, metrics in results[1:]:
    jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-6), other, results[0][0])
    np.testing.assert_allclose(metrics["loss"], results[0][1]["loss"], rtol=1e-5)
  assert int(state.step) == 1


def test_sgd_step_moves_params_by_minus_lr_times_gradient(model):
  params, config = model
  batch = _batch(config)
  objective = update_lib.bind(training.sft_objective, config=config, chunk_size=4)
  step = training.make_train_step(objective, optax.sgd(0.5), donate=False)
  state, metrics = step(training.init_train_state(params, optax.sgd(0.5)), batch)
  loss, grads = jax.jit(jax.value_and_grad(functools.partial(_mean_nll, config=config)))(params, batch)
  # The SFT loss is the mean negative log-likelihood of the target tokens (loss_mask), over all of the batch's
  # target tokens (rows of 1 to 8 of them weigh by their length), computed here from the model's logits.
  np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
  assert 0.9 * np.log(config.vocab_size) < float(loss) < 1.1 * np.log(config.vocab_size)  # a random-init model
  expected = jax.tree.map(lambda p, g: p - 0.5 * g, params, grads)
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-6), state.params, expected)
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), state.params, params))
  assert max(moved) > 1e-4


def _mean_nll(params, batch, config):
  """Σ −log softmax(logits_{t−1})[token_t] over the loss_mask's tokens / their count: the logits from
  `models.apply`, the rest written out (not `token_logprobs` or `losses.aggregate`)."""
  logits, _ = models.apply(params, config, batch.tokens, attention_mask=batch.attention_mask)
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  target = jnp.take_along_axis(logp, batch.tokens[:, 1:, None], axis=-1)[..., 0]
  m = batch.loss_mask[:, 1:].astype(jnp.float32)
  return -jnp.sum(target * m) / jnp.sum(m)


def test_grpo_objective_at_ratio_one_has_no_clipping(model):
  params, config = model
  batch = _batch(config)
  from grpo_jax import logprobs
  logp = jax.jit(functools.partial(logprobs.token_logprobs, config=config))(params, tokens=batch.tokens,
                                                                           attention_mask=batch.attention_mask)
  batch = batch._replace(old_logp=logp * batch.loss_mask)
  objective = functools.partial(training.grpo_objective, config=config, loss_kwargs=dict(epsilon=0.2, beta=0.0),
                                use_reference=False)
  _, metrics = jax.jit(objective)(params, batch, update_lib._totals(batch.loss_mask))  # pylint: disable=protected-access
  np.testing.assert_allclose(metrics["ratio_mean"], 1.0, atol=1e-5)
  assert float(metrics["clip_frac"]) == 0.0
  assert float(metrics["entropy"]) > 0.0


def test_reduce_metric():
  np.testing.assert_allclose(update_lib.reduce_metric("loss", [1.0, 2.0]), 3.0)  # globally normalised: a sum
  np.testing.assert_allclose(update_lib.reduce_metric("ratio_min", [0.9, 0.7]), 0.7)
  np.testing.assert_allclose(update_lib.reduce_metric("ratio_max", [1.1, 1.3]), 1.3)
  np.testing.assert_allclose(update_lib.reduce_metric("entropy", [1.0, 2.0]), 1.5)


@pytest.mark.devices(8)
def test_sharded_grpo_update_equals_one_device(model):
  from grpo_jax import partitioning
  params, config = model
  batch = _batch(config)
  objective = update_lib.bind(training.grpo_objective, config=config, use_reference=True, chunk_size=5,
                              loss_kwargs=dict(epsilon=0.2, beta=0.04))
  # Adam's first step is lr * g / (|g| + eps): a large eps keeps it from amplifying float rounding of tiny g.
  optimizer = training.make_optimizer(1e-2, max_grad_norm=1.0, eps=1e-3, weight_decay=0.01)
  one_step = training.make_train_step(objective, optimizer, num_micro_batches=2, donate=False)
  expected, expected_metrics = one_step(training.init_train_state(params, optimizer), batch)

  for mesh_spec, rules in [("data:2,fsdp:2,tensor:2", "fsdp_tp"), ("data:2,fsdp:-1", "fsdp")]:
    mesh, rules = partitioning.make_mesh(mesh_spec), partitioning.get_rules(rules)
    state, shardings = partitioning.init_train_state(
        partitioning.put(params, partitioning.param_shardings(mesh, rules, params)), optimizer, mesh, rules)
    step = training.make_train_step(objective, optimizer, num_micro_batches=2, state_shardings=shardings,
                                    batch_shardings=partitioning.batch_sharding(mesh, rules), mesh=mesh, rules=rules)
    lowered = step.program().lower(state, partitioning.put(batch, partitioning.batch_sharding(mesh, rules))).as_text()
    assert "sharding" in lowered
    old_params = state.params
    state, metrics = step(state, batch)  # an unsharded batch is re-sharded
    assert old_params["embed"]["embedding"].is_deleted()  # the state was donated
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5), state.params,
                 expected.params)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6), state.opt_state,
                 expected.opt_state)
    for name in ("loss", "kl", "grad_norm"):
      np.testing.assert_allclose(metrics[name], expected_metrics[name], rtol=1e-5)
    jax.tree.map(lambda x, s: x.sharding.is_equivalent_to(s, x.ndim) or pytest.fail(f"{x.sharding} != {s}"),
                 state, shardings)
    assert metrics["loss"].sharding.is_fully_replicated


def _sampled_batch(params, config, n_prompts=4, group_size=2, prompt_len=6, new_tokens=5):
  from grpo_jax import sampling
  prompt = jax.random.randint(jax.random.key(3), (n_prompts, prompt_len), 5, config.vocab_size)
  prompt_mask = jnp.arange(prompt_len)[None] >= jnp.array([[0], [2], [1], [4]])[:n_prompts]
  samples = sampling.sample(params, config, prompt, prompt_mask, jax.random.key(4), num_samples=group_size,
                            max_new_tokens=new_tokens, temperature=0.8, eos_token_ids=(7, 9, 11))
  n = n_prompts * group_size
  rng = np.random.default_rng(1)
  old = samples.logprobs + 0.05 * rng.normal(size=samples.tokens.shape).astype(np.float32)
  ref = samples.logprobs + 0.1 * rng.normal(size=samples.tokens.shape).astype(np.float32)
  return training.batch_from_samples(samples, samples.mask, old, ref, jnp.asarray(rng.normal(size=n), jnp.float32))


@pytest.mark.parametrize("micro", [1, 2])
def test_grouped_grpo_objective_equals_ungrouped(model, micro):
  params, config = model
  batch = _sampled_batch(params, config)
  kw = dict(config=config, use_reference=True, temperature=0.8,
            loss_kwargs=dict(epsilon=0.2, beta=0.04, aggregation="seq-mean-token-mean"))
  optimizer = optax.sgd(1.0)
  results = []
  for extra in ({}, dict(group_size=2, prompt_len=6)):
    step = training.make_train_step(update_lib.bind(training.grpo_objective, **kw, **extra), optimizer,
                                    num_micro_batches=micro, donate=False)
    results.append(step(training.init_train_state(params, optimizer), batch))
  (plain, plain_metrics), (grouped, grouped_metrics) = results
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-6), grouped.params, plain.params)
  for name in ("loss", "pg_loss", "kl_loss", "ratio_mean", "entropy"):
    np.testing.assert_allclose(grouped_metrics[name], plain_metrics[name], rtol=1e-5, atol=1e-6)


def test_grouped_objective_needs_whole_groups_and_prompt_len(model):
  params, config = model
  batch = _sampled_batch(params, config)
  totals = update_lib._totals(batch.loss_mask)  # pylint: disable=protected-access
  kw = dict(config=config, use_reference=False, loss_kwargs=dict(epsilon=0.2, beta=0.0))
  with pytest.raises(ValueError, match="prompt_len"):
    training.grpo_objective(params, batch, totals, group_size=2, **kw)
  with pytest.raises(ValueError, match="whole groups"):
    training.grpo_objective(params, batch, totals, group_size=3, prompt_len=6, **kw)


def test_on_policy_objective_equals_old_logp_of_the_same_params(model):
  """on_policy: π_old = stop_gradient(π_θ), the same loss and gradient as old_logp computed by a forward of the
  same params (one epoch, one minibatch), without reading batch.old_logp."""
  params, config = model
  batch = _sampled_batch(params, config)
  from grpo_jax import logprobs
  logp = jax.jit(functools.partial(logprobs.token_logprobs, config=config, temperature=0.8))(
      params, tokens=batch.tokens, attention_mask=batch.attention_mask)
  totals = update_lib._totals(batch.loss_mask)  # pylint: disable=protected-access
  kw = dict(config=config, use_reference=True, temperature=0.8,
            loss_kwargs=dict(epsilon=0.2, beta=0.04, aggregation="seq-mean-token-mean"))
  exact = batch._replace(old_logp=logp * batch.loss_mask)
  value_and_grad = lambda **more: jax.jit(jax.value_and_grad(functools.partial(training.grpo_objective, **kw, **more),
                                                             has_aux=True))
  (loss, metrics), grads = value_and_grad()(params, exact, totals)
  garbage = batch._replace(old_logp=jnp.full_like(batch.old_logp, jnp.nan))
  (on_loss, on_metrics), on_grads = value_and_grad(on_policy=True)(params, garbage, totals)
  np.testing.assert_allclose(on_loss, loss, rtol=1e-6, atol=1e-7)
  assert float(on_metrics["ratio_mean"]) == 1.0 and float(on_metrics["clip_frac"]) == 0.0
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7), on_grads, grads)


def _own_logprobs(params, config, batch):
  from grpo_jax import logprobs  # pylint: disable=import-outside-toplevel
  logp = jax.jit(functools.partial(logprobs.token_logprobs, config=config))(params, tokens=batch.tokens,
                                                                           attention_mask=batch.attention_mask)
  return logp * batch.loss_mask


@pytest.mark.parametrize("correction", ["token_tis", "seq_tis", "token_mis", "seq_mis"])
@pytest.mark.parametrize("on_policy", [False, True])
def test_rollout_correction_of_agreeing_logprobs_leaves_the_loss_and_gradient_as_they_are(model, correction,
                                                                                          on_policy):
  """The sampler's log-probs equal the trainer's: the mismatch metrics are 0, the weights 1, and the loss and its
  gradient those of no correction."""
  params, config = model
  batch = _batch(config)
  own = _own_logprobs(params, config, batch)
  batch = batch._replace(old_logp=own, sampler_logp=own)
  kw = dict(config=config, loss_kwargs=dict(epsilon=0.2, beta=0.04), use_reference=True, chunk_size=5,
            on_policy=on_policy)
  totals = update_lib._totals(batch.loss_mask)  # pylint: disable=protected-access

  def grad(**more):
    objective = functools.partial(training.grpo_objective, **kw, **more)
    return jax.jit(jax.value_and_grad(objective, has_aux=True))(params, batch, totals)

  (loss, metrics), g = grad(correction_kwargs=dict(correction=correction))
  (plain_loss, plain), plain_g = grad()
  for name in ("mismatch_logp_diff_mean", "mismatch_logp_diff_max", "mismatch_kl", "mismatch_ratio_outside"):
    assert float(metrics[name]) < 1e-5 and float(plain[name]) < 1e-5, name
  for name in ("rollout_is_weight_mean", "rollout_is_weight_min", "rollout_is_weight_max"):
    np.testing.assert_allclose(metrics[name], 1.0, atol=1e-5, err_msg=name)
  assert float(metrics["rollout_is_dropped_frac"]) == 0.0 and "rollout_is_weight_mean" not in plain
  np.testing.assert_allclose(loss, plain_loss, rtol=1e-5)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-7), g, plain_g)


def test_rollout_correction_weights_a_hand_made_mismatch(model):
  """The sampler's log-probs are the trainer's minus a known Δ per token: the metrics and the token-TIS weights are
  what the formulas give for that Δ, and the loss is `grpo_loss` with those weights."""
  from grpo_jax import losses  # pylint: disable=import-outside-toplevel
  params, config = model
  batch = _batch(config)
  own = _own_logprobs(params, config, batch)
  rng = np.random.default_rng(1)
  delta = (rng.choice([-1.0, -0.25, 0.0, 0.25, 1.0], size=own.shape) * batch.loss_mask).astype(np.float32)
  batch = batch._replace(old_logp=own, sampler_logp=own - delta)
  totals = update_lib._totals(batch.loss_mask)  # pylint: disable=protected-access
  kw = dict(config=config, loss_kwargs=dict(epsilon=0.2, beta=0.0), use_reference=False, chunk_size=5,
            on_policy=True)
  loss, metrics = jax.jit(functools.partial(training.grpo_objective, correction_kwargs=dict(
      correction="token_tis", upper=2.0), **kw))(params, batch, totals)
  m = np.asarray(batch.loss_mask)
  d = delta[m]
  np.testing.assert_allclose(metrics["mismatch_logp_diff_mean"], np.mean(np.abs(d)), atol=1e-5)
  np.testing.assert_allclose(metrics["mismatch_logp_diff_max"], 1.0, atol=1e-5)
  np.testing.assert_allclose(metrics["mismatch_kl"], np.mean(np.exp(d) - d - 1), rtol=1e-4)
  np.testing.assert_allclose(metrics["mismatch_ratio_outside"], np.mean(np.abs(d) == 1.0), atol=1e-6)
  weights = np.minimum(np.exp(delta), 2.0) * m  # token TIS, C = 2: e^Δ, capped at 2 where Δ = 1
  np.testing.assert_allclose(metrics["rollout_is_weight_mean"], weights[m].mean(), rtol=1e-5)
  np.testing.assert_allclose(metrics["rollout_is_weight_max"], 2.0, rtol=1e-6)
  np.testing.assert_allclose(metrics["rollout_is_weight_min"], np.exp(-1.0), rtol=1e-5)
  expected, _ = losses.grpo_loss(own, own, None, batch.advantages, batch.loss_mask, epsilon=0.2, beta=0.0,
                                 rollout_weights=jnp.asarray(weights), num_sequences=totals["num_sequences"],
                                 num_tokens=totals["num_tokens"])
  np.testing.assert_allclose(loss, expected, rtol=1e-5, atol=1e-7)
  unweighted, _ = jax.jit(functools.partial(training.grpo_objective, **kw))(params, batch, totals)
  assert abs(float(unweighted) - float(loss)) > 1e-4  # the weights changed it


def _bucketed_case(model, new_tokens=8):
  params, config = model
  batch = _sampled_batch(params, config, new_tokens=new_tokens)
  lengths = np.asarray(batch.attention_mask[:, 6:].sum(1))
  assert len(set(lengths.tolist())) > 2 and lengths.max() > 2  # rows of several widths
  return params, config, batch


@pytest.mark.parametrize("aggregation,micro", [("seq-mean-token-mean", 4), ("token-mean", 2)])
def test_length_bucketed_update_equals_the_padded_one(model, aggregation, micro):
  from grpo_jax import length_buckets
  params, config, batch = _bucketed_case(model)
  kw = dict(config=config, use_reference=True, temperature=0.8, group_size=2, prompt_len=6,
            loss_kwargs=dict(epsilon=0.2, beta=0.04, aggregation=aggregation))
  objective = update_lib.bind(training.grpo_objective, **kw)
  optimizer = optax.sgd(1.0)
  padded, padded_metrics = training.make_train_step(objective, optimizer, donate=False)(
      training.init_train_state(params, optimizer), batch)
  bucketed = update_lib.BucketedRows(length_buckets.Buckets((2, 4, 8), micro), config, group_size=2, prompt_len=6)
  step = training.make_train_step(objective, optimizer, donate=False, bucketed=bucketed)
  got, metrics = step(training.init_train_state(params, optimizer), batch)
  moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), padded.params, params)
  assert max(jax.tree.leaves(moved)) > 1e-3  # the step moved the params: the comparison below means something
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=2e-6), got.params, padded.params)
  for name in ("loss", "pg_loss", "kl_loss", "entropy", "grad_norm"):
    np.testing.assert_allclose(metrics[name], padded_metrics[name], rtol=2e-5, atol=1e-6)


def _primitives_in_branches(jaxpr, name: str, inside: bool = False) -> tuple[int, int]:
  """(count of primitive `name` inside `cond` branches, count outside), through every nested jaxpr."""
  counts = [0, 0]
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == name:
      counts[0 if inside else 1] += 1
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else [param]:
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          got = _primitives_in_branches(sub, name, inside or eqn.primitive.name == "cond")
          counts = [counts[0] + got[0], counts[1] + got[1]]
  return tuple(counts)


def test_length_bucketed_update_keeps_its_gathers_out_of_the_width_branches(model):
  # Each width's `lax.switch` branch holds the forward and backward at that width; the micro-batch's row gathers
  # and the scatter of its prompts' gradient are outside, once, whatever the number of widths.
  from grpo_jax import length_buckets
  params, config, batch = _bucketed_case(model)
  objective = update_lib.bind(training.grpo_objective, config=config, use_reference=True, group_size=2, prompt_len=6,
                              loss_kwargs=dict(epsilon=0.2, beta=0.04))
  optimizer = optax.sgd(1.0)
  state = training.init_train_state(params, optimizer)
  bucketed = update_lib.BucketedRows(length_buckets.Buckets((2, 4, 8), 2), config, group_size=2, prompt_len=6)
  jaxpr = jax.make_jaxpr(training.make_train_step(objective, optimizer, donate=False, bucketed=bucketed))(state, batch)
  gathers_in, gathers_out = _primitives_in_branches(jaxpr.jaxpr, "gather")
  scatters_in, scatters_out = _primitives_in_branches(jaxpr.jaxpr, "scatter-add")
  # Outside: a gather per batch array and per prompt array (keys and values per layer, last states, mask), a
  # scatter per prompt gradient. Inside, per branch: only the loss's own (the target log-prob's gather, and its
  # transpose), never the rows'.
  batch_arrays = len([x for x in jax.tree.leaves(batch) if x is not None])
  assert gathers_out >= batch_arrays + 2 * config.num_hidden_layers
  assert scatters_out >= 2 * config.num_hidden_layers
  assert gathers_in <= 3 * 2 and scatters_in <= 3 * 2, (gathers_in, scatters_in)


def test_length_bucketed_update_trains_lora_adapters_only(model):
  from grpo_jax import length_buckets
  from grpo_jax.models import lora
  params, config, batch = _bucketed_case(model)
  adapted = lora.lora_config(config, rank=2, alpha=4.0, targets=("q", "v", "down"))
  adapters = jax.tree.map(lambda x: x + 0.3, lora.init_adapters(adapted, jax.random.key(2)))
  kw = dict(config=adapted, use_reference=False, temperature=0.8, group_size=2, prompt_len=6,
            loss_kwargs=dict(epsilon=0.2, beta=0.0))
  objective = update_lib.bind(training.grpo_objective, **kw)
  optimizer = optax.sgd(1.0)
  state = training.init_train_state(adapters, optimizer)
  padded, _ = training.make_train_step(objective, optimizer, donate=False, combine=lora.join)(state, batch, params)
  bucketed = update_lib.BucketedRows(length_buckets.Buckets((4, 8), 2), adapted, group_size=2, prompt_len=6)
  got, _ = training.make_train_step(objective, optimizer, donate=False, combine=lora.join, bucketed=bucketed)(
      state, batch, params)
  assert max(jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), padded.params, adapters))) > 1e-4
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=2e-6), got.params, padded.params)


@pytest.mark.devices(8)
def test_sharded_length_bucketed_update_equals_one_device(model):
  from grpo_jax import length_buckets, partitioning
  params, config, batch = _bucketed_case(model)
  objective = update_lib.bind(training.grpo_objective, config=config, use_reference=True, temperature=0.8,
                              group_size=2, prompt_len=6, loss_kwargs=dict(epsilon=0.2, beta=0.04))
  optimizer = optax.sgd(1.0)
  expected, expected_metrics = training.make_train_step(objective, optimizer, donate=False)(
      training.init_train_state(params, optimizer), batch)
  mesh, rules = partitioning.make_mesh("data:2,fsdp:2,tensor:2"), partitioning.get_rules("fsdp_tp")
  state, shardings = partitioning.init_train_state(
      partitioning.put(params, partitioning.param_shardings(mesh, rules, params)), optimizer, mesh, rules)
  bucketed = update_lib.BucketedRows(length_buckets.Buckets((4, 8), 2, shards=4), config, group_size=2, prompt_len=6)
  step = training.make_train_step(objective, optimizer, state_shardings=shardings, mesh=mesh, rules=rules,
                                  batch_shardings=partitioning.batch_sharding(mesh, rules), bucketed=bucketed)
  state, metrics = step(state, batch)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=2e-6), state.params, expected.params)
  for name in ("loss", "kl_loss", "grad_norm"):
    np.testing.assert_allclose(metrics[name], expected_metrics[name], rtol=1e-5)


def _with_empty_rows(batch, empty: int):
  """`batch` followed by `empty` rows with no token (Flow-GRPO's padding to a fixed row count)."""
  return jax.tree.map(lambda x: jnp.concatenate([x, jnp.zeros((empty, *x.shape[1:]), x.dtype)]), batch)


def test_skipping_empty_micro_batches_keeps_the_update_and_its_metrics(model):
  params, config = model
  batch = _batch(config)  # 8 rows, every one with loss tokens
  objective = update_lib.bind(training.grpo_objective, config=config, use_reference=True, chunk_size=5, loss_kwargs=dict(
      epsilon=0.2, beta=0.04, aggregation="token-mean"))
  optimizer = optax.sgd(1.0)
  state = training.init_train_state(params, optimizer)
  expected, expected_metrics = training.make_train_step(objective, optimizer, donate=False)(state, batch)
  # The same 8 rows padded to 24 (4 micro-batches of 6): the rows' micro-batches are the first two; the last two
  # hold no loss token and are skipped.
  step = training.make_train_step(objective, optimizer, num_micro_batches=4, donate=False, skip_empty=True)
  got, metrics = step(state, _with_empty_rows(batch, 16))
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-6), got.params, expected.params)
  for name in ("loss", "pg_loss", "kl", "ratio_mean", "ratio_min", "ratio_max", "clip_frac", "grad_norm"):
    np.testing.assert_allclose(metrics[name], expected_metrics[name], rtol=1e-5, atol=1e-7, err_msg=name)
  # The program holds one cond a micro-batch: the skipped ones run no forward.
  assert "cond" in str(jax.make_jaxpr(step.program())(state, _with_empty_rows(batch, 16)))


def test_an_empty_micro_batch_is_not_run(model):
  """An objective that is NaN on a micro-batch without loss tokens (its own token count divides it) poisons the
  padded update; skipping leaves it out."""
  params, config = model
  batch = _batch(config)

  def per_micro_batch_mean(params, micro, totals):
    del totals
    logp, _ = update_lib.policy_logprobs(params, micro, config=config)
    mask = micro.loss_mask.astype(jnp.float32)
    # 1 / 0 on an empty micro-batch; the first leaf's 0 term makes its gradient 0 · inf there
    loss = (-jnp.sum(logp * mask) + 0.0 * jnp.sum(jax.tree.leaves(params)[0])) / jnp.sum(mask)
    return loss, {"loss": loss, "nll_min": jnp.min(jnp.where(mask > 0, -logp, jnp.inf))}

  optimizer = optax.sgd(0.1)
  state = training.init_train_state(params, optimizer)
  padded = _with_empty_rows(batch, 8)
  poisoned, _ = training.make_train_step(per_micro_batch_mean, optimizer, num_micro_batches=2, donate=False)(
      state, padded)
  assert np.isnan(np.asarray(jax.tree.leaves(poisoned.params)[0])).any()
  got, metrics = training.make_train_step(per_micro_batch_mean, optimizer, num_micro_batches=2, donate=False,
                                          skip_empty=True)(state, padded)
  expected, expected_metrics = training.make_train_step(per_micro_batch_mean, optimizer, donate=False)(state, batch)
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-6), got.params, expected.params)
  # The mean weighs micro-batches by their loss tokens (the empty one weighs 0); the min leaves it out.
  np.testing.assert_allclose(metrics["loss"], expected_metrics["loss"], rtol=1e-6)
  np.testing.assert_allclose(metrics["nll_min"], expected_metrics["nll_min"], rtol=1e-6)
  assert np.isfinite(float(metrics["nll_min"]))


def test_reduce_metric_weights_and_leaves_out_empty_micro_batches():
  values, weights = jnp.asarray([2.0, 5.0, 0.0]), jnp.asarray([1.0, 3.0, 0.0])
  assert float(update_lib.reduce_metric("ratio_mean", values, weights)) == pytest.approx((2 + 15) / 4)
  assert float(update_lib.reduce_metric("ratio_min", values, weights)) == 2.0  # not the empty one's 0
  assert float(update_lib.reduce_metric("ratio_max", -values, weights)) == -2.0
  assert float(update_lib.reduce_metric("loss", values, weights)) == 7.0  # a sum over all
  # Without weights, or with none above 0, every micro-batch counts.
  assert float(update_lib.reduce_metric("ratio_min", values)) == 0.0
  assert float(update_lib.reduce_metric("ratio_min", values, jnp.zeros(3))) == 0.0


@pytest.mark.devices(2)
def test_skipping_empty_micro_batches_on_a_mesh(model):
  """The padded batch's micro-batches split over 2 devices, the empty ones skipped on both (the cond's predicate is
  the whole micro-batch's): the one-device update over the real rows."""
  from grpo_jax import partitioning
  params, config = model
  batch = _batch(config)
  objective = update_lib.bind(training.grpo_objective, config=config, use_reference=True, chunk_size=5, loss_kwargs=dict(
      epsilon=0.2, beta=0.04, aggregation="token-mean"))
  optimizer = optax.sgd(1.0)
  expected, expected_metrics = training.make_train_step(objective, optimizer, donate=False)(
      training.init_train_state(params, optimizer), batch)
  mesh, rules = partitioning.make_mesh("data:2"), partitioning.get_rules("dp")
  state, shardings = partitioning.init_train_state(
      partitioning.put(params, partitioning.param_shardings(mesh, rules, params)), optimizer, mesh, rules)
  step = training.make_train_step(objective, optimizer, num_micro_batches=4, state_shardings=shardings,
                                  batch_shardings=partitioning.batch_sharding(mesh, rules), mesh=mesh, rules=rules,
                                  skip_empty=True, donate=False)
  got, metrics = step(state, _with_empty_rows(batch, 16))
  jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-6), got.params, expected.params)
  for name in ("loss", "ratio_min", "ratio_max", "clip_frac", "grad_norm"):
    np.testing.assert_allclose(metrics[name], expected_metrics[name], rtol=1e-5, atol=1e-7, err_msg=name)
