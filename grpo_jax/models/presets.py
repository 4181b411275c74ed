"""Named model shapes: the Hugging Face configs of the models this project compiles and benchmarks for, without weights.

  config = presets.config("qwen2.5-0.5b", dtype="bfloat16", scan_layers=True)   # the architecture, random weights
  tiny_config(**presets.sizes("qwen2.5-0.5b"))    # its sizes over the character tokenizer (the benchmarks' model)

Only the architecture is here (the fields `ModelConfig.from_hf_dict` reads from a config.json); runtime settings
(dtype, remat, layer scan, attention, LoRA) are the caller's keywords. Ahead-of-time compilation
(`scripts/aot_compile.py`), the memory tables (`scripts/lora_memory.py`) and the benchmarks take their shapes from
this one table.
"""

from grpo_jax.models.config import ModelConfig

_QWEN2 = dict(model_type="qwen2", qkv_bias=True, rope_theta=1e6, rms_norm_eps=1e-6, eos_token_ids=(151645, 151643),
              pad_token_id=151643, max_position_embeddings=32768)

PRESETS = {
    # Qwen2.5 (arXiv 2412.15115), the configs of Qwen/Qwen2.5-{0.5B,1.5B,7B} on the Hugging Face hub.
    "qwen2.5-0.5b": dict(_QWEN2, vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(_QWEN2, vocab_size=151_936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, head_dim=128, tie_word_embeddings=True),
    "qwen2.5-7b": dict(_QWEN2, vocab_size=152_064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, head_dim=128, tie_word_embeddings=False),
    # DeepSeekMath-7B (arXiv 2402.03300): the DeepSeek-LLM 7B architecture, Llama-shaped.
    "deepseek-math-7b": dict(model_type="llama", vocab_size=102_400, hidden_size=4096, intermediate_size=11008,
                             num_hidden_layers=30, num_attention_heads=32, num_key_value_heads=32, head_dim=128,
                             rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=4096,
                             tie_word_embeddings=False, bos_token_id=100000, eos_token_ids=(100001,),
                             pad_token_id=100001),
}

# The fields that decide a model's arrays and their shapes (what a benchmark over random weights needs).
SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "tie_word_embeddings", "qkv_bias", "o_bias", "mlp_bias", "qk_norm")


def _preset(name: str) -> dict:
  if name not in PRESETS:
    raise KeyError(f"unknown model preset {name!r} (known: {', '.join(PRESETS)})")
  return PRESETS[name]


def config(name: str, **runtime) -> ModelConfig:
  """The ModelConfig of preset `name` with `runtime` keywords (dtype, param_dtype, remat, scan_layers, attention,
  ...; any field may be overridden)."""
  return ModelConfig(**{**_preset(name), **runtime})


def sizes(name: str) -> dict:
  """The SIZE_FIELDS of preset `name`: keywords of `models.tiny_config` for a model of its shapes over the
  character tokenizer (random weights, the benchmarks' model)."""
  preset = config(name)
  return {field: getattr(preset, field) for field in SIZE_FIELDS}
