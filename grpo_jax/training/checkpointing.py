"""Orbax checkpoints of the train state plus JSON metadata (PRNG key, data position, flags).

Orbax writes each step to a temporary directory and renames it when complete, so a crash
mid-save never leaves a checkpoint that restores half-written; `max_to_keep` prunes old steps.
The temporary directories a killed save leaves behind are removed when the next Checkpointer
opens the directory. A save that fails (a full disk, a read-only or vanished directory) removes
its temporary directory and raises `CheckpointSaveError`, one line naming the directory, the
cause and the free space there; orbax's writer threads' own reports of it are not printed. Saves
are synchronous (orbax's asynchronous mode would gain nothing, as every save is waited for, and
after a failed one its threads wait minutes for a signal that never comes, then print tracebacks).
A save copies the state from the devices to host memory in batches of at most `host_transfer_gb`
(orbax's `save_device_host_concurrent_gb`), each written before the next is copied; orbax's
default copies the whole train state at once (on a GPU into pinned host memory, then into NumPy
arrays), on top of the run's own host memory.

A damaged checkpoint (a truncated or corrupt file) is never used: `restore_intact` tries the
steps newest first, says which one is damaged and why, and moves it aside to
`<directory>_damaged/<step>` (kept for inspection, never deleted) once an older one restored.

Multi-host: every process constructs the Checkpointer and calls `save`/`restore` with the same
arguments (the directory on a file system they share); each process writes the shards of its own
devices, process 0 the metadata, and orbax synchronises the processes. Arrays are stored whole
(not per device), so a checkpoint restores into any mesh: saved on 8 devices, restored on 1, or
the reverse, given the target shardings.
"""

import contextlib
import errno
import gc
import logging
import os
import pathlib
import re
import shutil
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from grpo_jax import partitioning
from grpo_jax.models.config import CheckpointError  # one error for every checkpoint: HF directories, train states


HOST_TRANSFER_GB = 1  # a save's bound on the state it copies to host memory at once (GB)
# A failed save's temporary directory: removed until two looks this far apart find nothing, for at most this long.
REMOVE_QUIET_S, REMOVE_WAIT_S = 0.2, 10.0


class CheckpointSaveError(CheckpointError):
  """A checkpoint that could not be written (a full disk, a read-only or vanished directory)."""


@jax.jit
def _finite(leaves):
  # max |x| is inf or NaN iff some element is (max propagates NaN): a plain reduction, where all(isfinite(x)) has
  # XLA's CPU backend hold the whole state's [elements] bool mask (half a bf16 state's bytes) before reducing it.
  checks = [jnp.isfinite(jnp.max(jnp.abs(x))) if x.size else jnp.array(True) for x in leaves]
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


def _first_line(err: BaseException) -> str:
  text = str(err).strip().split(" See full TensorStore details")[0]
  return text.splitlines()[0][:300] if text else type(err).__name__


_FAILED_READ = "Encountered error while reading array index"


def _quiet_unraisable() -> None:
  """Filters, once per process, two kinds of unraisable errors out of `sys.unraisablehook`, each of which Python
  would print as a traceback of its own (dozens of them):
  - after a failed restore, orbax's other read coroutines of it hold the same error, printed as "Exception ignored
    in <coroutine>" whenever they are collected, now or at exit;
  - after a failed save, tensorstore still completes the write futures that orbax's (by then closed) event loop
    awaited, and each completion's `loop.call_soon_threadsafe` raises "Event loop is closed" on a tensorstore thread.
  Any other unraisable error prints as before."""
  previous = sys.unraisablehook
  if not getattr(previous, "_grpo_jax_quiet", False):
    # Everything the hook uses is bound here: at interpreter exit, when the last coroutines are collected,
    # module globals may already be gone.
    def hook(unraisable, needles=(_FAILED_READ, "Event loop is closed"), previous=previous, text=str):
      message = text(getattr(unraisable, "exc_value", ""))
      if not any(needle in message for needle in needles):
        previous(unraisable)
    hook._grpo_jax_quiet = True
    sys.unraisablehook = hook


def _quiet_failed_reads() -> None:
  """`_quiet_unraisable`, and the failed restore's coroutines collected now."""
  _quiet_unraisable()
  gc.collect()


