"""The params dict (models/params.py): the two layer layouts, and the module a dict fills."""

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import models
from grpo_jax.models import lora, params, transformer

CONFIG = models.ModelConfig(vocab_size=61, hidden_size=16, intermediate_size=24, num_hidden_layers=12,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=8)


def test_stack_and_unstack_layers():
  """Layer i of the unrolled dict is row i of the stacked one (layers_10 after layers_9); other entries kept."""
  keys = params.layer_keys(CONFIG)
  assert keys[:3] == ["layers_0", "layers_1", "layers_2"] and keys[-1] == "layers_11"
  unrolled = {k: {"w": jnp.full((2,), i)} for i, k in enumerate(keys)} | {"embed": {"embedding": jnp.ones((3, 2))}}
  stacked = params.stack_layers(unrolled, CONFIG)
  assert sorted(stacked) == ["embed", params.STACKED]
  np.testing.assert_array_equal(stacked[params.STACKED]["w"][:, 0], np.arange(12))
  back = params.unstack_layers(stacked, CONFIG)
  assert jax.tree.structure(back) == jax.tree.structure(unrolled)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(unrolled)):
    np.testing.assert_array_equal(a, b)
  assert "lm_head" not in params.backbone({"lm_head": 1, "embed": 2})


def test_merge_fills_the_module_and_drops_a_lora_config_without_adapters():
  config = CONFIG.replace(num_hidden_layers=1, tie_word_embeddings=False)
  p = transformer.init_params(config, jax.random.key(0))
  module = params.merge(transformer.CausalLM, config, p)
  np.testing.assert_array_equal(module.layers_0.attn.q_proj.kernel[...], p["layers_0"]["attn"]["q_proj"]["kernel"])
  adapted = lora.lora_config(config, rank=2, alpha=4.0, targets=("q",))
  plain = params.merge(transformer.CausalLM, adapted, p)  # base params alone: the adapters are off
  assert plain.layers_0.attn.q_proj.lora_a is None
  with_adapters = params.merge(transformer.CausalLM, adapted, transformer.init_params(adapted, jax.random.key(0)))
  assert with_adapters.layers_0.attn.q_proj.lora_a[...].shape == (16, 2)
  assert params.shapes(transformer.CausalLM, config)["lm_head"]["kernel"].shape == (16, 61)
