"""Model configuration: one frozen dataclass for Qwen2/Qwen2.5, Qwen3 and Llama 3.x."""

import dataclasses
from typing import Any

import jax.numpy as jnp

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
# What a rematerialised layer keeps for the backward pass (`remat_policy`; transformer._POLICIES maps each to
# a jax.checkpoint policy):
# full: only its input (everything recomputed); dots_no_batch: also the outputs of the weight matmuls
# (attention scores recomputed); dots: every matmul output.
REMAT_POLICIES = ("full", "dots_no_batch", "dots")
# How multi-token forwards attend (`attention`; grpo_jax.models.attention, which checks it holds its names).
ATTENTION_IMPLEMENTATIONS = ("einsum", "xla", "cudnn", "pallas")
# How a decode step runs the projections that read one input (`decode_projections`; `models.layers`): auto, k with v
# and gate with up as one product each on the CPU, each its own elsewhere; together, on every platform q, k and v
# as one product and gate with up as one; separate, each its own everywhere.
DECODE_PROJECTIONS = ("auto", "together", "separate")
# The projections LoRA can adapt (`lora_targets`), as PEFT's target_modules name them without `_proj`.
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")

_ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
}


class CheckpointError(ValueError):
  """A checkpoint that cannot be loaded or restored (an HF directory, its config or tensors, a reward model, a train
  state: `training.checkpointing` raises this one too); the message names the path, step or tensor."""


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama 3 RoPE frequency scaling (`rope_scaling.rope_type == "llama3"`)."""

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int

  def to_hf_dict(self) -> dict[str, Any]:
    return {
        "rope_type": "llama3",
        "factor": self.factor,
        "low_freq_factor": self.low_freq_factor,
        "high_freq_factor": self.high_freq_factor,
        "original_max_position_embeddings": self.original_max_position_embeddings,
    }


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture plus run-time numerics of a decoder-only transformer.

  Hashable, so it can be a static argument of `jax.jit`. Field names follow the
  Hugging Face config; `dtype` (activations), `param_dtype` (weights), `remat`
  (per-layer rematerialisation) with its `remat_policy` (one of REMAT_POLICIES),
  and `scan_layers` (the layer stack as one `lax.scan` over stacked weights,
  params under `layers/...` with a leading [num_hidden_layers] axis, instead
  of unrolled `layers_{i}/...`), `attention` and `decode_projections` (one of
  DECODE_PROJECTIONS) are run-time settings that are not written to
  config.json; so are `lora_rank`, `lora_alpha` and `lora_targets` (a subset of
  LORA_TARGETS): with a rank r > 0 the targeted projections take LoRA adapters
  from the params dict (`grpo_jax.models.lora`).
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int
  model_type: str = "qwen2"
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  max_position_embeddings: int = 32768
  qkv_bias: bool = False
  o_bias: bool = False
  mlp_bias: bool = False
  qk_norm: bool = False
  tie_word_embeddings: bool = False
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  pad_token_id: int | None = None
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: bool = False
  remat_policy: str = "full"
  scan_layers: bool = False
  attention: str = "einsum"  # multi-token attention: one of attention.IMPLEMENTATIONS (resolved, not auto)
  decode_projections: str = "auto"  # one of DECODE_PROJECTIONS
  lora_rank: int = 0
  lora_alpha: float = 0.0
  lora_targets: tuple[str, ...] = ()

  def __post_init__(self):
    if self.model_type not in SUPPORTED_MODEL_TYPES:
      raise CheckpointError(
          f"unsupported architecture model_type={self.model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise CheckpointError(
          f"num_attention_heads={self.num_attention_heads} is not a multiple of "
          f"num_key_value_heads={self.num_key_value_heads}")
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f"unknown remat_policy={self.remat_policy!r}; choose from {REMAT_POLICIES}")
    if self.attention not in ATTENTION_IMPLEMENTATIONS:
      raise ValueError(f"unknown attention={self.attention!r}; choose from {ATTENTION_IMPLEMENTATIONS}")
    if self.decode_projections not in DECODE_PROJECTIONS:
      raise ValueError(f"unknown decode_projections={self.decode_projections!r}; choose from {DECODE_PROJECTIONS}")
    object.__setattr__(self, "dtype", jnp.dtype(self.dtype).name)
    object.__setattr__(self, "param_dtype", jnp.dtype(self.param_dtype).name)
    object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in self.eos_token_ids))
    object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
    unknown = [t for t in self.lora_targets if t not in LORA_TARGETS]
    if unknown or self.lora_rank < 0 or bool(self.lora_rank) != bool(self.lora_targets):
      raise ValueError(f"LoRA: rank {self.lora_rank} with targets {self.lora_targets}: the rank must be > 0 exactly "
                       f"when targets are given, each one of {LORA_TARGETS}")

  @property
  def num_groups(self) -> int:
    """Query heads per key/value head."""
    return self.num_attention_heads // self.num_key_value_heads

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_hf_dict(cls, d: dict[str, Any], *, source: str = "config.json", **runtime) -> "ModelConfig":
    """Builds a config from a Hugging Face config.json dict (legacy or transformers-5 rope keys).

    Args:
      d: the parsed config.json.
      source: path named in error messages.
      **runtime: `dtype`, `param_dtype`, `remat`, `remat_policy`, `scan_layers`, `attention`,
        `decode_projections`.

    Raises:
      CheckpointError: unsupported architecture or feature, or a missing key.
    """
    model_type = d.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
      raise CheckpointError(
          f"{source}: unsupported architecture model_type={model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
    if d.get("hidden_act", "silu") != "silu":
      raise CheckpointError(f"{source}: unsupported hidden_act={d['hidden_act']!r} (only silu)")
    if d.get("use_sliding_window", False):
      raise CheckpointError(f"{source}: unsupported use_sliding_window=true")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
      if key not in d:
        raise CheckpointError(f"{source}: missing key {key!r}")

    rope = dict(d.get("rope_parameters") or {})
    legacy = d.get("rope_scaling") or {}
    rope = {**legacy, **rope}
    rope_theta = float(d.get("rope_theta", rope.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "llama3":
      rope_scaling = RopeScaling(
          factor=float(rope["factor"]),
          low_freq_factor=float(rope["low_freq_factor"]),
          high_freq_factor=float(rope["high_freq_factor"]),
          original_max_position_embeddings=int(rope["original_max_position_embeddings"]))
    elif rope_type == "default":
      rope_scaling = None
    else:
      raise CheckpointError(f"{source}: unsupported rope_type={rope_type!r} (supported: default, llama3)")

    heads = d["num_attention_heads"]
    head_dim = d.get("head_dim") or d["hidden_size"] // heads
    attention_bias = bool(d.get("attention_bias", False))
    eos = d.get("eos_token_id")
    eos = () if eos is None else (tuple(eos) if isinstance(eos, (list, tuple)) else (eos,))
    return cls(
        model_type=model_type,
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=d.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=d.get("max_position_embeddings", 32768),
        qkv_bias=True if model_type == "qwen2" else attention_bias,
        o_bias=False if model_type == "qwen2" else attention_bias,
        mlp_bias=bool(d.get("mlp_bias", False)) if model_type == "llama" else False,
        qk_norm=model_type == "qwen3",
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        bos_token_id=d.get("bos_token_id"),
        eos_token_ids=eos,
        pad_token_id=d.get("pad_token_id"),
        **runtime)

  def to_hf_dict(self) -> dict[str, Any]:
    """The config.json dict (legacy `rope_theta`/`rope_scaling` keys, read by transformers 4 and 5)."""
    d = {
        "architectures": [_ARCHITECTURES[self.model_type]],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_hidden_layers,
        "num_attention_heads": self.num_attention_heads,
        "num_key_value_heads": self.num_key_value_heads,
        "head_dim": self.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": self.rms_norm_eps,
        "rope_theta": self.rope_theta,
        "rope_scaling": self.rope_scaling.to_hf_dict() if self.rope_scaling else None,
        "max_position_embeddings": self.max_position_embeddings,
        "tie_word_embeddings": self.tie_word_embeddings,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": (self.eos_token_ids[0] if len(self.eos_token_ids) == 1
                         else list(self.eos_token_ids) or None),
        "pad_token_id": self.pad_token_id,
        "torch_dtype": self.param_dtype,
        "use_cache": True,
    }
    if self.model_type == "qwen2":
      if self.qkv_bias is not True or self.o_bias:
        raise CheckpointError("qwen2 always has q/k/v bias and no o_proj bias")
      d["use_sliding_window"] = False
    else:
      if self.qkv_bias != self.o_bias:
        raise CheckpointError(f"{self.model_type}: attention_bias covers q/k/v/o together")
      d["attention_bias"] = self.qkv_bias
    if self.model_type == "qwen3":
      d["use_sliding_window"] = False
    if self.model_type == "llama":
      d["mlp_bias"] = self.mlp_bias
    if self.qk_norm != (self.model_type == "qwen3"):
      raise CheckpointError(f"{self.model_type}: q/k norm is present exactly for qwen3")
    return d
