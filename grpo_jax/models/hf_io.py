"""Hugging Face checkpoints (config.json + *.safetensors) <-> params dicts, without torch."""

import contextlib
import dataclasses
import json
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import safetensors

from grpo_jax.models.config import CheckpointError, ModelConfig
from grpo_jax.models.params import STACKED, Params

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


@dataclasses.dataclass(frozen=True)
class _Tensor:
  """One HF tensor: its name, torch-layout shape, our params path and the two layout maps."""
  hf_name: str
  path: tuple[str, ...]
  hf_shape: tuple[int, ...]
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def _linear(hf_name, path, out_shape, in_shape):
  """torch Linear weight [prod(out), prod(in)] <-> kernel [*in, *out]."""
  n_out, n_in = int(np.prod(out_shape)), int(np.prod(in_shape))
  return _Tensor(hf_name, path + ("kernel",), (n_out, n_in),
                 lambda w: w.T.reshape(*in_shape, *out_shape),
                 lambda k: k.reshape(n_in, n_out).T)


def _vector(hf_name, path, shape):
  n = int(np.prod(shape))
  return _Tensor(hf_name, path, (n,), lambda w: w.reshape(shape), lambda p: p.reshape(n))


def _tensor_specs(config: ModelConfig) -> list[_Tensor]:
  """Every tensor of the HF checkpoint for `config`, in a stable order."""
  e, m, v = config.hidden_size, config.intermediate_size, config.vocab_size
  h, k, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
  specs = [_Tensor("model.embed_tokens.weight", ("embed", "embedding"), (v, e), lambda w: w, lambda p: p)]
  for i in range(config.num_hidden_layers):
    hf, ours = f"model.layers.{i}.", (f"layers_{i}",)
    attn, mlp = ours + ("attn",), ours + ("mlp",)
    for name, heads in (("q_proj", h), ("k_proj", k), ("v_proj", k)):
      specs.append(_linear(f"{hf}self_attn.{name}.weight", attn + (name,), (heads, d), (e,)))
      if config.qkv_bias:
        specs.append(_vector(f"{hf}self_attn.{name}.bias", attn + (name, "bias"), (heads, d)))
    specs.append(_linear(f"{hf}self_attn.o_proj.weight", attn + ("o_proj",), (e,), (h, d)))
    if config.o_bias:
      specs.append(_vector(f"{hf}self_attn.o_proj.bias", attn + ("o_proj", "bias"), (e,)))
    if config.qk_norm:
      specs.append(_vector(f"{hf}self_attn.q_norm.weight", attn + ("q_norm", "scale"), (d,)))
      specs.append(_vector(f"{hf}self_attn.k_norm.weight", attn + ("k_norm", "scale"), (d,)))
    for name, out_dim, in_dim in (("gate_proj", m, e), ("up_proj", m, e), ("down_proj", e, m)):
      specs.append(_linear(f"{hf}mlp.{name}.weight", mlp + (name,), (out_dim,), (in_dim,)))
      if config.mlp_bias:
        specs.append(_vector(f"{hf}mlp.{name}.bias", mlp + (name, "bias"), (out_dim,)))
    specs.append(_vector(f"{hf}input_layernorm.weight", ours + ("input_norm", "scale"), (e,)))
    specs.append(_vector(f"{hf}post_attention_layernorm.weight", ours + ("post_attn_norm", "scale"), (e,)))
  specs.append(_vector("model.norm.weight", ("final_norm", "scale"), (e,)))
  if not config.tie_word_embeddings:
    specs.append(_linear("lm_head.weight", ("lm_head",), (v,), (e,)))
  return specs