def _cause(err: BaseException) -> str:
  """The operating system's reason for a failed write (tensorstore names it as os_error_code='28'), else the
  error's first line."""
  code = getattr(err, "errno", None)
  found = re.search(r"os_error_code='?(\d+)", str(err))
  code = int(found.group(1)) if found else code
  if code:
    return f"{os.strerror(code)} [{errno.errorcode.get(code, code)}]"
  return _first_line(err)


def free_space(path: pathlib.Path) -> str:
  """"X MiB free of Y MiB" on the file system of `path` (or of its nearest existing parent)."""
  path = pathlib.Path(path)
  while not path.exists() and path != path.parent:
    path = path.parent
  try:
    usage = shutil.disk_usage(path)
  except OSError as err:
    return f"free space unknown ({os.strerror(err.errno) if err.errno else err})"
  return f"{usage.free / 2**20:,.1f} MiB free of {usage.total / 2**20:,.1f} MiB"


class _DropErrors(logging.Filter):
  """Drops error records: while a save runs, orbax's threads (and its main-thread wait) log each failure with its
  traceback, dozens of lines, and the same failure reaches `save` as an exception, reported in one line."""

  def filter(self, record):
    return record.levelno < logging.ERROR


class _DropNeverRetrieved(logging.Filter):
  """Drops asyncio's "Task exception was never retrieved" records: after a failed save, the write tasks that failed
  beside the one `save` reports are collected (now or at exit) with that record and a traceback each."""

  def filter(self, record):
    return "exception was never retrieved" not in str(record.msg)


_NEVER_RETRIEVED = _DropNeverRetrieved()


class _DropNoPrioritized(logging.Filter):
  """Drops orbax's warning that no array is copied synchronously, at every save: `_state_handler` asks for that."""

  def filter(self, record):
    return "No prioritized params found" not in str(record.msg)


@contextlib.contextmanager
def _quiet_writer_threads():
  loggers = [logging.getLogger(name) for name in ("absl", "orbax")]
  filters = [_DropErrors(), _DropNoPrioritized()]
  for logger in loggers:
    for quiet in filters:
      logger.addFilter(quiet)
  try:
    yield
  finally:
    for logger in loggers:
      for quiet in filters:
        logger.removeFilter(quiet)


def _quiet_failed_writer_threads() -> None:
  """A failed save's error (a full disk) can also end orbax's writer threads, before or after `save` has reported
  it, and Python would print each one's traceback (`threading.excepthook`): from the first save on, exceptions that
  end a thread inside orbax are dropped, the save that started the thread raising the error itself
  (`CheckpointSaveError`); any other thread's still reach the hook before. (Installed only once a save had failed,
  a writer thread that failed first, on a loaded machine, printed its traceback before the save's one line.)"""
  previous = threading.excepthook
  if getattr(previous, "quiets_orbax", False):
    return

  def hook(args):
    frames = traceback.extract_tb(args.exc_traceback) if args.exc_traceback is not None else []
    if not any(f"{os.sep}orbax{os.sep}" in frame.filename for frame in frames):
      previous(args)

  hook.quiets_orbax = True
  threading.excepthook = hook


def _state_handler(host_transfer_gb: float | None) -> ocp.PyTreeCheckpointHandler:
  """The handler behind orbax's StandardSave (the same files: checkpoints of either restore with the other), with
  its device -> host copies in batches of `host_transfer_gb` (None: orbax's default, all at once).

  orbax's `save_device_host_concurrent_gb` bounds only the arrays its `ArrayHandler`'s status callback ranks
  ASYNCHRONOUS_DEPRIORITIZED, and its default callback ranks every array SYNCHRONOUS (all copied at once), so the
  arrays get a handler whose callback ranks them deprioritized (orbax's documented way, from its `_src`); every save
  is waited for, so none is modified while it is copied. Where this orbax lacks those hooks, the plain handler."""
  if host_transfer_gb is None:
    return ocp.PyTreeCheckpointHandler()
  try:
    # pylint: disable=import-outside-toplevel
    from orbax.checkpoint._src.metadata import array_metadata_store
    from orbax.checkpoint._src.serialization import types as serialization_types

    class Deprioritized(serialization_types.DefaultSerializationStatusCallback):

      def key_priority(self, _):
        return serialization_types.TransferPriority.ASYNCHRONOUS_DEPRIORITIZED

    arrays = ocp.type_handlers.ArrayHandler(array_metadata_store=array_metadata_store.Store(),
                                            callback=Deprioritized())
  except (ImportError, AttributeError, TypeError):
    return ocp.PyTreeCheckpointHandler()
  others = (int, float, bytes, np.number, np.ndarray, str, type(ocp.PLACEHOLDER))
  registry = ocp.type_handlers.create_type_handler_registry(
      *[(ty, ocp.type_handlers.get_type_handler(ty)) for ty in others], (jax.Array, arrays))
  return ocp.PyTreeCheckpointHandler(save_device_host_concurrent_gb=host_transfer_gb, type_handler_registry=registry)


