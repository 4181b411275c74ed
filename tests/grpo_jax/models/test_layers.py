"""The decoder's layers (models/layers.py): `project`'s hand-written backward, the decode steps' projections as one product."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax import models
from grpo_jax.models import layers

CONFIG = models.ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, qkv_bias=True,
                            tie_word_embeddings=False)


@pytest.mark.parametrize("x_shape,kernel_shape,n_in", [((2, 5, 6), (6, 3, 4), 1),  # q/k/v: ble,ehd->blhd
                                                       ((2, 5, 3, 4), (3, 4, 6), 2),  # o: blhd,hde->ble
                                                       ((2, 5, 6), (6, 7), 1)])  # MLP: ble,em->blm
def test_project_values_and_gradients_equal_the_einsum(x_shape, kernel_shape, n_in):
  """`project`'s hand-written backward (the kernel gradient as one xᵀ·dy product) against autodiff of einsum."""
  kx, kk, kw = jax.random.split(jax.random.key(0), 3)
  x, kernel = jax.random.normal(kx, x_shape), jax.random.normal(kk, kernel_shape)
  letters = "abcdefgh"
  x_axes, k_axes = letters[:len(x_shape)], letters[len(x_shape) - n_in:len(x_shape) - n_in + len(kernel_shape)]
  spec = f"{x_axes},{k_axes}->{x_axes[:-n_in]}{k_axes[n_in:]}"
  out = layers.project(x, kernel, n_in)
  np.testing.assert_array_equal(out, jnp.einsum(spec, x, kernel))
  weights = jax.random.normal(kw, out.shape)
  grads = jax.jit(jax.grad(lambda x, k: jnp.sum(weights * layers.project(x, k, n_in)), argnums=(0, 1)))(x, kernel)
  expected = jax.jit(jax.grad(lambda x, k: jnp.sum(weights * jnp.einsum(spec, x, k)), argnums=(0, 1)))(x, kernel)
  for got, want in zip(grads, expected):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # By hand for the 2-D kernel: dkernel = Σ_rows xᵀ · weights.
  if kernel.ndim == 2:
    np.testing.assert_allclose(grads[1], np.einsum("ble,blm->em", x, weights), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_projections_together_equal_each_alone(bias):
  """`project_together` (one stacked product on the CPU): each output is its projection's, values and gradients."""
  config = dataclasses.replace(CONFIG, mlp_bias=bias)
  mlp = layers.MLP(config, rngs=nnx.Rngs(3))
  for i, p in enumerate((mlp.gate_proj, mlp.up_proj)):
    p.kernel[...] = jax.random.normal(jax.random.key(10 + i), p.kernel.shape)
    if bias:
      p.bias[...] = jax.random.normal(jax.random.key(20 + i), p.bias.shape)
  x = jax.random.normal(jax.random.key(1), (2, 5, config.hidden_size))
  together = layers.project_together(x, (mlp.gate_proj, mlp.up_proj))
  for got, proj in zip(together, (mlp.gate_proj, mlp.up_proj)):
    np.testing.assert_array_equal(got, proj(x))  # the same dot products
  assert not np.allclose(together[0], together[1])
  graphdef, state = nnx.split(mlp)

  def loss(state, x, fn):
    m = nnx.merge(graphdef, state)
    gate, up = fn(m, x)
    return jnp.sum(jnp.sin(gate) * up)

  alone = lambda m, x: (m.gate_proj(x), m.up_proj(x))
  both = lambda m, x: layers.project_together(x, (m.gate_proj, m.up_proj))
  got = jax.grad(loss, argnums=(0, 1))(state, x, both)
  want = jax.grad(loss, argnums=(0, 1))(state, x, alone)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
  with pytest.raises(AssertionError, match="one shape"):
    layers.project_together(x, (mlp.gate_proj, mlp.down_proj))


def _random_attention(config, seed=3):
  attn = layers.Attention(config, rngs=nnx.Rngs(seed))
  for i, p in enumerate((attn.q_proj, attn.k_proj, attn.v_proj)):
    p.kernel[...] = jax.random.normal(jax.random.key(10 + i), p.kernel.shape)
    if p.bias is not None:
      p.bias[...] = jax.random.normal(jax.random.key(20 + i), p.bias.shape)
  return attn


@pytest.mark.parametrize("heads,kv_heads,bias", [(4, 2, True), (4, 2, False), (6, 1, True), (2, 2, False)])
def test_qkv_as_one_product_equal_the_three_projections(heads, kv_heads, bias):
  """`project_qkv`'s grouped kernel [E, K, H/K + 2, D]: q, k and v as the three projections compute them, for
  grouped (H/K = 2, 6) and plain (H = K) attention, with and without biases."""
  config = dataclasses.replace(CONFIG, num_attention_heads=heads, num_key_value_heads=kv_heads, qkv_bias=bias)
  attn = _random_attention(config)
  x = jax.random.normal(jax.random.key(1), (3, 1, config.hidden_size))
  q, k, v = layers.project_qkv(x, attn.q_proj, attn.k_proj, attn.v_proj)
  assert q.shape == (3, 1, heads, config.head_dim) and k.shape == v.shape == (3, 1, kv_heads, config.head_dim)
  for got, proj in ((q, attn.q_proj), (k, attn.k_proj), (v, attn.v_proj)):
    np.testing.assert_allclose(got, proj(x), rtol=1e-6, atol=1e-6)
  # By hand, query head 1 (kv head 0's second when H/K = 2) and kv head K - 1's value, row 2.
  row = x[2, 0]
  want_q1 = row @ attn.q_proj.kernel[...][:, 1] + (attn.q_proj.bias[...][1] if bias else 0)
  want_v = row @ attn.v_proj.kernel[...][:, kv_heads - 1] + (attn.v_proj.bias[...][kv_heads - 1] if bias else 0)
  np.testing.assert_allclose(q[2, 0, 1], want_q1, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(v[2, 0, kv_heads - 1], want_v, rtol=1e-5, atol=1e-5)


def _dots(fn, *args) -> int:
  return str(jax.make_jaxpr(fn)(*args)).count("dot_general")


def test_decode_projections_choose_the_number_of_products():
  """`together` runs q/k/v and gate/up as one product each on every platform, `separate` each its own; `auto`
  (a CPU here) one product for k/v and gate/up, q alone (the platform-dependent branch holds both forms)."""
  attn, mlp = _random_attention(CONFIG), layers.MLP(CONFIG, rngs=nnx.Rngs(4))
  x = jax.random.normal(jax.random.key(1), (3, 1, CONFIG.hidden_size))
  kv = [attn.k_proj, attn.v_proj]
  assert _dots(lambda x: layers.project_qkv(x, attn.q_proj, *kv), x) == 1
  assert _dots(lambda x: layers.project_together(x, tuple(kv), "together"), x) == 1
  assert _dots(lambda x: layers.project_together(x, tuple(kv), "separate"), x) == 2
  assert _dots(lambda x: layers.project_together(x, (mlp.gate_proj, mlp.up_proj), "together"), x) == 1
  compiled_dots = lambda mode: len(re.findall(r"= \S+ dot\(", jax.jit(
      lambda x: layers.project_together(x, tuple(kv), mode)).lower(x).compile().as_text()))
  assert (compiled_dots("auto"), compiled_dots("separate")) == (1, 2)  # compiled for this CPU: auto stacks
  for mode in ("auto", "together", "separate"):
    for got, p in zip(layers.project_together(x, tuple(kv), mode), kv):
      np.testing.assert_allclose(got, p(x), rtol=1e-6, atol=1e-6)


def test_decode_projections_with_lora_keep_the_adapters():
  """A projection with LoRA adapters is never fused (the adapters add their own rank-r products): q/k/v together
  equals the three `Proj` calls, adapters included."""
  config = dataclasses.replace(CONFIG, lora_rank=2, lora_alpha=4.0, lora_targets=("q", "v"))
  attn = _random_attention(config)
  attn.q_proj.lora_b[...] = jax.random.normal(jax.random.key(5), attn.q_proj.lora_b.shape)
  attn.q_proj.lora_a[...] = jax.random.normal(jax.random.key(6), attn.q_proj.lora_a.shape)
  x = jax.random.normal(jax.random.key(1), (3, 1, config.hidden_size))
  q, k, v = layers.project_qkv(x, attn.q_proj, attn.k_proj, attn.v_proj)
  no_adapter = attn.q_proj.kernel[...]
  assert not np.allclose(q, jnp.tensordot(x, no_adapter, 1) + attn.q_proj.bias[...], atol=1e-3)
  for got, proj in ((q, attn.q_proj), (k, attn.k_proj), (v, attn.v_proj)):
    np.testing.assert_array_equal(got, proj(x))


@pytest.mark.parametrize("mode", ["together", "separate"])
def test_decode_projections_sample_the_same_tokens(mode):
  """The sampler's greedy and sampled tokens under `decode_projections` equal `auto`'s, log-probs to float rounding
  (a model with q/k/v biases and grouped heads, so every piece of the grouped kernel is read)."""
  from grpo_jax import sampling  # pylint: disable=import-outside-toplevel
  params = models.init_params(CONFIG, jax.random.key(7))
  params = jax.tree.map(lambda a: a * 20.0 if a.ndim >= 2 else a + 0.1, params)  # weights that matter
  prompts = jax.random.randint(jax.random.key(8), (3, 6), 1, CONFIG.vocab_size)
  mask = jnp.ones_like(prompts, bool)
  for greedy in (True, False):
    outs = [sampling.sample(params, CONFIG.replace(decode_projections=m), prompts, mask, jax.random.key(9),
                            num_samples=2, max_new_tokens=10, greedy=greedy, eos_token_ids=())
            for m in ("auto", mode)]
    np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
    np.testing.assert_allclose(outs[0].logprobs, outs[1].logprobs, rtol=1e-4, atol=1e-4)
    assert len(np.unique(np.asarray(outs[0].tokens))) > 3  # not one token repeated


def test_unknown_decode_projections_is_refused():
  with pytest.raises(ValueError, match="unknown decode_projections='fused'; choose from"):
    CONFIG.replace(decode_projections="fused")
