"""Logical-axis hook for activations (models/sharding.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from grpo_jax import models


def test_constrain_is_identity_without_rules():
  x = jnp.arange(6.0).reshape(2, 3)
  assert models.constrain(x, ("batch", "embed")) is x
  with pytest.raises(ValueError, match="rank 2"):
    models.constrain(x, ("batch",))


def test_rules_map_logical_names_to_mesh_axes():
  rules = {"batch": "data", "mlp": "model", "embed": None}
  assert models.logical_to_spec(("batch", None, "mlp"), rules) == PartitionSpec("data", None, "model")
  mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
  config = models.ModelConfig(vocab_size=11, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=8)
  params = models.init_params(config, jax.random.key(0))
  tokens = jnp.ones((2, 5), jnp.int32)
  plain = jax.jit(lambda p: models.apply(p, config, tokens)[0])(params)
  with models.axis_rules(mesh, {**rules, "length": None, "heads": "model", "kv_heads": None, "vocab": "model"}):
    lowered = jax.jit(lambda p: models.apply(p, config, tokens)[0]).lower(params)
    ruled = lowered.compile()(params)
  assert "sharding" in lowered.as_text().lower()
  np.testing.assert_allclose(ruled, plain, rtol=1e-6)
  assert models.constrain(tokens, ("batch", "length")) is tokens  # The context has ended.
