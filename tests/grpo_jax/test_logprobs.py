"""Chunked per-token log-probs (logprobs.py) against the naive full log-softmax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import logprobs, models, sampling

CONFIG = models.ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, qkv_bias=True,
                            tie_word_embeddings=False)


@pytest.fixture(scope="module")
def params():
  p = models.init_params(CONFIG, jax.random.key(0))
  return jax.tree.map(lambda x: 6.0 * x if x.ndim > 1 else x, p)


@pytest.fixture(scope="module")
def batch():
  tokens = jax.random.randint(jax.random.key(1), (3, 12), 0, CONFIG.vocab_size)
  prompt = jnp.arange(12)[None] >= jnp.array([[0], [2], [4]])  # Left padding.
  completion = jnp.arange(12)[None] < jnp.array([[12], [9], [12]])  # Right padding.
  return tokens, prompt & completion


def naive(params, tokens, mask, temperature=1.0):
  """Full [B, L, V] log-softmax, gathered."""
  logits, _ = models.apply(params, CONFIG, tokens, attention_mask=mask)
  logp_all = jax.nn.log_softmax(logits[:, :-1] / temperature)
  logp = jnp.take_along_axis(logp_all, tokens[:, 1:, None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  valid = mask[:, 1:] & mask[:, :-1]
  pad = lambda x: jnp.pad(jnp.where(valid, x, 0.0), ((0, 0), (1, 0)))
  return pad(logp), pad(entropy)


@pytest.mark.parametrize("chunk_size", [5, 64])
def test_values_and_entropy_equal_naive(params, batch, chunk_size):
  chunked = jax.jit(lambda p, t, m: logprobs.token_logprobs(p, CONFIG, t, m, chunk_size=chunk_size,
                                                            return_entropy=True, temperature=0.8))
  logp, entropy = chunked(params, *batch)
  ref_logp, ref_entropy = jax.jit(lambda p, t, m: naive(p, t, m, 0.8))(params, *batch)
  assert logp.shape == entropy.shape == (3, 12)
  np.testing.assert_allclose(logp, ref_logp, atol=1e-5)
  np.testing.assert_allclose(entropy, ref_entropy, atol=1e-5)
  np.testing.assert_array_equal(logp[:, 0], 0.0)
  np.testing.assert_array_equal(logp[1, :3], 0.0)  # Padding, and the first prompt token (no context).
  np.testing.assert_array_equal(logp[1, 9:], 0.0)
  assert float(logp[1, 3]) < -0.1 and float(jnp.abs(ref_logp).max()) > 1.0


def test_gradients_equal_naive(params, batch):
  weights = jax.random.normal(jax.random.key(2), batch[0].shape)
  loss = lambda p: jnp.sum(weights * logprobs.token_logprobs(p, CONFIG, *batch, chunk_size=4))
  ref_loss = lambda p: jnp.sum(weights * naive(p, *batch)[0])
  grads = jax.jit(jax.grad(loss))(params)
  ref = jax.jit(jax.grad(ref_loss))(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads, ref)
  assert float(jnp.abs(grads["lm_head"]["kernel"]).max()) > 1e-3


def test_uniform_policy_by_hand():
  config = CONFIG.replace(tie_word_embeddings=True)
  p = models.init_params(config, jax.random.key(0))
  p["embed"]["embedding"] = jnp.zeros_like(p["embed"]["embedding"])  # Zero logits: a uniform policy.
  tokens = jnp.array([[3, 9, 27, 1, 60]])
  fn = jax.jit(lambda p, t: logprobs.token_logprobs(p, config, t, jnp.ones((1, 5), bool), chunk_size=2,
                                                     return_entropy=True))
  logp, entropy = fn(p, tokens)
  np.testing.assert_allclose(logp, [[0.0] + [-np.log(61.0)] * 4], rtol=1e-6)
  np.testing.assert_allclose(entropy, [[0.0] + [np.log(61.0)] * 4], rtol=1e-6)


def test_sequences_from_samples():
  samples = sampling.SampleOutput(
      prompt_tokens=jnp.array([[0, 5, 6]]), prompt_mask=jnp.array([[False, True, True]]),
      tokens=jnp.array([[7, 1, 0]]), logprobs=jnp.zeros((1, 3)), mask=jnp.array([[True, True, False]]),
      lengths=jnp.array([2]), truncated=jnp.array([False]))
  tokens, mask = logprobs.sequences_from_samples(samples)
  np.testing.assert_array_equal(tokens, [[0, 5, 6, 7, 1, 0]])
  np.testing.assert_array_equal(mask, [[False, True, True, True, True, False]])


@pytest.mark.devices(8)
def test_sharded_logprob_function_equals_one_device(params, batch):
  from grpo_jax import partitioning
  tokens, mask = (jnp.tile(x, (4, 1)) for x in batch)  # 12 rows: split over the 4 data devices
  plain = logprobs.jit_token_logprobs(CONFIG, chunk_size=5, return_entropy=True, temperature=0.7)
  expected = jax.jit(lambda p, t, m: logprobs.token_logprobs(p, CONFIG, t, m, chunk_size=5, return_entropy=True,
                                                             temperature=0.7))(params, tokens, mask)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), plain(params, tokens, mask), expected)
  mesh, rules = partitioning.make_mesh("data:2,fsdp:2,tensor:2"), partitioning.get_rules("fsdp_tp")
  sharded = logprobs.jit_token_logprobs(CONFIG, mesh=mesh, rules=rules, chunk_size=5, return_entropy=True,
                                        temperature=0.7)
  logp, entropy = sharded(params, tokens, mask)
  np.testing.assert_allclose(logp, expected[0], atol=1e-5)
  np.testing.assert_allclose(entropy, expected[1], atol=1e-5)
  assert logp.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None)


@pytest.mark.devices(8)
def test_sharded_logprob_function_takes_another_params_structure(params, batch):
  # An adapted config's function (LoRA) takes both its own params (base + adapters) and the base alone, as the
  # runner calls it for π_old and π_ref; each tree placed by the rules, the values those of the plain model.
  from grpo_jax import partitioning
  from grpo_jax.models import lora
  tokens, mask = (jnp.tile(x, (4, 1)) for x in batch)
  adapted_config = lora.lora_config(CONFIG, rank=2, alpha=4.0, targets=("q", "down"))
  adapters = jax.tree.map(lambda x: x + 0.5, lora.init_adapters(adapted_config, jax.random.key(2)))  # B != 0
  adapted = lora.join(adapters, params)
  mesh, rules = partitioning.make_mesh("data:2,fsdp:2,tensor:2"), partitioning.get_rules("fsdp_tp")
  sharded = logprobs.jit_token_logprobs(adapted_config, mesh=mesh, rules=rules, chunk_size=5)
  expected = jax.jit(lambda p, c, t, m: logprobs.token_logprobs(p, c, t, m, chunk_size=5), static_argnums=1)
  np.testing.assert_allclose(sharded(params, tokens, mask), expected(params, CONFIG, tokens, mask), atol=1e-5)
  with_adapters = sharded(adapted, tokens, mask)
  np.testing.assert_allclose(with_adapters, expected(adapted, adapted_config, tokens, mask), atol=1e-5)
  assert not np.allclose(with_adapters, expected(params, CONFIG, tokens, mask), atol=1e-3)
  assert sharded.program(tokens.shape, params) is not sharded.program(tokens.shape)  # one program per structure


def _grouped_samples(params, group_size=3, prompt_len=7, new_tokens=6):
  """Sampler rows: 3 left-padded prompts x G samples, some stopping early (right padding)."""
  prompt = jax.random.randint(jax.random.key(5), (3, prompt_len), 0, CONFIG.vocab_size)
  prompt_mask = jnp.arange(prompt_len)[None] >= jnp.array([[0], [2], [5]])
  samples = sampling.sample(params, CONFIG, prompt, prompt_mask, jax.random.key(6), num_samples=group_size,
                            max_new_tokens=new_tokens, eos_token_ids=(3, 7, 11))
  assert not bool(samples.mask.all()) and bool(samples.mask.any())  # some rows ended early
  return samples


def _ungrouped(params, samples, **kw):
  """The completions' columns of `token_logprobs` over whole rows (prompt then completion)."""
  out = logprobs.token_logprobs(params, CONFIG, *logprobs.sequences_from_samples(samples), **kw)
  return jax.tree.map(lambda x: x[:, samples.prompt_tokens.shape[1]:], out)


