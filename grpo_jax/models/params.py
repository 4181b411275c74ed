"""The model's parameters as a plain nested dict: the two layer layouts, and the NNX module a dict fills.

The trainers hold parameters as plain nested dicts (pytrees of arrays); the model's functions (`transformer`) merge
such a dict into a cached abstract NNX module inside the trace (`merge`). The L layers are either unrolled,
`layers_{i}/...`, or stacked under `layers/...` with a leading [L] axis (`config.scan_layers`); `stack_layers`
and `unstack_layers` convert between the two, which compute the same function.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from grpo_jax.models.config import ModelConfig

Params = dict[str, Any]

STACKED = "layers"  # the params key of the stacked layers (config.scan_layers)


def layer_keys(config: ModelConfig) -> list[str]:
  """The unrolled layout's layer keys, `layers_0` ... `layers_{L-1}`."""
  return [f"layers_{i}" for i in range(config.num_hidden_layers)]


def stack_layers(params: Params, config: ModelConfig) -> Params:
  """Unrolled params (`layers_{i}/...`) -> the scanned layout (`layers/...`, leading [L] axis).

  Works on any params-shaped dict holding the layers (policy, backbone, a reward
  model's "backbone"); other entries are kept as they are.
  """
  keys = layer_keys(config)
  out = {k: v for k, v in params.items() if k not in keys}
  out[STACKED] = jax.tree.map(lambda *xs: jnp.stack(xs), *[params[k] for k in keys])
  return out


def unstack_layers(params: Params, config: ModelConfig) -> Params:
  """The scanned layout -> unrolled params (inverse of `stack_layers`)."""
  out = {k: v for k, v in params.items() if k != STACKED}
  for i, key in enumerate(layer_keys(config)):
    out[key] = jax.tree.map(lambda x, i=i: x[i], params[STACKED])
  return out


def backbone(params: Params) -> Params:
  """The decoder part of a params dict (everything but `lm_head`)."""
  return {k: v for k, v in params.items() if k != "lm_head"}


def pure_dict(state) -> Params:
  """An NNX state as a plain nested dict of its leaves."""
  return nnx.to_pure_dict(state) if hasattr(nnx, "to_pure_dict") else state.to_pure_dict()


@functools.lru_cache(maxsize=32)
def abstract(cls: type, config: ModelConfig):
  """(graphdef, abstract state) of `cls(config, rngs)`, shapes only (cached per class and config)."""
  return nnx.split(nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0))))


def shapes(cls: type, config: ModelConfig) -> Params:
  """The params dict of `cls(config, rngs)` with `jax.ShapeDtypeStruct` leaves."""
  return pure_dict(abstract(cls, config)[1])


def _has_adapters(params) -> bool:
  return isinstance(params, dict) and ("lora_a" in params or any(_has_adapters(v) for v in params.values()))


def merge(cls: type, config: ModelConfig, params: Params) -> nnx.Module:
  """The module `cls(config, ...)` holding `params` (no copy). A LoRA config's params without adapters (`lora.
  disabled`) give the plain model: the config's adapters are dropped."""
  if config.lora_rank and not _has_adapters(params):  # LoRA's base alone (its adapters off): the plain model
    config = config.replace(lora_rank=0, lora_alpha=0.0, lora_targets=())
  graphdef, abstract_state = abstract(cls, config)
  state = jax.tree.map(lambda x: x, abstract_state)
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)
