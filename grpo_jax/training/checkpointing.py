"""Orbax checkpoints of the train state plus JSON metadata (PRNG key, data position, flags).

Orbax writes each step to a temporary directory and renames it when complete, so a crash
mid-save never leaves a checkpoint that restores half-written; `max_to_keep` prunes old steps.
"""

import pathlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


class CheckpointError(ValueError):
  """A checkpoint directory that cannot be restored (missing, incompatible)."""


def _all_finite(tree) -> bool:
  return all(bool(np.all(np.isfinite(np.asarray(x)))) for x in jax.tree.leaves(tree)
             if np.issubdtype(np.asarray(x).dtype, np.floating))


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

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict]:
    """Restores `step` (default: the latest) into the structure, shapes and shardings of `abstract_state`."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no checkpoint to resume from in {self.directory}")
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), metadata=ocp.args.JsonRestore()))
    except (ValueError, KeyError, FileNotFoundError) as err:
      raise CheckpointError(f"checkpoint {self.directory / str(step)} does not match this run: "
                            f"{str(err).splitlines()[0]}") from None
    return restored["state"], restored["metadata"]

  def close(self) -> None:
    self._manager.close()