def _grouped(params, samples, group_size=3, **kw):
  """`grouped_completion_logprobs` of sampler rows: each prompt of a group of `group_size` once."""
  return logprobs.grouped_completion_logprobs(params, CONFIG, samples.prompt_tokens[::group_size],
                                              samples.prompt_mask[::group_size], samples.tokens, samples.mask,
                                              group_size=group_size, **kw)


@pytest.mark.parametrize("chunk_size", [4, 128])
def test_grouped_completion_logprobs_equal_ungrouped(params, chunk_size):
  samples = _grouped_samples(params)
  kw = dict(chunk_size=chunk_size, return_entropy=True, temperature=0.7)
  logp, entropy = jax.jit(lambda p: _ungrouped(p, samples, **kw))(params)
  glogp, gentropy = jax.jit(lambda p: _grouped(p, samples, **kw))(params)
  np.testing.assert_allclose(glogp, logp, atol=2e-5)
  np.testing.assert_allclose(gentropy, entropy, atol=2e-5)
  assert bool(jnp.all(jnp.where(samples.mask, True, glogp == 0.0)))
  weights = jax.random.normal(jax.random.key(7), samples.tokens.shape)
  f = lambda p, g: jnp.sum(weights * (_grouped if g > 1 else _ungrouped)(p, samples, chunk_size=4))
  grad = jax.jit(jax.grad(f), static_argnums=1)  # eagerly, op by op, this took 30 s of compiles
  expected, grouped = grad(params, 1), grad(params, 3)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, atol=2e-5 * float(jnp.abs(a).max()) + 1e-7),
               expected, grouped)


def test_grouped_jit_token_logprobs_and_errors(params):
  samples = _grouped_samples(params)
  tokens, mask = logprobs.sequences_from_samples(samples)
  p = samples.prompt_tokens.shape[1]
  full = logprobs.jit_token_logprobs(CONFIG)(params, tokens, mask)
  grouped = logprobs.jit_token_logprobs(CONFIG, group_size=3, prompt_len=p)(params, tokens, mask)
  assert grouped.shape == full.shape and not bool(grouped[:, :p].any())
  np.testing.assert_allclose(grouped[:, p:], full[:, p:], atol=2e-5)
  with pytest.raises(ValueError, match="prompt_len"):
    logprobs.jit_token_logprobs(CONFIG, group_size=3)
  with pytest.raises(ValueError, match="group_size"):
    logprobs.grouped_completion_logprobs(params, CONFIG, samples.prompt_tokens[:2], samples.prompt_mask[:2],
                                         samples.tokens, samples.mask, group_size=3)
