"""Orbax checkpoints of the train state plus JSON metadata (PRNG key, data position, flags).

Orbax writes each step to a temporary directory and renames it when complete, so a crash
mid-save never leaves a checkpoint that restores half-written; `max_to_keep` prunes old steps.

Multi-host: every process constructs the Checkpointer and calls `save`/`restore` with the same
arguments (the directory on a file system they share); each process writes the shards of its own
devices, process 0 the metadata, and orbax synchronises the processes. Arrays are stored whole
(not per device), so a checkpoint restores into any mesh: saved on 8 devices, restored on 1, or
the reverse, given the target shardings.
"""

import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from grpo_jax import sharding


class CheckpointError(ValueError):
  """A checkpoint directory that cannot be restored (missing, incompatible)."""


@jax.jit
def _finite(leaves):
  checks = [jnp.all(jnp.isfinite(x)) for x in leaves]
  return jnp.all(jnp.stack(checks)) if checks else jnp.array(True)


def _all_finite(tree) -> bool:
  """Whether every floating leaf is finite; computed on the devices, so global arrays of a
  multi-process run are never gathered (every process gets the same answer)."""
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
  try:
    ok = _finite(leaves)
  except ValueError:  # leaves on different devices or meshes: one check each
    return all(_all_finite([x]) for x in leaves) if len(leaves) > 1 else bool(np.all(np.isfinite(leaves[0])))
  return bool(np.asarray(ok.addressable_data(0)))


class Checkpointer:
  """Saves and restores `(state, metadata)` under `directory/<step>/`.

  Args:
    directory: where the steps live (created if missing).
    max_to_keep: how many of the newest steps to keep.
  """

  def __init__(self, directory: str | pathlib.Path, max_to_keep: int = 3):
    self.directory = pathlib.Path(directory).absolute()
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any, metadata: dict) -> None:
    """Saves synchronously; refuses a state with NaN or inf so no bad checkpoint is ever written."""
    if not _all_finite(state):
      raise FloatingPointError(f"refusing to save step {step}: the state holds NaN or inf")
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), metadata=ocp.args.JsonSave(metadata)), force=True)
    self._manager.wait_until_finished()

  def restore(self, abstract_state: Any, step: int | None = None, shardings: Any = None) -> tuple[Any, dict]:
    """Restores `step` (default: the latest) into the structure, shapes and shardings of `abstract_state`.

    Args:
      abstract_state: a state (arrays) or its `jax.ShapeDtypeStruct`s; arrays are not modified.
      step: the step; default the latest.
      shardings: target shardings (a tree like the state, e.g. from `sharding.init_train_state`);
        default: those of `abstract_state`'s leaves. The saved device count need not match.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no checkpoint to resume from in {self.directory}")
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(sharding.abstract(abstract_state, shardings)), metadata=ocp.args.JsonRestore()))
    except (ValueError, KeyError, FileNotFoundError) as err:
      raise CheckpointError(f"checkpoint {self.directory / str(step)} does not match this run: "
                            f"{str(err).splitlines()[0]}") from None
    return restored["state"], restored["metadata"]

  def close(self) -> None:
    self._manager.close()
