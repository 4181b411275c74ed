"""LoRA adapters on the transformer's linear projections (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
Language Models"), with the frozen base weights shared, never copied.

A targeted projection y = x·W (+ bias) becomes

  y = x·W + (x·A)·B · α / r,    A [*in, r] ~ U(−1/√fan_in, 1/√fan_in),  B [r, *out] = 0,

so at initialisation the adapted model is exactly the base model, and only A and B (r·(in + out) numbers per
projection instead of in·out) are trained. The model computes the rank-r product itself
(`layers.Proj`); the adapters are extra leaves `lora_a`, `lora_b` beside each targeted `kernel` in the
ordinary params dict, and the `ModelConfig` fields `lora_rank`, `lora_alpha`, `lora_targets` say which
projections carry them. This module adds, splits, switches off, merges and exports them:

  config = lora.lora_config(base_config, rank=8, alpha=16, targets=("q", "v"))
  params = lora.add_adapters(base_params, config, key)       # base arrays shared, adapters new
  trained, frozen = lora.split(params)                        # optimise `trained` only
  reference = lora.disabled(params)                           # the base arrays alone: no copy of W
  merged, base_config = lora.merge(params, config)            # W + A·B·α/r, a plain model (HF export)
  lora.save_peft(params, config, directory, base_model_name_or_path=...)   # PEFT's adapter files

Why not qwix (Google's LoRA for Flax, which Tunix uses): qwix intercepts `dot_general` / `einsum` calls made
inside a Flax module's methods and creates the adapters lazily as module attributes on the first call, keyed by
the weight the right-hand operand came from. Our model is applied functionally: every call re-merges a plain
params dict into a cached abstract module (`params.merge`), its projections go through a custom-VJP
`project` whose operand is a dtype-cast copy of the kernel, and decode steps multiply k/v and gate/up as one
stacked kernel (`project_together`), which is no module weight: qwix would see no weight there and sample from
the base model silently. The explicit form is a few lines, keeps the adapters in the params dict (so sharding
rules, checkpoints and the scanned layer stack handle them like any weight) and keeps the decode fast path.
"""

import json
import pathlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

from grpo_jax.models import transformer
from grpo_jax.models.config import LORA_TARGETS, ModelConfig
from grpo_jax.models.params import STACKED, unstack_layers

Params = dict[str, Any]
ADAPTER_LEAVES = ("lora_a", "lora_b")
_MODULES = {"q": ("attn", "q_proj"), "k": ("attn", "k_proj"), "v": ("attn", "v_proj"), "o": ("attn", "o_proj"),
            "gate": ("mlp", "gate_proj"), "up": ("mlp", "up_proj"), "down": ("mlp", "down_proj")}
_HF_MODULE = {"attn": "self_attn", "mlp": "mlp"}
assert set(_MODULES) == set(LORA_TARGETS)


def lora_config(config: ModelConfig, *, rank: int, alpha: float, targets) -> ModelConfig:
  """`config` with LoRA adapters of rank `rank` and scale `alpha / rank` on `targets` (names in LORA_TARGETS)."""
  return config.replace(lora_rank=int(rank), lora_alpha=float(alpha), lora_targets=tuple(targets))


def base_config(config: ModelConfig) -> ModelConfig:
  """`config` without adapters."""
  return config.replace(lora_rank=0, lora_alpha=0.0, lora_targets=())


def _key(path) -> str:
  return getattr(path, "key", None)


def is_adapter(path) -> bool:
  """Whether a leaf path (`tree_flatten_with_path`'s) ends in an adapter matrix."""
  return bool(path) and _key(path[-1]) in ADAPTER_LEAVES


def is_trained(path) -> bool:
  """Leaves that LoRA fine-tuning trains: the adapters, and a scalar model's head (PPO's value head, which has no
  pretrained weights to keep)."""
  return is_adapter(path) or any(_key(p) == "head" for p in path)


def _nest(pairs) -> Params:
  out = {}
  for path, x in pairs:
    node = out
    for p in path[:-1]:
      node = node.setdefault(_key(p), {})
    node[_key(path[-1])] = x
  return out


