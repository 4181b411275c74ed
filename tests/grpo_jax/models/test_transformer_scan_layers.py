"""The scanned layer stack (`ModelConfig.scan_layers`) computes what the unrolled one does.

Same logits, gradients, cached decoding, samples and log-probs; the same HF checkpoints in and out;
params and optimiser state sharded by the same rules (the stacked layer axis unsharded).
"""

import contextlib
import io
import re

import jax
from jax import ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec

from grpo_jax import logprobs
from grpo_jax import models
from grpo_jax import sampling
from grpo_jax import partitioning
from grpo_jax import training

UNROLLED = models.ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, qkv_bias=True,
                              tie_word_embeddings=False, eos_token_ids=(3,), pad_token_id=0)
SCANNED = UNROLLED.replace(scan_layers=True)
_apply = jax.jit(models.apply, static_argnums=1)


@pytest.fixture(scope="module")
def params():
  p = models.init_params(UNROLLED, jax.random.key(0))
  # Larger weights than the 0.02 init so that logits are far from uniform.
  return jax.tree.map(lambda x: x * 8.0 if x.ndim > 1 else x + 0.1, p)


def _tokens(b=2, l=10, seed=0):
  return jax.random.randint(jax.random.key(seed), (b, l), 0, UNROLLED.vocab_size)


def test_layout_and_init():
  stacked = models.init_params(SCANNED, jax.random.key(0))
  assert "layers_0" not in stacked
  assert stacked["layers"]["attn"]["q_proj"]["kernel"].shape == (3, 32, 4, 8)
  assert stacked["layers"]["input_norm"]["scale"].shape == (3, 32)
  # The same key gives the same model in both layouts, and the layouts convert both ways.
  unrolled = models.init_params(UNROLLED, jax.random.key(0))
  jax.tree.map(np.testing.assert_array_equal, models.stack_layers(unrolled, UNROLLED), stacked)
  jax.tree.map(np.testing.assert_array_equal, models.unstack_layers(stacked, SCANNED), unrolled)
  axes = models.param_logical_axes(SCANNED)
  assert axes["layers"]["mlp"]["down_proj"]["kernel"] == (None, "mlp", "embed")
  assert axes["lm_head"]["kernel"] == ("embed", "vocab")
  assert SCANNED.to_hf_dict() == UNROLLED.to_hf_dict()  # a run-time setting, not part of the checkpoint
  with pytest.raises(ValueError, match="remat_policy"):
    UNROLLED.replace(remat_policy="some")


@pytest.mark.parametrize("remat, policy", [(False, "full"), (True, "full"), (True, "dots_no_batch"),
                                           (True, "dots")])
def test_same_logits_and_gradients(params, remat, policy):
  tokens = _tokens()
  mask = jnp.ones(tokens.shape, bool).at[1, :3].set(False)
  loss = lambda p, c: jnp.mean(jnp.where(mask[..., None], models.apply(p, c, tokens, attention_mask=mask)[0], 0) ** 2)
  grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
  v1, g1 = grad(params, UNROLLED)
  v2, g2 = grad(models.stack_layers(params, UNROLLED), SCANNED.replace(remat=remat, remat_policy=policy))
  np.testing.assert_allclose(v2, v1, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), g2,
               models.stack_layers(g1, UNROLLED))
  assert float(jnp.abs(g2["layers"]["attn"]["q_proj"]["kernel"][2]).max()) > 0
  logits1, _ = models.apply(params, UNROLLED, tokens, attention_mask=mask)
  logits2, _ = _apply(models.stack_layers(params, UNROLLED), SCANNED, tokens, attention_mask=mask)
  np.testing.assert_allclose(logits2, logits1, rtol=1e-5, atol=1e-5)


def test_unrolled_remat_policies_keep_values(params):
  tokens = _tokens()
  loss = lambda p, c: jnp.mean(models.apply(p, c, tokens)[0] ** 2)
  grad = jax.jit(jax.grad(loss), static_argnums=1)
  g1 = grad(params, UNROLLED)
  for policy in ("dots_no_batch", "dots"):  # "full" is test_transformer's remat test
    g2 = grad(params, UNROLLED.replace(remat=True, remat_policy=policy))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), g2, g1)


def test_cached_decoding(params):
  stacked = models.stack_layers(params, UNROLLED)
  tokens = _tokens(2, 12, seed=1)
  mask = jnp.ones((2, 12), bool).at[1, :3].set(False)
  full, _ = _apply(params, UNROLLED, tokens, attention_mask=mask)
  cache = models.init_cache(SCANNED, 2, 16)
  assert cache.k.shape == (3, 2, 2, 8, 16) and cache.v.shape == (3, 2, 2, 16, 8)  # keys [L, B, K, D, S]
  out = []
  for start, stop in [(0, 8)] + [(t, t + 1) for t in range(8, 12)]:
    logits, cache = _apply(stacked, SCANNED, tokens[:, start:stop], attention_mask=mask[:, start:stop],
                           cache=cache)
    out.append(logits)
  assert int(cache.index) == 12 and cache.k.shape == (3, 2, 2, 8, 16)
  np.testing.assert_allclose(jnp.concatenate(out, axis=1)[mask], full[mask], atol=1e-5)


def test_same_samples_and_logprobs(params):
  stacked = models.stack_layers(params, UNROLLED)
  prompts = _tokens(2, 5, seed=2)
  prompt_mask = jnp.ones(prompts.shape, bool).at[0, :2].set(False)
  kwargs = dict(num_samples=3, max_new_tokens=6, temperature=0.9)
  a = sampling.sample(params, UNROLLED, prompts, prompt_mask, jax.random.key(3), **kwargs)
  b = sampling.sample(stacked, SCANNED, prompts, prompt_mask, jax.random.key(3), **kwargs)
  np.testing.assert_array_equal(b.tokens, a.tokens)
  np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5)
  tokens, mask = logprobs.sequences_from_samples(a)
  lp_a = logprobs.token_logprobs(params, UNROLLED, tokens, mask, chunk_size=4)
  lp_b = logprobs.token_logprobs(stacked, SCANNED, tokens, mask, chunk_size=4)
  np.testing.assert_allclose(lp_b, lp_a, atol=1e-5)


