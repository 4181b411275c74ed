"""Scalar (value / reward) head on the backbone (models/heads.py)."""

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import models

_scalar_apply = jax.jit(models.scalar_apply, static_argnums=1)
_hidden_states = jax.jit(models.hidden_states, static_argnums=1)

CONFIG = models.ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=False)


def test_init_from_policy_copies_backbone():
  policy = models.init_params(CONFIG, jax.random.key(0))
  params = models.init_scalar_params(CONFIG, jax.random.key(1), backbone=policy)
  assert set(params) == {"backbone", "head"} and "lm_head" not in params["backbone"]
  a, b = params["backbone"]["layers_0"]["mlp"]["up_proj"]["kernel"], policy["layers_0"]["mlp"]["up_proj"]["kernel"]
  np.testing.assert_array_equal(a, b)
  assert a is not b
  assert params["head"]["kernel"].shape == (32,) and params["head"]["bias"].shape == ()
  fresh = models.init_scalar_params(CONFIG, jax.random.key(1))
  assert float(jnp.abs(fresh["backbone"]["embed"]["embedding"] - policy["embed"]["embedding"]).max()) > 0
  zero = models.init_scalar_params(CONFIG, jax.random.key(1), head_scale=0.0)
  assert float(jnp.abs(zero["head"]["kernel"]).max()) == 0.0


def test_scalar_apply_values_padding_and_gradient():
  params = models.init_scalar_params(CONFIG, jax.random.key(2))
  params["head"]["bias"] = jnp.asarray(0.25)
  tokens = jax.random.randint(jax.random.key(3), (2, 9), 0, CONFIG.vocab_size)
  mask = jnp.arange(9)[None] >= jnp.array([[0], [3]])
  values = _scalar_apply(params, CONFIG, tokens, attention_mask=mask)
  assert values.shape == (2, 9) and values.dtype == jnp.float32
  hidden, _ = _hidden_states(params["backbone"], CONFIG, tokens, attention_mask=mask)
  expected = hidden @ params["head"]["kernel"] + 0.25
  np.testing.assert_allclose(values, jnp.where(mask, expected, 0.0), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(values[1, :3], 0.0)
  # Left padding does not change the values of the real tokens.
  unpadded = _scalar_apply(params, CONFIG, tokens[1:, 3:])
  np.testing.assert_allclose(values[1, 3:], unpadded[0], atol=1e-5)
  grads = jax.jit(jax.grad(lambda p: models.scalar_apply(p, CONFIG, tokens, attention_mask=mask).sum()))(params)
  np.testing.assert_allclose(grads["head"]["bias"], mask.sum(), rtol=1e-6)
  assert float(jnp.abs(grads["backbone"]["layers_0"]["attn"]["q_proj"]["kernel"]).max()) > 0


def test_scalar_logical_axes():
  axes = models.scalar_logical_axes(CONFIG)
  assert axes["head"] == {"kernel": ("embed",), "bias": ()}
  assert axes["backbone"]["embed"]["embedding"] == ("vocab", "embed")
