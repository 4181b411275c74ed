"""Device meshes, sharding rules as data, and params/optimiser state/batches placed by them.

A mesh has three named axes, outermost first: `data` (pure data parallelism),
`fsdp` (data parallelism whose weights and optimiser state are also split) and
`tensor` (Megatron-style splits of heads, MLP and vocabulary). A rule table maps
the model's logical axis names (models.LOGICAL_AXES) to mesh axes; the presets
are plain dicts in `RULES`. Everything else follows from shapes:

  mesh = partitioning.make_mesh("data:2,fsdp:2,tensor:2")
  rules = partitioning.get_rules("fsdp_tp")
  params, config = partitioning.load_hf(path, mesh, rules)  # or init_params(config, key, mesh, rules)
  state, state_sh = partitioning.init_train_state(params, optimizer, mesh, rules)
  step = training.make_train_step(objective, optimizer, state_shardings=state_sh,
                                  batch_shardings=partitioning.batch_sharding(mesh, rules), mesh=mesh, rules=rules)

Batches are split over the data axes (`data` and `fsdp`). A dimension that a
mesh axis does not divide stays whole on that axis (models.logical_axes.logical_to_spec).
"""

from collections.abc import Callable, Mapping, Sequence
import math
from typing import Any
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from grpo_jax import train_state
from grpo_jax.models import hf_io
from grpo_jax.models import logical_axes as logical
from grpo_jax.models import transformer
from grpo_jax.models.config import ModelConfig

MESH_AXES = ("data", "fsdp", "tensor")
DATA_AXES = ("data", "fsdp")

_REPLICATED = {"length": None, "embed": None, "mlp": None, "heads": None, "kv_heads": None, "vocab": None,
               "lora_rank": None}

# Logical axis -> mesh axes. Presets, chosen by name (the runner's --sharding_rules).
RULES: dict[str, dict[str, str | tuple[str, ...] | None]] = {
    # Every device holds all weights; the batch is split over data and fsdp.
    "dp": {**_REPLICATED, "batch": DATA_AXES},
    # ZeRO-3: weights, gradients and optimiser state split over fsdp along the embedding dimension (LoRA adapters
    # without one along their rank).
    "fsdp": {**_REPLICATED, "batch": DATA_AXES, "embed": "fsdp", "lora_rank": "fsdp"},
    # FSDP plus tensor parallelism: heads, MLP and vocabulary split over tensor.
    "fsdp_tp": {**_REPLICATED, "batch": DATA_AXES, "embed": "fsdp", "mlp": "tensor", "heads": "tensor",
                "kv_heads": "tensor", "vocab": "tensor", "lora_rank": "fsdp"},
}


def get_rules(rules: str | Mapping) -> dict:
  """A copy of the preset named `rules`, or of a rule mapping given directly (checked)."""
  if isinstance(rules, str):
    if rules not in RULES:
      raise ValueError(f"unknown sharding rules {rules!r}; presets: {', '.join(RULES)}")
    return dict(RULES[rules])
  unknown = sorted(set(rules) - set(logical.LOGICAL_AXES))
  if unknown:
    raise ValueError(f"sharding rules name unknown logical axes {unknown}; known: {logical.LOGICAL_AXES}")
  return dict(rules)