def test_hf_checkpoint_in_both_layouts(params, tmp_path):
  models.save_hf(params, UNROLLED, tmp_path / "unrolled")
  stacked, config = models.load_hf(tmp_path / "unrolled", scan_layers=True)
  assert config == SCANNED and config.to_hf_dict() == UNROLLED.to_hf_dict()
  jax.tree.map(np.testing.assert_array_equal, stacked, models.stack_layers(params, UNROLLED))
  models.save_hf(stacked, config, tmp_path / "scanned")  # writes the same tensors
  assert (tmp_path / "scanned" / "config.json").read_text() == (tmp_path / "unrolled" / "config.json").read_text()
  again, _ = models.load_hf(tmp_path / "scanned")
  jax.tree.map(np.testing.assert_array_equal, again, params)


def test_state_shardings_of_stacked_layers():
  mesh, rules = AbstractMesh((2, 2, 2), partitioning.MESH_AXES), partitioning.get_rules("fsdp_tp")
  shapes = jax.eval_shape(lambda k: training.init_train_state(models.init_params(SCANNED, k),
                                                              training.make_optimizer(1e-3)), jax.random.key(0))
  specs = jax.tree.map(lambda s: s.spec, partitioning.state_shardings(mesh, rules, shapes))
  kernel = PartitionSpec(None, "tensor", "fsdp")  # [L, mlp, embed]: the layer axis unsharded
  assert specs.params["layers"]["mlp"]["down_proj"]["kernel"] == kernel
  adam = specs.opt_state[1][0]
  assert adam.mu["layers"]["mlp"]["down_proj"]["kernel"] == kernel
  assert adam.nu["layers"]["attn"]["q_proj"]["kernel"] == PartitionSpec(None, "fsdp", "tensor", None)


@pytest.mark.devices(8)
def test_load_scanned_into_shardings(tmp_path):
  config = UNROLLED.replace(vocab_size=64)
  models.save_hf(models.init_params(config, jax.random.key(0)), config, tmp_path)
  mesh, rules = partitioning.make_mesh("data:2,fsdp:2,tensor:2"), partitioning.get_rules("fsdp_tp")
  params, loaded = partitioning.load_hf(tmp_path, mesh, rules, scan_layers=True)
  assert loaded.scan_layers
  jax.tree.map(np.testing.assert_array_equal, params, models.stack_layers(models.load_hf(tmp_path)[0], config))
  kernel = params["layers"]["mlp"]["down_proj"]["kernel"]  # [3, 48, 32]
  assert kernel.sharding.spec == PartitionSpec(None, "tensor", "fsdp")
  assert {s.data.shape for s in kernel.addressable_shards} == {(3, 24, 16)}


@pytest.mark.parametrize("remat", [False, True])
def test_forward_after_a_prefix_saves_each_layers_cache_once(params, remat):
  """Completions after their prompts' keys and values (the length-bucketed update's forward): the same values and
  gradients (into params and into the prefix) in both layouts, and under a gradient the scanned stack saves each
  layer's cache once ([L, ...]), not the whole stacked cache at every layer ([L, L, ...], which a cache riding in
  the scan's carry costs: 24x the keys and values at 24 layers)."""
  prompt, completions = _tokens(2, 6, seed=1), _tokens(4, 5, seed=2)
  prompt_mask = jnp.ones(prompt.shape, bool).at[1, :2].set(False)
  completion_mask = jnp.ones(completions.shape, bool).at[3, 3:].set(False)

  def value_and_grads(config, p):
    prefix = logprobs.take_prefix(logprobs.prefill(p, config, prompt, prompt_mask), jnp.array([0, 0, 1, 1]))
    loss = lambda p, k, v: jnp.sum(logprobs.prefixed_completion_logprobs(
        p, config, prefix._replace(k=k, v=v), completions, completion_mask) ** 2)
    return loss, jax.value_and_grad(loss, argnums=(0, 1, 2))(p, prefix.k, prefix.v), prefix

  unrolled_config, scanned_config = UNROLLED.replace(remat=remat), SCANNED.replace(remat=remat)
  _, (value, (dp, dk, dv)), _ = value_and_grads(unrolled_config, params)
  scanned = models.stack_layers(params, UNROLLED)
  loss, (scanned_value, (sdp, sdk, sdv)), prefix = value_and_grads(scanned_config, scanned)
  np.testing.assert_allclose(scanned_value, value, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5),
               models.unstack_layers(sdp, scanned_config), dp)
  np.testing.assert_allclose(sdk, jnp.stack(dk), rtol=2e-4, atol=1e-5)
  np.testing.assert_allclose(sdv, jnp.stack(dv), rtol=2e-4, atol=1e-5)

  layers = UNROLLED.num_hidden_layers
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    ad_checkpoint.print_saved_residuals(loss, scanned, prefix.k, prefix.v)
  saved = [tuple(int(d) for d in dims.split(",")) for dims in re.findall(r"^\w+\[([\d,]+)\]", printed.getvalue(), re.M)]
  cache_sized = [s for s in saved if s[:1] == (layers,) and s[-1] in (8, 6 + 5) and len(s) >= 5]
  assert cache_sized, saved  # the per-layer caches are saved, stacked [L, ...]
  assert not [s for s in saved if s[:2] == (layers, layers)], saved
