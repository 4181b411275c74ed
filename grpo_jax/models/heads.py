"""Scalar head on the transformer backbone: PPO value models and reward models.

Params: {"backbone": <policy params without lm_head>, "head": {"kernel": [embed], "bias": []}}.
"""

from typing import Any

import chex
import jax
import jax.numpy as jnp

from grpo_jax.models import transformer
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.logical_axes import logical_axes_of

Params = dict[str, Any]


def init_scalar_params(config: ModelConfig, key: jax.Array, *, backbone: Params | None = None,
                       head_scale: float = 1.0) -> Params:
  """Parameters of a scalar model.

  Args:
    config: the backbone's config.
    key: PRNG key for the head (and for the backbone when none is given).
    backbone: policy (or backbone) params to start from; copied, `lm_head` dropped.
      None: a fresh random backbone.
    head_scale: the head kernel is normal(0, head_scale / sqrt(hidden_size)); 0 gives a zero head.

  Returns:
    {"backbone": ..., "head": {"kernel": [E], "bias": []}} in `config.param_dtype`.
  """
  backbone_key, head_key = jax.random.split(key)
  if backbone is None:
    backbone = transformer.init_params(config, backbone_key)
  backbone = jax.tree.map(jnp.array, transformer.backbone(backbone))  # A copy, not an alias.
  e = config.hidden_size
  kernel = head_scale * jax.random.normal(head_key, (e,), jnp.float32) / jnp.sqrt(e)
  head = {"kernel": kernel.astype(config.param_dtype), "bias": jnp.zeros((), config.param_dtype)}
  return {"backbone": backbone, "head": head}


def scalar_apply(params: Params, config: ModelConfig, tokens: jax.Array, *, attention_mask: jax.Array | None = None,
                 positions: jax.Array | None = None) -> jax.Array:
  """One scalar per token: v[b, t] = head(hidden[b, t]) after reading tokens[b, :t+1].

  Args:
    params: from `init_scalar_params`.
    config: the backbone's config.
    tokens: [B, L] token ids.
    attention_mask: [B, L] bool, False at padding.
    positions: [B, L] positions; default from the mask.

  Returns:
    [B, L] float32 (0 where attention_mask is False).
  """
  chex.assert_rank(tokens, 2)
  hidden, _ = transformer.hidden_states(params["backbone"], config, tokens, positions=positions,
                                        attention_mask=attention_mask)
  values = scalar_head(params["head"], hidden)
  if attention_mask is not None:
    values = jnp.where(attention_mask, values, 0.0)
  return values


def scalar_head(head: Params, hidden: jax.Array) -> jax.Array:
  """The head's scalar of each hidden state: hidden [..., E] · kernel + bias, float32 [...]."""
  values = jnp.einsum("...e,e->...", hidden.astype(jnp.float32), head["kernel"].astype(jnp.float32))
  return values + head["bias"].astype(jnp.float32)


def scalar_logical_axes(config: ModelConfig) -> Params:
  """Logical axis names of `init_scalar_params(config, key)` (tuples as leaves)."""
  shapes = jax.eval_shape(lambda k: init_scalar_params(config, k), jax.random.key(0))
  return logical_axes_of(shapes)