def read_config(path: str | pathlib.Path, **runtime) -> ModelConfig:
  """Reads `path/config.json` into a ModelConfig (runtime: dtype, param_dtype, remat, remat_policy,
  scan_layers)."""
  path = pathlib.Path(path)
  if not path.is_dir():
    raise CheckpointError(f"checkpoint directory does not exist: {path}")
  config_file = path / "config.json"
  if not config_file.is_file():
    raise CheckpointError(f"missing config.json in checkpoint directory {path}")
  try:
    d = json.loads(config_file.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as err:
    raise CheckpointError(f"{config_file}: not valid JSON ({err})") from None
  return ModelConfig.from_hf_dict(d, source=str(config_file), **runtime)


@contextlib.contextmanager
def _reading(f: pathlib.Path):
  """Turns every error raised while reading safetensors file `f` into one CheckpointError naming it."""
  try:
    yield
  except CheckpointError:
    raise
  except (safetensors.SafetensorError, OSError, ValueError, RuntimeError) as err:
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    raise CheckpointError(f"{f}: unreadable safetensors file ({reason}); is it truncated or corrupt?") from None


def _tensor_files(path: pathlib.Path) -> dict[str, pathlib.Path]:
  """HF tensor name -> safetensors file holding it."""
  index = path / _INDEX
  if index.is_file():
    try:
      weight_map = json.loads(index.read_text())["weight_map"]
      return {name: path / f for name, f in weight_map.items()}
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as err:
      raise CheckpointError(f"{index}: not a safetensors index with a 'weight_map' object ({err!r})") from None
  files = sorted(path.glob("*.safetensors"))
  if not files:
    raise CheckpointError(f"no *.safetensors files in checkpoint directory {path}")
  where = {}
  for f in files:
    with _reading(f), safetensors.safe_open(f, framework="np") as st:
      where.update({name: f for name in st.keys()})
  return where


def _leaf(tree, path: tuple[str, ...]):
  for key in path:
    tree = tree[key]
  return tree


def _place(value: np.ndarray, dtype, sharding) -> jax.Array:
  """One device array, or a global array built shard by shard (each device receives only its slice)."""
  if sharding is None:
    return jax.numpy.asarray(value.astype(dtype, copy=False))
  return jax.make_array_from_callback(value.shape, sharding, lambda index: np.asarray(value[index], dtype))


def _layer_sharding(stacked):
  """The sharding of one layer's slice of a stacked (scanned-layout) weight: the leading axis dropped."""
  if stacked is None or not isinstance(stacked, jax.sharding.NamedSharding):
    return stacked
  return jax.sharding.NamedSharding(stacked.mesh, jax.sharding.PartitionSpec(*stacked.spec[1:]))


def _stack_placed(params: Params, config: ModelConfig, shardings) -> Params:
  """Loaded unrolled params -> the scanned layout, one weight at a time (the per-layer arrays freed as it goes)."""
  keys = [f"layers_{i}" for i in range(config.num_hidden_layers)]
  layers = [params.pop(k) for k in keys]
  leaves = [jax.tree_util.tree_flatten_with_path(layer)[0] for layer in layers]
  treedef = jax.tree.structure(layers[0])
  stacked = []
  for j, (path, _) in enumerate(leaves[0]):
    parts = [leaves[i][j][1] for i in range(len(layers))]
    target = None if shardings is None else _leaf(shardings[STACKED], tuple(p.key for p in path))
    stacked.append(jax.jit(lambda *xs: jax.numpy.stack(xs), out_shardings=target)(*parts))
    for x in parts:
      x.delete()
  params[STACKED] = jax.tree.unflatten(treedef, stacked)
  return params


def load_hf(path: str | pathlib.Path, *, dtype="float32", param_dtype=None, remat: bool = False,
            remat_policy: str = "full", scan_layers: bool = False, attention: str = "einsum",
            decode_projections: str = "auto", shardings=None) -> tuple[Params, ModelConfig]:
  """Loads a Qwen2/Qwen2.5, Qwen3 or Llama 3.x checkpoint straight into a params dict.

  With `shardings`, each tensor is read from its safetensors file into host memory
  (one tensor at a time) and only each addressable device's slice is copied to that
  device (`jax.make_array_from_callback`), so a model larger than one device loads
  without ever sitting whole on one; in a multi-process run each process places its
  own devices' slices.

  Args:
    path: directory with config.json and model.safetensors, or sharded files with
      model.safetensors.index.json.
    dtype: activation dtype of the returned config.
    param_dtype: dtype of the returned params (default: `dtype`).
    remat: rematerialise each layer in the backward pass.
    remat_policy: what a rematerialised layer keeps (`models.REMAT_POLICIES`).
    scan_layers: return the scanned layout (`layers/...`, stacked over layers;
      see `models.stack_layers`); the tensors are read per layer and stacked one
      weight at a time.
    attention: the multi-token attention implementation (`models.attention.IMPLEMENTATIONS`).
    decode_projections: how decode steps run the projections of one input (`models.DECODE_PROJECTIONS`).
    shardings: None (default device), a params-shaped tree of `jax.sharding.Sharding`,
      or a function config -> such a tree (e.g. `grpo_jax.partitioning.param_shardings`).

  Returns:
    (params, config).

  Raises:
    CheckpointError: missing directory, config.json or safetensors files; unsupported
      architecture; a missing or mis-shaped tensor; a truncated or corrupt file.
  """
  path = pathlib.Path(path)
  config = read_config(path, dtype=dtype, param_dtype=param_dtype or dtype, remat=remat, remat_policy=remat_policy,
                       scan_layers=scan_layers, attention=attention, decode_projections=decode_projections)
  where = _tensor_files(path)
  specs = _tensor_specs(config)
  for spec in specs:
    if spec.hf_name not in where:
      raise CheckpointError(f"{path}: missing tensor {spec.hf_name}")
  by_file: dict[pathlib.Path, list[_Tensor]] = {}
  for spec in specs:
    by_file.setdefault(where[spec.hf_name], []).append(spec)
  if callable(shardings):
    shardings = shardings(config)
  stacked_shardings = shardings
  if scan_layers and shardings is not None:  # read per layer into each layer's slice of the stacked sharding
    shardings = {k: v for k, v in shardings.items() if k != STACKED}
    layer = jax.tree.map(_layer_sharding, stacked_shardings[STACKED])
    shardings.update({f"layers_{i}": layer for i in range(config.num_hidden_layers)})
  param_dtype = jax.numpy.dtype(config.param_dtype)
  params: Params = {}
  for f, file_specs in by_file.items():
    if not f.is_file():
      raise CheckpointError(f"{path}: missing safetensors file {f.name} named by {_INDEX}")
    with _reading(f), safetensors.safe_open(f, framework="np") as st:
      for spec in file_specs:
        shape = tuple(st.get_slice(spec.hf_name).get_shape())
        if shape != spec.hf_shape:
          raise CheckpointError(f"{f}: tensor {spec.hf_name} has shape {shape}, expected {spec.hf_shape}")
        value = spec.to_ours(st.get_tensor(spec.hf_name))
        node = params
        for key in spec.path[:-1]:
          node = node.setdefault(key, {})
        node[spec.path[-1]] = _place(value, param_dtype, None if shardings is None else _leaf(shardings, spec.path))
  if scan_layers:
    params = _stack_placed(params, config, stacked_shardings)
  return params, config


_SAFETENSORS_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64"}


def _hf_leaf(params: Params, config: ModelConfig, path: tuple[str, ...], shape_only: bool = False):
  """The params leaf at `path` (unrolled names), or its shape: in the scanned layout, layer i's slice of the
  stacked leaf."""
  if config.scan_layers and path[0].startswith("layers_"):
    stacked = _leaf(params[STACKED], path[1:])
    return tuple(stacked.shape[1:]) if shape_only else stacked[int(path[0][len("layers_"):])]
  leaf = _leaf(params, path)
  return tuple(leaf.shape) if shape_only else leaf


def _fetch(x) -> np.ndarray:
  """`x` on the host, leaving no host copy behind on `x`: `np.asarray` of a jax array that had to be copied (off
  a GPU or TPU, or gathered from shards) keeps that copy on the array for its lifetime, which after an export
  is the whole model's worth of host memory. A device-side copy takes the cache and dies with it."""
  if isinstance(x, jax.Array) and not (x.is_fully_replicated and all(d.platform == "cpu" for d in x.devices())):
    x = jax.numpy.copy(x)
  return np.asarray(x)


def save_hf(params: Params, config: ModelConfig, path: str | pathlib.Path | None,
            fetch: Callable[[Any], np.ndarray] = _fetch) -> pathlib.Path | None:
  """Writes config.json + model.safetensors (HF names, torch layouts, `config.param_dtype`).

  The file is written one tensor at a time: each is fetched from its device(s) (a layer's slice of a stacked
  weight in the scanned layout), laid out for torch, cast only where its dtype differs, written, and freed, so
  host memory holds about two copies of the largest tensor, never the whole model. The result loads with
  `transformers.AutoModelForCausalLM.from_pretrained(path)`; `lm_head.weight` is absent when embeddings are tied.
  A stale sharded index in `path` is removed so that the new single file is the one that loads.

  Args:
    params, config: the model.
    path: the directory; None on a process that only takes part in `fetch`'s collectives.
    fetch: one tensor's host copy. The default reads this process's devices. With several processes every
      process calls `save_hf` with the same params and a collective fetch (`distributed.all_gather`), tensor by
      tensor in the same order, and one of them passes a path.

  Raises:
    CheckpointError: a params leaf whose shape does not give its HF tensor's (nothing is written).
  """
  dtype = np.dtype(jax.numpy.dtype(config.param_dtype))
  if dtype.name not in _SAFETENSORS_DTYPES:
    raise CheckpointError(f"cannot write param_dtype {dtype.name} to safetensors")
  specs = _tensor_specs(config)
  header, offset = {"__metadata__": {"format": "pt"}}, 0
  for spec in specs:  # every shape checked, and the header built, before any tensor is fetched
    ours = _hf_leaf(params, config, spec.path, shape_only=True)
    try:
      shape = jax.eval_shape(spec.to_hf, jax.ShapeDtypeStruct(ours, dtype)).shape
    except (TypeError, ValueError):  # a size that does not reshape
      shape = ours
    if shape != spec.hf_shape:
      raise CheckpointError(f"params at {'/'.join(spec.path)} give {spec.hf_name} shape {shape}, "
                            f"expected {spec.hf_shape}")
    size = int(np.prod(spec.hf_shape)) * dtype.itemsize
    header[spec.hf_name] = {"dtype": _SAFETENSORS_DTYPES[dtype.name], "shape": list(spec.hf_shape),
                            "data_offsets": [offset, offset + size]}
    offset += size
  if path is None:  # a helper in the collectives: the same fetches, in the same order, nothing kept
    for spec in specs:
      fetch(_hf_leaf(params, config, spec.path))
    return None
  path = pathlib.Path(path)
  text = json.dumps(header, separators=(",", ":")).encode()
  text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
  path.mkdir(parents=True, exist_ok=True)
  partial = path / (_SINGLE + ".partial")
  try:
    with open(partial, "wb") as f:
      f.write(len(text).to_bytes(8, "little") + text)
      for spec in specs:
        value = spec.to_hf(fetch(_hf_leaf(params, config, spec.path)))
        f.write(np.ascontiguousarray(value, dtype=dtype).reshape(-1).view(np.uint8).data)
        del value
  except BaseException:
    partial.unlink(missing_ok=True)
    raise
  (path / _INDEX).unlink(missing_ok=True)
  for stale in path.glob("model-*-of-*.safetensors"):
    stale.unlink()
  partial.replace(path / _SINGLE)
  (path / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2) + "\n")
  return path
