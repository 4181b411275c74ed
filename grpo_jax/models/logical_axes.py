"""Logical axis names for parameters and activations, and the hook that maps them onto a mesh.

Every parameter leaf has its names by its place in the params dict (`logical_axes_of`); the sharding layer maps
them onto a mesh by the same rules as activations. The model names every activation it wants placed with
`constrain(x, names)`.
Outside an `axis_rules` context the hook is the identity, so single-device code
carries no sharding constraints. The sharding layer (`grpo_jax.partitioning`) enters
`axis_rules(mesh, {"batch": ("data", "fsdp"), "mlp": "tensor", ...})` around the
traced body of each jitted step.

Rules map a logical name to a mesh axis, a tuple of mesh axes, or None
(replicated). `logical_to_spec` resolves them left to right: a mesh axis that an
earlier dimension already uses is skipped (so "embed" -> "fsdp" shards weights
while activations, whose "batch" dimension comes first and takes "fsdp", keep
"embed" whole), and given the shape and mesh, a mesh axis whose size does not
divide the dimension is dropped (e.g. one kv head on a two-way tensor axis).
"""

import contextlib
import threading
from collections.abc import Mapping, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from grpo_jax.models.params import STACKED, Params

# Logical names used by the model for parameters and activations.
LOGICAL_AXES = ("batch", "length", "embed", "mlp", "heads", "kv_heads", "vocab", "lora_rank")

Rules = Mapping[str, str | Sequence[str] | None]

_STATE = threading.local()


@contextlib.contextmanager
def axis_rules(mesh: Mesh, rules: Rules):
  """Within this context `constrain` places activations on `mesh` by `rules`.

  Args:
    mesh: the device mesh.
    rules: logical axis name -> mesh axis name(s) or None (replicated).
  """
  previous = getattr(_STATE, "rules", None)
  _STATE.rules = (mesh, dict(rules))
  try:
    yield
  finally:
    _STATE.rules = previous


def current_rules() -> tuple[Mesh, dict] | None:
  """The `(mesh, rules)` of the innermost active `axis_rules` context, or None."""
  return getattr(_STATE, "rules", None)


def _mesh_axes(rule) -> tuple[str, ...]:
  if rule is None:
    return ()
  return (rule,) if isinstance(rule, str) else tuple(rule)


def logical_to_spec(names: Sequence[str | None], rules: Rules, *, shape: Sequence[int] | None = None,
                    mesh: Mesh | None = None) -> PartitionSpec:
  """Maps a tuple of logical names (None: unsharded) to a PartitionSpec.

  A mesh axis already used by an earlier dimension is skipped. With `mesh`, axes
  the mesh lacks are skipped; with `shape` and `mesh`, so is an axis whose size
  (times the axes kept before it) does not divide the dimension.
  """
  used, spec = set(), []
  for i, name in enumerate(names):
    kept, size = [], 1
    for axis in _mesh_axes(None if name is None else rules.get(name)):
      if axis in used or (mesh is not None and axis not in mesh.shape):
        continue
      if shape is not None and mesh is not None and shape[i] % (size * mesh.shape[axis]):
        continue
      kept.append(axis)
      size *= 1 if mesh is None else mesh.shape[axis]
    used.update(kept)
    spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
  return PartitionSpec(*spec)


def named_sharding(mesh: Mesh, rules: Rules, names: Sequence[str | None], shape: Sequence[int]) -> NamedSharding:
  """The NamedSharding of an array of `shape` whose axes have logical `names`."""
  if len(names) != len(shape):
    raise ValueError(f"{len(names)} logical names {tuple(names)} for an array of shape {tuple(shape)}")
  return NamedSharding(mesh, logical_to_spec(names, rules, shape=shape, mesh=mesh))


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """Names the axes of activation `x`; identity unless an `axis_rules` context is active."""
  if len(names) != x.ndim:
    raise ValueError(f"constrain: {len(names)} names {tuple(names)} for an array of rank {x.ndim}")
  state = current_rules()
  if state is None:
    return x
  mesh, rules = state
  return jax.lax.with_sharding_constraint(x, named_sharding(mesh, rules, names, x.shape))


# (module, leaf) -> the leaf's logical axes, for every parameter of the model (the layout in `transformer`'s
# docstring) and of the scalar head (`heads`).
_LEAF_AXES = {
    ("embed", "embedding"): ("vocab", "embed"),
    ("q_proj", "kernel"): ("embed", "heads", None),
    ("q_proj", "bias"): ("heads", None),
    ("k_proj", "kernel"): ("embed", "kv_heads", None),
    ("k_proj", "bias"): ("kv_heads", None),
    ("v_proj", "kernel"): ("embed", "kv_heads", None),
    ("v_proj", "bias"): ("kv_heads", None),
    ("o_proj", "kernel"): ("heads", None, "embed"),
    ("o_proj", "bias"): ("embed",),
    ("q_norm", "scale"): (None,),
    ("k_norm", "scale"): (None,),
    ("gate_proj", "kernel"): ("embed", "mlp"),
    ("gate_proj", "bias"): ("mlp",),
    ("up_proj", "kernel"): ("embed", "mlp"),
    ("up_proj", "bias"): ("mlp",),
    ("down_proj", "kernel"): ("mlp", "embed"),
    ("down_proj", "bias"): ("embed",),
    ("input_norm", "scale"): ("embed",),
    ("post_attn_norm", "scale"): ("embed",),
    ("final_norm", "scale"): ("embed",),
    ("lm_head", "kernel"): ("embed", "vocab"),
    ("head", "kernel"): ("embed",),
    ("head", "bias"): (),
}
# LoRA adapters: A [*in, r] has its kernel's input axes then the rank, B [r, *out] the rank then its output axes.
# The rank axis ("lora_rank") takes the fsdp axis where the kernel's own axes leave it free (B of q/k/v/gate/up, A
# of down: their kernels split over fsdp by the axis the adapter does not have), so every adapter is split.
_LEAF_AXES.update({(proj, leaf): axes for proj, n_in in (("q_proj", 1), ("k_proj", 1), ("v_proj", 1), ("o_proj", 2),
                                                         ("gate_proj", 1), ("up_proj", 1), ("down_proj", 1))
                   for leaf, axes in (("lora_a", (*_LEAF_AXES[(proj, "kernel")][:n_in], "lora_rank")),
                                      ("lora_b", ("lora_rank", *_LEAF_AXES[(proj, "kernel")][n_in:])))})


def logical_axes_of(params_shapes: Params) -> Params:
  """Logical axis names for every leaf of a params (or params-shaped) dict.

  A leaf under a `layers` key (the scanned layout) has an extra leading layer
  axis, named None (never sharded).
  """

  def names(path, leaf):
    key = tuple(p.key for p in path[-2:])
    axes = _LEAF_AXES[key]
    if any(getattr(p, "key", None) == STACKED for p in path[:-2]):
      axes = (None, *axes)
    if len(axes) != len(leaf.shape):
      raise ValueError(f"logical axes {axes} do not match shape {leaf.shape} at {jax.tree_util.keystr(path)}")
    return axes

  return jax.tree_util.tree_map_with_path(names, params_shapes)