class Checkpointer:
  """Saves and restores `(state, metadata)` under `directory/<step>/`.

  Args:
    directory: where the steps live (created if missing).
    max_to_keep: how many of the newest steps to keep.
    host_transfer_gb: the most state (GB, 10^9 bytes, per process) a save holds in host memory at once; an array
      larger than it is copied alone. None: orbax's default, the whole state at once.
  """

  def __init__(self, directory: str | pathlib.Path, max_to_keep: int = 3,
               host_transfer_gb: float | None = HOST_TRANSFER_GB):
    self.directory = pathlib.Path(directory).absolute()
    if jax.process_index() == 0:  # what a killed save left: never a step, and it would fill the disk
      for partial in self.directory.glob("*.orbax-checkpoint-tmp*"):
        shutil.rmtree(partial, ignore_errors=True)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=False)
    handlers = {"state": _state_handler(host_transfer_gb), "metadata": ocp.JsonCheckpointHandler()}
    self._manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, metadata: dict) -> None:
    """Saves synchronously; refuses a state with NaN or inf so no bad checkpoint is ever written.

    Raises:
      CheckpointSaveError: the write failed; its temporary directory is removed, older steps are untouched.
    """
    if not _all_finite(state):
      raise FloatingPointError(f"refusing to save step {step}: the state holds NaN or inf")
    _quiet_unraisable()
    _quiet_failed_writer_threads()  # a writer thread's failure is this save's, which raises it
    try:
      with _quiet_writer_threads():
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeSave(state), metadata=ocp.args.JsonSave(metadata)), force=True)
        self._manager.wait_until_finished()
    except Exception as err:  # pylint: disable=broad-except  (tensorstore raises ValueError, the file system OSError)
      # The same failure, once per other write task: its record, or its coroutine never awaited, at collection.
      logging.getLogger("asyncio").addFilter(_NEVER_RETRIEVED)
      warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
      space = free_space(self.directory)  # as the write found it, before the partial step is removed
      self._remove_partial(step)
      previous = [s for s in self.all_steps() if s != step]
      kept = f"; checkpoint step {max(previous)} is intact" if previous else ""
      raise CheckpointSaveError(f"cannot save checkpoint step {step} in {self.directory}: {_cause(err)} "
                                f"({space} there){kept}") from None

  def _remove_partial(self, step: int) -> None:
    """Removes what a failed save of `step` left (its temporary directory; process 0).

    The save's other write tasks (tensorstore's threads) may still be writing into it after the first one failed,
    and recreate what was removed: it is removed again until two looks `REMOVE_QUIET_S` apart find nothing
    (at most `REMOVE_WAIT_S`)."""
    try:
      self._manager.wait_until_finished()
    except Exception:  # pylint: disable=broad-except  (the failed save's error again: already reported)
      pass
    if jax.process_index() == 0:
      deadline, quiet = time.monotonic() + REMOVE_WAIT_S, 0
      while quiet < 2 and time.monotonic() < deadline:
        partials = list(self.directory.glob(f"{step}.orbax-checkpoint-tmp*"))
        for partial in partials:
          shutil.rmtree(partial, ignore_errors=True)
        quiet = 0 if partials else quiet + 1
        if quiet < 2:
          time.sleep(REMOVE_QUIET_S)
    try:
      self._manager.reload()
    except Exception:  # pylint: disable=broad-except  (a vanished directory: nothing left to list)
      pass

  def restore(self, abstract_state: Any, step: int | None = None, shardings: Any = None) -> tuple[Any, dict]:
    """Restores `step` (default: the latest) into the structure, shapes and shardings of `abstract_state`.

    Args:
      abstract_state: a state (arrays) or its `jax.ShapeDtypeStruct`s; arrays are not modified.
      step: the step; default the latest.
      shardings: target shardings (a tree like the state, e.g. from `partitioning.init_train_state`);
        default: those of `abstract_state`'s leaves. The saved device count need not match.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no checkpoint to resume from in {self.directory}")
    try:
      target = partitioning.abstract(abstract_state, shardings)
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(target, restore_args=ocp.checkpoint_utils.construct_restore_args(target)),
          metadata=ocp.args.JsonRestore()))
    except Exception as err:  # pylint: disable=broad-except  (tensorstore raises bare Exception on bad data)
      _quiet_failed_reads()
      raise CheckpointError(f"checkpoint {self.directory / str(step)} cannot be restored (damaged, or saved by a "
                            f"different run): {_first_line(err)}") from None
    if not isinstance(restored["metadata"], dict):
      raise CheckpointError(f"checkpoint {self.directory / str(step)}: its metadata is not a JSON object")
    return restored["state"], restored["metadata"]

  def metadata(self, step: int) -> dict:
    """The JSON metadata saved with `step`, without restoring the state."""
    try:
      meta = self._manager.restore(step, args=ocp.args.Composite(metadata=ocp.args.JsonRestore()))["metadata"]
    except Exception as err:  # pylint: disable=broad-except
      raise CheckpointError(f"checkpoint {self.directory / str(step)}: unreadable metadata ({_first_line(err)})"
                            ) from None
    if not isinstance(meta, dict):
      raise CheckpointError(f"checkpoint {self.directory / str(step)}: its metadata is not a JSON object")
    return meta

  def restore_intact(self, abstract_state: Any, shardings: Any = None,
                     check: Callable[[dict, int], None] | None = None,
                     report: Callable[[str], None] | None = None) -> tuple[Any, dict]:
    """Restores the newest step that restores cleanly; the damaged newer ones are moved aside.

    Args:
      abstract_state, shardings: as in `restore`.
      check: called with (metadata, step) of each candidate before its state is read; it raises to refuse
        the run (e.g. flags that differ from the checkpoint's). Its error propagates and nothing is moved.
      report: where the one-line notes about damaged steps go (default: stderr).

    Raises:
      CheckpointError: no step restores; the message names each step and why.
    """
    report = report or (lambda line: print(line, file=sys.stderr))
    steps = sorted(self.all_steps(), reverse=True)
    if not steps:
      raise CheckpointError(f"no checkpoint to resume from in {self.directory}")
    failures = []
    for step in steps:
      try:
        meta = self.metadata(step)
        if check is not None:
          check(meta, step)
        state, meta = self.restore(abstract_state, step, shardings)
      except CheckpointError as err:
        failures.append((step, str(err)))
        report(f"{err}; trying an older checkpoint" if step != steps[-1] else str(err))
        continue
      for damaged, _ in failures:
        self._move_aside(damaged)
        report(f"checkpoint step {damaged} moved aside to {self._damaged_dir / str(damaged)}; "
               f"continuing from step {step}")
      return state, meta
    raise CheckpointError(f"no intact checkpoint in {self.directory} (tried steps "
                          f"{', '.join(str(s) for s, _ in failures)}; newest: {failures[0][1]})")

  @property
  def _damaged_dir(self) -> pathlib.Path:
    return self.directory.with_name(self.directory.name + "_damaged")

  def _move_aside(self, step: int) -> None:
    """Moves step `step` out of the manager's directory (process 0), so the step can be saved again."""
    if jax.process_index() == 0:
      self._damaged_dir.mkdir(parents=True, exist_ok=True)
      target, copy = self._damaged_dir / str(step), 1
      while target.exists():  # an earlier damaged copy of the same step stays too
        target, copy = self._damaged_dir / f"{step}.{copy}", copy + 1
      (self.directory / str(step)).rename(target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"checkpoint_move_aside_{step}")
    self._manager.reload()

  def close(self) -> None:
    self._manager.close()
