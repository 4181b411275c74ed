"""What `--resume` checks before it trusts a checkpoint: the flags that define the run.

A checkpoint's metadata records every flag of the runner (the `experiments` modules). Resuming with a flag that
changes what is trained (seed, batch or group size, method, model, data, loss) would silently continue a
different run, so it is refused with one line that names each such flag. The flags in `MAY_CHANGE` only change
how long the run goes, what it evaluates and logs, or where it runs, and may differ.
"""

import json

from absl import flags

from grpo_jax.training import checkpointing

FLAGS = flags.FLAGS

# `--steps` may grow or shrink a run: the learning-rate schedule is then rebuilt for the new total, so the
# rate after the resumed step follows the new schedule.
MAY_CHANGE = frozenset({
    "steps", "resume", "stop_after", "save_every", "keep_checkpoints", "work_dir", "tensorboard",
    "eval_every", "eval_batch_size", "eval_samples", "eval_temperature",
    "mesh", "sharding_rules", "coordinator_address", "num_processes", "process_id",
})


class ResumeError(ValueError):
  """`--resume` with flags that differ from the checkpoint's."""


def run_flags() -> dict:
  """The runner's own flags (those defined in `experiments` modules) and their values, JSON-ready."""
  values = {}
  for module, module_flags in FLAGS.flags_by_module_dict().items():
    if "experiments" not in module:
      continue
    for flag in module_flags:
      values[flag.name] = flag.value
  return json.loads(json.dumps(values, default=str))


def check_flags(recorded: dict | None, step: int, report) -> None:
  """Raises ResumeError naming every flag outside `MAY_CHANGE` whose value differs from `recorded`."""
  if recorded is None:
    report(f"checkpoint step {step} records no flags (saved by an older version): flags not compared")
    return
  now = run_flags()
  differ = sorted(name for name, value in recorded.items()
                  if name not in MAY_CHANGE and name in now and now[name] != value)
  if differ:
    shown = ", ".join(f"--{name}={recorded[name]} (now {now[name]})" for name in differ)
    raise ResumeError(f"--resume: checkpoint step {step} was saved with {shown}; resume with the same values, or "
                      f"start a new --work_dir (may change on resume: "
                      f"{', '.join('--' + n for n in sorted(MAY_CHANGE - {'resume'}))})")


def check_before_writing(checkpoint_dir, report) -> None:
  """`check_flags` against the newest checkpoint whose metadata reads, before the run writes anything."""
  ckpt = checkpointing.Checkpointer(checkpoint_dir)
  try:
    for step in sorted(ckpt.all_steps(), reverse=True):
      try:
        meta = ckpt.metadata(step)
      except checkpointing.CheckpointError:
        continue  # damaged: `Checkpointer.restore_intact` reports it
      check_flags(meta.get("flags"), step, report)
      return
  finally:
    ckpt.close()
