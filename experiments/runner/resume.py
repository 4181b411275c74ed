"""What `--resume` checks before it trusts a checkpoint: the configuration that defines the run.

A checkpoint's metadata records the run's whole config, flat, by flag name (`Config.flat`). Resuming with a value
that changes what is trained (seed, batch or group size, method, model, data, loss) would silently continue a
different run, so it is refused with one line that names each such field. The fields in `config.MAY_CHANGE` only
change how long the run goes, what it evaluates and logs, or where it runs, and may differ. `--steps` may grow or
shrink a run: the learning-rate schedule is then rebuilt for the new total.
"""

import json
import pathlib

from experiments.runner import config as config_lib
from grpo_jax.training import checkpointing

MAY_CHANGE = config_lib.MAY_CHANGE


class ResumeError(ValueError):
  """`--resume` with flags that differ from the checkpoint's."""


def record(config: config_lib.Config) -> dict:
  """The config as a checkpoint records it: flag name -> value, JSON-ready."""
  return json.loads(json.dumps(config.flat(), default=str))


def check_flags(recorded: dict | None, now: dict, step: int, report, may_change: frozenset = MAY_CHANGE,
                directory_flag: str = "--work_dir") -> None:
  """Raises ResumeError naming every field outside `may_change` whose value in `now` (a `record`) differs from
  `recorded`; fields only one side has are not compared. `directory_flag`: the runner's output directory flag,
  named in the error."""
  if recorded is None:
    report(f"checkpoint step {step} records no flags (saved by an older version): flags not compared")
    return
  differ = sorted(name for name, value in recorded.items()
                  if name not in may_change and name in now and now[name] != value
                  and not (value is None and name == "group_size"))  # older records: unresolved, the default
  if differ:
    shown = ", ".join(f"--{name}={recorded[name]} (now {now[name]})" for name in differ)
    raise ResumeError(f"--resume: checkpoint step {step} was saved with {shown}; resume with the same values, or "
                      f"start a new {directory_flag} (may change on resume: "
                      f"{', '.join('--' + n for n in sorted(may_change - {'resume'}))})")


def check_before_writing(checkpoint_dir, now: dict, report) -> None:
  """`check_flags` against the newest checkpoint whose metadata reads, before the run writes anything."""
  ckpt = checkpointing.Checkpointer(checkpoint_dir)
  try:
    for step in sorted(ckpt.all_steps(), reverse=True):
      try:
        meta = ckpt.metadata(step)
      except checkpointing.CheckpointError:
        continue  # damaged: `Checkpointer.restore_intact` reports it
      check_flags(meta.get("flags"), now, step, report)
      return
  finally:
    ckpt.close()


def holds_checkpoints(directory: pathlib.Path) -> bool:
  """Whether `directory` exists and holds anything (a checkpoint, or one being written)."""
  directory = pathlib.Path(directory)
  return directory.is_dir() and any(directory.iterdir())


def check_start(directories, resume: bool, *, resumable: bool = False, directory_flag: str = "--work_dir",
                overwrite_flag: str = "", overwrite: bool = False) -> None:
  """The checkpoint-directory guard of a run that is about to start, before it writes anything: RunError with one
  line. Without `resume`, a directory of `directories` that holds checkpoints is refused (unless `overwrite`, the
  runner's `overwrite_flag`, says to start over); with it, at least one must hold some (or `resumable`: the run
  has something else to continue from)."""
  for directory in directories:
    if not resume and not overwrite and holds_checkpoints(directory):
      start_over = f"{overwrite_flag} to start over, " if overwrite_flag else ""
      raise config_lib.RunError(f"{directory} already holds checkpoints; pass --resume to continue, {start_over}or "
                                f"choose another {directory_flag}")
  if resume and not resumable and not any(holds_checkpoints(d) for d in directories):
    raise config_lib.RunError(f"--resume: no checkpoint in {directories[0]}")
