"""The decoder's functional API (models/transformer.py): forwards, caches, prefixes, remat, dtypes, axes.

HF parity lives in test_hf_io.py; the layers in test_layers.py; attention, decode attention included, in
test_attention.py."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import models
from grpo_jax.models import transformer

_apply = jax.jit(models.apply, static_argnums=1, static_argnames="return_hidden")

CONFIG = models.ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, qkv_bias=True,
                            tie_word_embeddings=False)


@pytest.fixture(scope="module")
def params():
  p = models.init_params(CONFIG, jax.random.key(0))
  # Larger weights than the 0.02 init so that logits are far from uniform.
  return jax.tree.map(lambda x: x * 8.0 if x.ndim > 1 else x + 0.1, p)


def _tokens(b=2, l=10, seed=0):
  return jax.random.randint(jax.random.key(seed), (b, l), 0, CONFIG.vocab_size)


def test_shapes_dtypes_and_structure(params):
  tokens = _tokens()
  logits, cache = _apply(params, CONFIG, tokens)
  assert logits.shape == (2, 10, 61) and logits.dtype == jnp.float32 and cache is None
  hidden, _ = _apply(params, CONFIG, tokens, return_hidden=True)
  assert hidden.shape == (2, 10, 32)
  np.testing.assert_allclose(models.logits_from_hidden(params, CONFIG, hidden), logits, rtol=1e-6, atol=1e-6)
  assert params["layers_0"]["attn"]["q_proj"]["kernel"].shape == (32, 4, 8)
  assert params["lm_head"]["kernel"].shape == (32, 61)
  assert "lm_head" not in models.init_params(CONFIG.replace(tie_word_embeddings=True), jax.random.key(0))


def test_causal(params):
  tokens = _tokens()
  changed = tokens.at[:, 6].set((tokens[:, 6] + 1) % CONFIG.vocab_size)
  a, _ = _apply(params, CONFIG, tokens)
  b, _ = _apply(params, CONFIG, changed)
  np.testing.assert_allclose(a[:, :6], b[:, :6], atol=1e-6)
  assert np.abs(a[:, 6:] - b[:, 6:]).max() > 1e-2


def test_left_padding_is_invisible(params):
  tokens = _tokens(1, 7)
  plain, _ = _apply(params, CONFIG, tokens)
  padded_tokens = jnp.concatenate([jnp.full((1, 4), 9), tokens], axis=1)
  mask = jnp.arange(11)[None] >= 4
  padded, _ = _apply(params, CONFIG, padded_tokens, attention_mask=mask)
  np.testing.assert_allclose(padded[:, 4:], plain, atol=1e-5)
  # Explicit positions give the same result as the mask-derived default.
  positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
  explicit, _ = _apply(params, CONFIG, padded_tokens, attention_mask=mask, positions=positions)
  np.testing.assert_array_equal(explicit, padded)
  # So do those positions' RoPE tables computed ahead (a decode loop's), and not other positions' tables.
  hidden = jax.jit(transformer.hidden_states, static_argnums=1)
  by_positions, _ = hidden(params, CONFIG, padded_tokens, attention_mask=mask, positions=positions)
  by_tables, _ = hidden(params, CONFIG, padded_tokens, attention_mask=mask,
                        rope=transformer.rope_tables(CONFIG, positions))
  np.testing.assert_allclose(by_tables, by_positions, atol=1e-6)
  stretched, _ = hidden(params, CONFIG, padded_tokens, attention_mask=mask,
                        rope=transformer.rope_tables(CONFIG, 2 * positions))  # other relative positions
  assert float(jnp.abs(stretched - by_positions)[:, 5:].max()) > 1e-2
  with pytest.raises(ValueError, match="positions or their rope tables"):
    transformer.hidden_states(params, CONFIG, padded_tokens, positions=positions,
                              rope=transformer.rope_tables(CONFIG, positions))


def test_cached_prefill_and_decode_equal_full_forward(params):
  tokens = _tokens(2, 12, seed=1)
  mask = jnp.ones((2, 12), bool).at[1, :3].set(False)
  full, _ = _apply(params, CONFIG, tokens, attention_mask=mask)
  cache = models.init_cache(CONFIG, 2, 16)
  # Prefill 8 tokens in two chunks, then decode 4 one at a time.
  out = []
  for start, stop in [(0, 5), (5, 8)] + [(t, t + 1) for t in range(8, 12)]:
    logits, cache = _apply(params, CONFIG, tokens[:, start:stop], attention_mask=mask[:, start:stop],
                                 cache=cache)
    out.append(logits)
  assert int(cache.index) == 12 and cache.mask.shape == (2, 16)
  np.testing.assert_array_equal(cache.mask[:, :12], mask)
  cached = jnp.concatenate(out, axis=1)
  np.testing.assert_allclose(cached[mask], full[mask], atol=1e-5)


def test_grown_cache_decodes_as_the_full_one(params):
  """A cache grown between steps (`grow_cache`, the sampler's segments) gives the logits of the full forward."""
  tokens = _tokens(2, 12, seed=2)
  mask = jnp.ones((2, 12), bool).at[0, :2].set(False)
  full, _ = _apply(params, CONFIG, tokens, attention_mask=mask)
  logits, cache = _apply(params, CONFIG, tokens[:, :8], attention_mask=mask[:, :8], cache=models.init_cache(CONFIG, 2, 9))
  out = [logits]
  for t in range(8, 12):
    if t == 9:  # 9 slots are full: grow to 12, then to 14 (more than needed)
      cache = transformer.grow_cache(cache, 12)
      assert cache.k[0].shape == (2, 2, 8, 12) and cache.v[0].shape == (2, 2, 12, 8) and int(cache.index) == 9
      np.testing.assert_array_equal(cache.mask[:, 9:], False)
      np.testing.assert_array_equal(cache.k[1][..., 9:], 0.0)
      np.testing.assert_array_equal(cache.v[1][:, :, 9:], 0.0)
    if t == 11:
      cache = transformer.grow_cache(cache, 14)
    logits, cache = _apply(params, CONFIG, tokens[:, t:t + 1], attention_mask=mask[:, t:t + 1], cache=cache)
    out.append(logits)
  np.testing.assert_allclose(jnp.concatenate(out, axis=1)[mask], full[mask], atol=1e-5)
  with pytest.raises(ValueError, match="shrink"):
    transformer.grow_cache(cache, 10)


@pytest.mark.parametrize("scan", [False, True])
def test_decode_after_a_shared_prefix_equals_the_full_forward(params, scan):
  """Prompts prefilled once (`as_prefix`), each continued by 3 rows: the logits of every row's full forward."""
  config = dataclasses.replace(CONFIG, scan_layers=scan)
  weights = transformer.stack_layers(params, CONFIG) if scan else params
  groups, prompt_len, steps = 3, 6, 4
  prompts = _tokens(2, prompt_len, seed=3)
  prompt_mask = jnp.ones((2, prompt_len), bool).at[0, :2].set(False)
  completions = _tokens(2 * groups, steps, seed=4)
  rows = jnp.concatenate([jnp.repeat(prompts, groups, axis=0), completions], axis=1)
  row_mask = jnp.concatenate([jnp.repeat(prompt_mask, groups, axis=0), jnp.ones((2 * groups, steps), bool)], axis=1)
  full, _ = _apply(weights, config, rows, attention_mask=row_mask)
  _, prompt_cache = _apply(weights, config, prompts, attention_mask=prompt_mask,
                           cache=models.init_cache(config, 2, prompt_len))
  cache = models.init_cache(config, 2 * groups, steps, prefix=models.as_prefix(prompt_cache))
  out = []
  for t in range(steps):
    logits, cache = _apply(weights, config, completions[:, t:t + 1], cache=cache)  # positions from the masks
    out.append(logits)
  assert int(cache.index) == steps and cache.prefix.mask.shape == (2, prompt_len)
  np.testing.assert_allclose(jnp.concatenate(out, axis=1), full[:, prompt_len:], atol=1e-5)
  with pytest.raises(ValueError, match="one token per row"):
    _apply(weights, config, completions[:, :2], cache=cache)
  with pytest.raises(ValueError, match="already has a prefix"):
    models.as_prefix(cache)


def test_remat_same_values_and_gradients(params):
  tokens = _tokens()
  loss = lambda p, c: jnp.mean(models.apply(p, c, tokens)[0] ** 2)
  remat = CONFIG.replace(remat=True)
  v1, g1 = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, CONFIG)
  v2, g2 = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, remat)
  np.testing.assert_allclose(v1, v2, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g1, g2)
  assert float(jnp.abs(g1["layers_0"]["attn"]["q_proj"]["kernel"]).max()) > 0


