"""Logical axis names for activations, and the hook that maps them onto a mesh.

The model names every activation it wants placed with `constrain(x, names)`.
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
