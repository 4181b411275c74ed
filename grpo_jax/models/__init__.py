"""Policy models: Qwen2/Qwen2.5, Qwen3 and Llama 3.x decoders, HF checkpoints, the tiny default model.

Example:
  from grpo_jax import models
  params, config = models.load_hf(path)
  logits, cache = models.apply(params, config, tokens, attention_mask=mask)
"""

from grpo_jax.models.config import (DECODE_PROJECTIONS, REMAT_POLICIES, CheckpointError, ModelConfig, RopeScaling,
                                    SUPPORTED_MODEL_TYPES)
from grpo_jax.models.heads import init_scalar_params, scalar_apply, scalar_logical_axes
from grpo_jax.models.hf_io import load_hf, read_config, save_hf
from grpo_jax.models.logical_axes import LOGICAL_AXES, axis_rules, constrain, logical_to_spec
from grpo_jax.models.tiny import build_default_checkpoint, tiny_config
from grpo_jax.models.tokenizer import build_char_tokenizer, load_tokenizer, save_char_tokenizer
from grpo_jax.models.kv_cache import KVCache, KVPrefix, as_prefix, init_cache
from grpo_jax.models.params import backbone, stack_layers, unstack_layers
from grpo_jax.models.rope import rope_inv_freq
from grpo_jax.models.transformer import (CausalLM, Decoder, apply, hidden_states, init_params, logits_from_hidden,
                                         param_logical_axes, unembedding)

__all__ = (
    "CausalLM",
    "CheckpointError",
    "DECODE_PROJECTIONS",
    "Decoder",
    "KVCache",
    "KVPrefix",
    "LOGICAL_AXES",
    "ModelConfig",
    "REMAT_POLICIES",
    "RopeScaling",
    "SUPPORTED_MODEL_TYPES",
    "apply",
    "as_prefix",
    "axis_rules",
    "backbone",
    "build_char_tokenizer",
    "build_default_checkpoint",
    "constrain",
    "hidden_states",
    "init_cache",
    "init_params",
    "init_scalar_params",
    "load_hf",
    "load_tokenizer",
    "logical_to_spec",
    "logits_from_hidden",
    "param_logical_axes",
    "read_config",
    "rope_inv_freq",
    "save_char_tokenizer",
    "save_hf",
    "scalar_apply",
    "scalar_logical_axes",
    "stack_layers",
    "tiny_config",
    "unembedding",
    "unstack_layers",
)