def parse_mesh_spec(spec: str, num_devices: int) -> dict[str, int]:
  """'data:2,fsdp:2,tensor:2' -> {'data': 2, 'fsdp': 2, 'tensor': 2}, every axis present.

  One size may be -1 (the devices left over); omitted axes have size 1; an empty
  spec puts every device on `data`. The sizes must multiply to `num_devices`.
  """
  sizes: dict[str, int] = {}
  for part in filter(None, (p.strip() for p in spec.split(","))):
    name, sep, value = part.partition(":")
    name = name.strip()
    if not sep or name not in MESH_AXES:
      raise ValueError(f"mesh spec {spec!r}: {part!r} is not 'axis:size' with axis one of {', '.join(MESH_AXES)}")
    if name in sizes:
      raise ValueError(f"mesh spec {spec!r}: axis {name!r} given twice")
    try:
      sizes[name] = int(value)
    except ValueError:
      raise ValueError(f"mesh spec {spec!r}: size {value.strip()!r} of axis {name!r} is not an integer") from None
    if sizes[name] == 0 or sizes[name] < -1:
      raise ValueError(f"mesh spec {spec!r}: size of axis {name!r} must be >= 1 or -1, got {sizes[name]}")
  if not sizes:
    sizes = {"data": -1}
  free = [n for n, s in sizes.items() if s == -1]
  if len(free) > 1:
    raise ValueError(f"mesh spec {spec!r}: only one axis may be -1, got {', '.join(free)}")
  fixed = math.prod(s for s in sizes.values() if s != -1)
  if free:
    if num_devices % fixed:
      raise ValueError(f"mesh spec {spec!r}: {num_devices} devices do not divide by the fixed axes' {fixed}")
    sizes[free[0]] = num_devices // fixed
  elif fixed != num_devices:
    raise ValueError(f"mesh spec {spec!r} needs {fixed} devices, but there are {num_devices}")
  return {name: sizes.get(name, 1) for name in MESH_AXES}


def make_mesh(spec: str = "", devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp, tensor) mesh over `devices` (default: all, every process's) from a spec string.

  See `parse_mesh_spec`. The device order is the platform's (topology-aware on
  TPU/GPU; process-major on CPU, so `tensor` stays within a process).
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = parse_mesh_spec(spec, len(devices))
  shape = tuple(sizes[name] for name in MESH_AXES)
  try:
    grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  except (ValueError, TypeError, NotImplementedError, AssertionError):
    grid = np.asarray(devices, dtype=object).reshape(shape)
  return Mesh(grid, MESH_AXES)


def single_device_mesh(device: jax.Device | None = None) -> Mesh:
  """A 1x1x1 mesh (every rule resolves to whole arrays on one device)."""
  return Mesh(np.asarray([device or jax.devices()[0]], dtype=object).reshape(1, 1, 1), MESH_AXES)


def replicated(mesh: Mesh) -> NamedSharding:
  """Whole copies on every device of `mesh`."""
  return NamedSharding(mesh, PartitionSpec())


def logical_sharding(mesh: Mesh, rules: Mapping, names: Sequence[str | None], shape: Sequence[int]
                     ) -> NamedSharding:
  """The sharding of an array of `shape` whose axes carry the logical `names`."""
  return logical.named_sharding(mesh, rules, names, shape)


def batch_sharding(mesh: Mesh, rules: Mapping) -> NamedSharding:
  """Leading dimension split as the `batch` rule says (the data axes); for arrays whose size it divides."""
  return NamedSharding(mesh, PartitionSpec(logical.logical_to_spec(("batch",), rules, mesh=mesh)[0]))


def data_parallel_size(mesh: Mesh, rules: Mapping) -> int:
  """How many ways the `batch` rule splits rows: batch sizes (per micro-batch) must be multiples."""
  spec = logical.logical_to_spec(("batch",), rules, mesh=mesh)[0]
  return math.prod(mesh.shape[a] for a in ((spec,) if isinstance(spec, str) else spec or ()))


def batch_shardings(mesh: Mesh, rules: Mapping, batch: Any) -> Any:
  """Per-leaf shardings of a batch pytree (arrays or shapes, leading dimension = rows).

  Rows split by the `batch` rule when the mesh axes divide them; scalars replicated.
  """
  def one(x):
    shape = np.shape(x)
    return logical_sharding(mesh, rules, ("batch",) + (None,) * (len(shape) - 1), shape) if shape else replicated(mesh)

  return jax.tree.map(one, batch)