def split(tree: Params, trained=is_trained) -> tuple[Params, Params]:
  """`(trained, frozen)`: a nested dict's leaves cut in two nested dicts by `trained(path)`; `join` undoes it.

  The arrays are the tree's own (no copies)."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return (_nest((p, x) for p, x in leaves if trained(p)), _nest((p, x) for p, x in leaves if not trained(p)))


def join(a: Params, b: Params) -> Params:
  """The union of two nested dicts with disjoint leaves (the inverse of `split`)."""
  out = dict(b)
  for k, v in a.items():
    if k in out:
      if not (isinstance(v, dict) and isinstance(out[k], dict)):
        raise ValueError(f"lora.join: {k!r} is in both trees")
      out[k] = join(v, out[k])
    else:
      out[k] = v
  return out


class TrainedPart(NamedTuple):
  """What a run trains of its params, decided once: with LoRA (`enabled`) the trained leaves (`is_trained`: the
  adapters, a value head), the rest frozen; without it the whole tree, nothing frozen (the identity).

    part = TrainedPart(enabled=config.lora_rank > 0)
    trained, frozen = part.split(params)       # frozen: None without LoRA
    params = part.join(trained, frozen)        # the tree the model applies
  """
  enabled: bool

  def split(self, tree: Params) -> tuple[Params, Params | None]:
    """`(trained, frozen)`; `(tree, None)` without LoRA. No copies."""
    return split(tree) if self.enabled else (tree, None)

  def trained(self, tree: Params) -> Params:
    return self.split(tree)[0]

  def join(self, trained: Params, frozen: Params | None) -> Params:
    """The whole tree again (`trained` itself when `frozen` is None)."""
    return trained if frozen is None else join(trained, frozen)


def adapters(tree: Params) -> Params:
  """The adapter leaves of a params (or params-shaped) dict, nested as they are."""
  return split(tree, is_adapter)[0]


def init_adapters(config: ModelConfig, key: jax.Array) -> Params:
  """Fresh adapters for `config` (float32): A ~ U(−1/√fan_in, 1/√fan_in) (PEFT's default Kaiming-uniform,
  a = √5), B = 0. In the scanned layout each layer has its own draw."""
  if not config.lora_rank:
    raise ValueError("lora.init_adapters: the config has no adapters (lora_rank = 0)")
  shapes = adapters(jax.eval_shape(lambda: transformer.init_params(config, jax.random.key(0))))
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  out = []
  for i, (path, leaf) in enumerate(leaves):
    if _key(path[-1]) == "lora_b":
      out.append(jnp.zeros(leaf.shape, jnp.float32))
      continue
    stacked = any(_key(p) == STACKED for p in path)
    fan_in = int(np.prod(leaf.shape[1 if stacked else 0:-1]))
    bound = 1.0 / np.sqrt(fan_in)
    out.append(jax.random.uniform(jax.random.fold_in(key, i), leaf.shape, jnp.float32, -bound, bound))
  return jax.tree_util.tree_unflatten(treedef, out)


def add_adapters(params: Params, config: ModelConfig, key: jax.Array) -> Params:
  """Base params (any placement) plus fresh adapters (`init_adapters`): the base arrays are shared, not copied."""
  return join(init_adapters(config, key), params)


def disabled(params: Params) -> Params:
  """The adapted params with the adapters switched off: the base arrays alone (no copy, no zero adapters), which an
  adapted config's model applies as the base model (`params.merge` drops the adapters it finds none of)."""
  return split(params, is_adapter)[1]


def delta(a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
  """A·B·scale as a kernel [*in, *out]: A [*in, r] contracted with B [r, *out] over r, in float32."""
  return jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), 1) * scale


def merge(params: Params, config: ModelConfig) -> tuple[Params, ModelConfig]:
  """`(params, config)` of the plain model the adapted one computes: W ← W + A·B·α/r, adapters removed.

  The merged kernels keep their dtype; the model equals the adapted one up to that rounding (exactly in float32
  up to the order of the sums)."""
  if not config.lora_rank:
    return params, config
  scale = config.lora_alpha / config.lora_rank

  def fold(node, stacked):
    if not isinstance(node, dict):
      return node
    if "lora_a" in node:
      d = (jax.vmap(delta, in_axes=(0, 0, None)) if stacked else delta)(node["lora_a"], node["lora_b"], scale)
      kernel = node["kernel"]
      merged = {k: v for k, v in node.items() if k not in ADAPTER_LEAVES}
      merged["kernel"] = (kernel.astype(jnp.float32) + d).astype(kernel.dtype)
      return merged
    return {k: fold(v, stacked or k == STACKED) for k, v in node.items()}

  return jax.jit(lambda p: fold(p, False))(params), base_config(config)


def _peft_tensors(params: Params, config: ModelConfig) -> dict[str, np.ndarray]:
  """PEFT's tensor names and torch layouts: lora_A.weight [r, in], lora_B.weight [out, r] per adapted module."""
  if STACKED in params:
    params = unstack_layers(params, config)
  scale_free = {}
  for i in range(config.num_hidden_layers):
    for target in config.lora_targets:
      block, name = _MODULES[target]
      node = params[f"layers_{i}"][block][name]
      a, b = np.asarray(node["lora_a"], np.float32), np.asarray(node["lora_b"], np.float32)
      r = config.lora_rank
      prefix = f"base_model.model.model.layers.{i}.{_HF_MODULE[block]}.{name}"
      scale_free[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a.reshape(-1, r).T)
      scale_free[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b.reshape(r, -1).T)
  return scale_free


def peft_config(config: ModelConfig, base_model_name_or_path: str) -> dict:
  """adapter_config.json for PEFT's `LoraConfig` (scaling α / r, no dropout, no bias)."""
  return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model_name_or_path,
          "r": config.lora_rank, "lora_alpha": config.lora_alpha, "lora_dropout": 0.0, "bias": "none",
          "target_modules": sorted(_MODULES[t][1] for t in config.lora_targets), "fan_in_fan_out": False,
          "use_rslora": False, "use_dora": False, "modules_to_save": None, "inference_mode": True,
          "init_lora_weights": True}


def save_peft(params: Params, config: ModelConfig, directory: str | pathlib.Path, *,
              base_model_name_or_path: str) -> None:
  """Writes the adapters as PEFT does (`adapter_config.json`, `adapter_model.safetensors`), so that
  `peft.PeftModel.from_pretrained(base_hf_model, directory)` loads them. `params` whole on this host."""
  if not config.lora_rank:
    raise ValueError("lora.save_peft: the config has no adapters (lora_rank = 0)")
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  safetensors.numpy.save_file(_peft_tensors(params, config), str(directory / "adapter_model.safetensors"),
                              metadata={"format": "pt"})
  (directory / "adapter_config.json").write_text(json.dumps(peft_config(config, base_model_name_or_path), indent=2))
