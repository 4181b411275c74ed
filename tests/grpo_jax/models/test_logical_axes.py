"""Logical axis names -> mesh axes, and the activation hook (grpo_jax/models/logical_axes.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, Mesh, PartitionSpec

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


# The "fsdp" preset of grpo_jax/partitioning.py, written out.
FSDP = {"batch": ("data", "fsdp"), "embed": "fsdp", "length": None, "mlp": None, "heads": None, "kv_heads": None,
        "vocab": None}
MESH_222 = AbstractMesh((2, 2, 2), ("data", "fsdp", "tensor"))


def test_constrain_names_dedup_and_divisibility():
  P = PartitionSpec
  # Activations: "batch" takes fsdp first, so "embed" stays whole; weights: "embed" is split over fsdp.
  assert models.logical_to_spec(("batch", "length", "embed"), FSDP) == P(("data", "fsdp"), None, None)
  assert models.logical_to_spec(("vocab", "embed"), FSDP) == P(None, "fsdp")
  # With a shape, an axis that does not divide the dimension is dropped (6 rows: data yes, fsdp no).
  assert models.logical_to_spec(("batch", None), FSDP, shape=(6, 3), mesh=MESH_222) == P("data", None)
  assert models.logical_to_spec(("batch", None), FSDP, shape=(1, 3), mesh=MESH_222) == P(None, None)
