"""The decoder's layers (models/layers.py): `project`'s hand-written backward, `project_together`'s one product."""

import dataclasses

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