def test_bfloat16(params):
  config = CONFIG.replace(dtype="bfloat16", param_dtype="bfloat16")
  p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  tokens = _tokens()
  logits, _ = _apply(p16, config, tokens)
  hidden, _ = _apply(p16, config, tokens, return_hidden=True)
  assert logits.dtype == jnp.float32 and hidden.dtype == jnp.bfloat16
  ref, _ = _apply(params, CONFIG, tokens)
  assert float(jnp.abs(logits - ref).max()) < 0.05 * float(jnp.abs(ref).max())


def test_param_logical_axes():
  axes = models.param_logical_axes(CONFIG)
  shapes = jax.eval_shape(models.init_params, CONFIG, jax.random.key(0))
  assert jax.tree.structure(shapes) == jax.tree.structure(axes, is_leaf=lambda x: isinstance(x, tuple))
  names = jax.tree.leaves(jax.tree.map(lambda s, a: (len(a) == s.ndim, a), shapes, axes),
                          is_leaf=lambda x: isinstance(x, tuple) and isinstance(x[0], bool))
  assert all(ok for ok, _ in names)
  used = {n for _, a in names for n in a}
  assert used <= set(models.LOGICAL_AXES) | {None}
  assert axes["embed"]["embedding"] == ("vocab", "embed")
  assert axes["layers_1"]["attn"]["k_proj"]["kernel"] == ("embed", "kv_heads", None)
  assert axes["layers_0"]["mlp"]["down_proj"]["kernel"] == ("mlp", "embed")
  assert axes["lm_head"]["kernel"] == ("embed", "vocab")