def _leaf_logical_axes(path, leaf) -> tuple | None:
  """Logical axes of a leaf found by its dict keys (a param, or a moment shaped like one)."""
  keys = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)]
  if len(keys) < 2:
    return None
  tree = leaf
  for key in reversed(keys):  # the whole dict path, so a stacked layer (`layers/...`) is seen as one
    tree = {key: tree}
  try:
    axes = transformer.logical_axes_of(tree)
  except (KeyError, ValueError):
    return None
  for key in keys:
    axes = axes[key]
  return axes


def param_shardings(mesh: Mesh, rules: Mapping, params: Any, logical_axes: Any = None) -> Any:
  """NamedShardings for a params dict (arrays or `jax.eval_shape` structs) of a policy or scalar model.

  Args:
    mesh: the mesh.
    rules: logical axis -> mesh axes.
    params: policy params, backbone params or scalar-model params (any dtype).
    logical_axes: a params-shaped tree of logical-name tuples; default from the
      model's parameter layout (`transformer.logical_axes_of`).
  """
  if logical_axes is None:
    logical_axes = transformer.logical_axes_of(params)
  return jax.tree.map(lambda names, x: logical_sharding(mesh, rules, names, np.shape(x)), logical_axes, params,
                      is_leaf=lambda x: isinstance(x, tuple))


def state_shardings(mesh: Mesh, rules: Mapping, state: Any) -> Any:
  """NamedShardings for any pytree holding params and params-shaped optimiser moments.

  A leaf under `.../<module>/<kernel|bias|scale|embedding>` whose rank matches
  the parameter layout is sharded like that parameter (params, Adam's mu and nu,
  accumulated gradients); every other leaf (step counters, scalars) is replicated.
  """
  def one(path, x):
    axes = _leaf_logical_axes(path, x)
    if axes is None:
      return replicated(mesh)
    return logical_sharding(mesh, rules, axes, np.shape(x))

  return jax.tree_util.tree_map_with_path(one, state)


def abstract(tree: Any, shardings: Any = None) -> Any:
  """`jax.ShapeDtypeStruct`s of a tree's arrays, carrying `shardings` (default: each array's own);
  other leaves are kept as they are."""
  if shardings is None:
    shardings = jax.tree.map(lambda x: getattr(x, "sharding", None), tree)

  def one(x, s):
    if not isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
      return x
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)

  return jax.tree.map(one, tree, shardings)


def _init_per_leaf(config: ModelConfig, key: jax.Array) -> Any:
  """Random params with `models.init_params`'s distribution, one draw per weight."""
  shapes = jax.eval_shape(transformer.init_params, config, key)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  out = []
  for i, (path, leaf) in enumerate(leaves):
    name = path[-1].key
    if name in ("kernel", "embedding"):
      x = 0.02 * jax.random.normal(jax.random.fold_in(key, i), leaf.shape, jnp.float32)
    else:
      x = (jnp.zeros if name == "bias" else jnp.ones)(leaf.shape, jnp.float32)
    out.append(x.astype(leaf.dtype))
  return jax.tree_util.tree_unflatten(treedef, out)


def init_params(config: ModelConfig, key: jax.Array, mesh: Mesh, rules: Mapping) -> Any:
  """Random params computed straight into their shardings: each device draws only its own slices.

  The distribution is `models.init_params`'s (normal(0, 0.02) kernels and embeddings, zero
  biases, unit norm scales) but each weight has its own draw (`models.init_params` draws one
  flat array for all weights on one device and copies its slices: whole on every device,
  were it sharded this way), so the values differ from it; they are the same on every mesh, a
  single device included.
  """
  out = param_shardings(mesh, rules, jax.eval_shape(transformer.init_params, config, key))
  return jax.jit(lambda k: _init_per_leaf(config, k), out_shardings=out)(key)


