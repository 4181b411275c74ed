"""ModelConfig <-> Hugging Face config dicts (models/config.py)."""

import pytest
import transformers

from grpo_jax import models

_SIZES = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2)


def test_from_transformers_configs():
  qwen2 = models.ModelConfig.from_hf_dict(transformers.Qwen2Config(**_SIZES, rope_theta=1e6).to_dict())
  assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.qk_norm, qwen2.head_dim, qwen2.rope_theta) == (True, False, False, 8, 1e6)
  qwen3 = models.ModelConfig.from_hf_dict(transformers.Qwen3Config(**_SIZES, head_dim=16).to_dict())
  assert (qwen3.qkv_bias, qwen3.qk_norm, qwen3.head_dim) == (False, True, 16)
  llama = models.ModelConfig.from_hf_dict(transformers.LlamaConfig(**_SIZES, eos_token_id=[5, 7]).to_dict())
  assert llama.eos_token_ids == (5, 7) and llama.rope_scaling is None


def test_legacy_rope_keys_and_round_trip():
  d = dict(_SIZES, model_type="llama", rope_theta=5e5, eos_token_id=3,
           rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192})
  config = models.ModelConfig.from_hf_dict(d, dtype="bfloat16")
  assert config.rope_scaling == models.RopeScaling(32.0, 1.0, 4.0, 8192)
  assert config.rope_theta == 5e5 and config.eos_token_ids == (3,) and config.dtype == "bfloat16"
  again = models.ModelConfig.from_hf_dict(config.to_hf_dict(), dtype="bfloat16")
  assert again == config
  # transformers reads what we write.
  hf = transformers.LlamaConfig.from_dict(config.to_hf_dict())
  assert hf.rope_parameters["rope_type"] == "llama3" and hf.rope_parameters["factor"] == 32.0


def test_config_is_hashable_and_rejects_bad_input():
  config = models.tiny_config()
  assert hash(config) == hash(models.tiny_config())
  with pytest.raises(models.CheckpointError, match="unsupported rope_type='yarn'"):
    models.ModelConfig.from_hf_dict(dict(_SIZES, model_type="qwen2", rope_scaling={"rope_type": "yarn"}))
  with pytest.raises(models.CheckpointError, match="use_sliding_window"):
    models.ModelConfig.from_hf_dict(dict(_SIZES, model_type="qwen2", use_sliding_window=True))
  with pytest.raises(models.CheckpointError, match="hidden_act"):
    models.ModelConfig.from_hf_dict(dict(_SIZES, model_type="llama", hidden_act="gelu"))
  with pytest.raises(models.CheckpointError, match="missing key 'hidden_size'"):
    models.ModelConfig.from_hf_dict({"model_type": "qwen2", "vocab_size": 3})