def _f32_dots(hlo: str) -> int:
  """dot_general ops of a StableHLO text whose operands are float32."""
  return sum(1 for line in hlo.splitlines() if "dot_general" in line and line.split("->")[0].count("xf32>") >= 2)


def test_unembed_gradients_stay_in_the_operands_dtype():
  """`unembed`'s backward products take bf16 operands (float32 accumulation), where autodiff of the same einsum
  promotes them to float32; its gradients match float32 autodiff to bf16 rounding, and equal it in float32."""
  kh, kw, kc = jax.random.split(jax.random.key(0), 3)
  h32 = jax.random.normal(kh, (2, 5, 16))
  w32 = jax.random.normal(kw, (40, 16)) / 4
  cot = jax.random.normal(kc, (2, 5, 40))
  plain = lambda h, w: jnp.einsum("...e,ve->...v", h, w, preferred_element_type=jnp.float32)
  loss = lambda f: lambda h, w: jnp.sum(jax.nn.log_softmax(f(h, w)) * cot)
  grad = lambda f: jax.grad(loss(f), argnums=(0, 1))
  want = grad(plain)(h32, w32)
  got = grad(transformer.unembed)(h32, w32)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  h16, w16 = h32.astype(jnp.bfloat16), w32.astype(jnp.bfloat16)
  got16 = grad(transformer.unembed)(h16, w16)
  assert [g.dtype for g in got16] == [jnp.bfloat16, jnp.bfloat16]
  for a, b in zip(got16, grad(plain)(h16.astype(jnp.float32), w16.astype(jnp.float32))):
    np.testing.assert_allclose(np.asarray(a, np.float32), b, rtol=0.05, atol=0.02 * float(jnp.abs(b).max()))
  assert _f32_dots(jax.jit(grad(plain)).lower(h16, w16).as_text()) == 2  # dh, dw: float32 products
  assert _f32_dots(jax.jit(grad(transformer.unembed)).lower(h16, w16).as_text()) == 0