def init_train_state(params: Any, optimizer, mesh: Mesh, rules: Mapping, *, donate: bool = False
                     ) -> tuple[Any, Any]:
  """`train_state.init_train_state` with params and optimiser state placed by the rules.

  Args:
    params: policy params (any placement; already-sharded params are not gathered).
    optimizer: the optax transformation.
    mesh, rules: the placement.
    donate: hand `params` over: the state reuses their buffers, and a leaf it cannot reuse (placed otherwise:
      resharded into a new buffer) is deleted as well, so the state holds the only copy.

  Returns:
    (state, shardings): the TrainState and its NamedShardings, for `make_train_step`
    and for restoring checkpoints.
  """
  init = lambda p: train_state.init_train_state(p, optimizer)
  shardings = state_shardings(mesh, rules, jax.eval_shape(init, params))
  if not donate:
    return jax.jit(init, out_shardings=shardings)(params), shardings
  with warnings.catch_warnings():  # a leaf placed otherwise: resharded, not reused, and deleted below
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    state = jax.jit(init, out_shardings=shardings, donate_argnums=(0,))(params)
  kept = {id(x) for x in jax.tree.leaves(state)}
  for x in jax.tree.leaves(params):
    if isinstance(x, jax.Array) and not x.is_deleted() and id(x) not in kept:
      x.delete()
  return state, shardings


def _put_leaf(x, sharding: jax.sharding.Sharding):
  """One leaf onto `sharding`, in a run of one or of several processes."""
  if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    return jax.random.wrap_key_data(_put_leaf(jax.random.key_data(x), sharding), impl=jax.random.key_impl(x))
  if isinstance(x, jax.Array):
    if x.sharding == sharding or x.sharding.is_equivalent_to(sharding, x.ndim):
      return x
    if not x.is_fully_addressable:  # a global array: re-shard on the devices
      return jax.jit(lambda y: y, out_shardings=sharding)(x)
  if jax.process_count() == 1:
    return jax.device_put(x, sharding)
  value = np.asarray(x)  # the same host value on every process; each device receives its slice
  return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def put(tree: Any, shardings: Any) -> Any:
  """Places (or re-shards) a pytree; arrays already so placed are returned as they are.

  Args:
    tree: arrays, host values, PRNG keys. In a multi-process run, host values and
      process-local arrays must be the same on every process (per-process slices
      go through `distributed.global_batch`); global arrays are re-sharded on device.
    shardings: one sharding for every leaf, or a tree of them (a prefix of `tree`).
  """
  is_sharding = lambda s: isinstance(s, jax.sharding.Sharding)
  if is_sharding(shardings):
    return jax.tree.map(lambda x: _put_leaf(x, shardings), tree)
  return jax.tree.map(lambda s, sub: jax.tree.map(lambda x: _put_leaf(x, s), sub), shardings, tree,
                      is_leaf=is_sharding)


def load_hf(path, mesh: Mesh, rules: Mapping, **runtime) -> tuple[Any, ModelConfig]:
  """`models.load_hf` with every tensor read straight into its shards (see hf_io.load_hf)."""
  return hf_io.load_hf(path, shardings=lambda config: param_shardings(
      mesh, rules, jax.eval_shape(transformer.init_params, config, jax.random.key(0))), **runtime)


def freeze_rules(rules: Mapping) -> tuple:
  """A hashable form of a rule mapping (for caches keyed on it)."""
  return tuple(sorted((k, v if v is None or isinstance(v, str) else tuple(v)) for k, v in rules.items()))


def jit_with_rules(fn: Callable, mesh: Mesh, rules: Mapping, **jit_kwargs) -> Callable:
  """`jax.jit(fn, **jit_kwargs)` whose trace runs inside `axis_rules(mesh, rules)`, so the model's
  `constrain` hook places activations."""
  rules = dict(rules)

  def traced(*args, **kwargs):
    with logical.axis_rules(mesh, rules):
      return fn(*args, **kwargs)

  # The program is named after `fn` (a partial's function), as `jax.jit(fn)`'s would be: profiles and compile logs
  # then tell the sharded sampler, forwards and updates apart.
  traced.__name__ = traced.__qualname__ = getattr(fn, "__name__", getattr(getattr(fn, "func", None), "__name__",
                                                                          "traced"))
  return jax.jit(traced, **jit_kwargs)
