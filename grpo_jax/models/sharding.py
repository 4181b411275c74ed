"""Logical axis names for activations, and the hook that will map them onto a mesh.

The model names every activation it wants placed with `constrain(x, names)`.
Outside an `axis_rules` context the hook is the identity, so single-device code
carries no sharding constraints. The sharding layer enters
`axis_rules(mesh, {"batch": "data", "mlp": "model", ...})` around the jitted step.
"""

import contextlib
import threading
from collections.abc import Mapping, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# Logical names used by the model for parameters and activations.
LOGICAL_AXES = ("batch", "length", "embed", "mlp", "heads", "kv_heads", "vocab")

_STATE = threading.local()


@contextlib.contextmanager
def axis_rules(mesh: Mesh, rules: Mapping[str, str | Sequence[str] | None]):
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


def logical_to_spec(names: Sequence[str | None], rules: Mapping[str, str | Sequence[str] | None]) -> PartitionSpec:
  """Maps a tuple of logical names (None: unsharded) to a PartitionSpec."""
  return PartitionSpec(*(None if n is None else rules.get(n) for n in names))


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """Names the axes of activation `x`; identity unless an `axis_rules` context is active."""
  if len(names) != x.ndim:
    raise ValueError(f"constrain: {len(names)} names {tuple(names)} for an array of rank {x.ndim}")
  state = getattr(_STATE, "rules", None)
  if state is None:
    return x
  mesh, rules = state
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_spec(names, rules)))
