"""A training stage's checkpoints, as every runner keeps them: on `--resume` the newest intact one is restored
after its recorded flags are checked, and the metric records of later steps are dropped (they are logged again);
each save records the flags and the metrics offset; after a step during which SIGTERM or SIGINT arrived, that
step is saved and `preemption.Interrupted` raised (exit 143 or 130 with the command that continues).

  with StageCheckpoints(directory, keep, logger, recorded, check_flags, "stage-2", signals) as ckpt:
    if resume and ckpt.latest_step() is not None:
      tree, meta = ckpt.restore(tree)
    for step in ...:
      interrupted = ckpt.stop_requested()
      if due or interrupted:
        ckpt.save(step, tree, {...}, interrupted=interrupted)
"""

import pathlib
import sys
from typing import Any, Callable

from experiments.runner import preemption
from grpo_jax import training


class StageCheckpoints:
  """The checkpoints of one stage in `directory` (at most `keep`), its `logger` (`training.MetricsLogger`) and the
  run's flags `recorded` (`resume.record`); `check_flags(recorded_then, step)` raises when a checkpoint's flags
  may not be resumed with; `stage` names the stage in `preemption.Interrupted`; `signals` the stop signals (None:
  never stopped)."""

  def __init__(self, directory: pathlib.Path, keep: int, logger, recorded: dict,
               check_flags: Callable[[dict | None, int], None], stage: str,
               signals: preemption.StopSignals | None = None):
    self.directory, self.logger, self.recorded, self.stage, self.signals = directory, logger, recorded, stage, signals
    self._check_flags = check_flags
    self._ckpt = training.Checkpointer(directory, max_to_keep=keep)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def close(self) -> None:
    self._ckpt.close()

  def latest_step(self) -> int | None:
    return self._ckpt.latest_step()

  def restore(self, abstract: Any, check: Callable[[dict], None] | None = None) -> tuple[Any, dict]:
    """`(tree, metadata)` of the newest intact checkpoint, after its flags are checked (and `check(metadata)`, which
    raises where the run may not continue it); the logger rewound to it (a note on stderr says how many records of
    later steps were dropped)."""
    tree, meta = self._ckpt.restore_intact(abstract, check=lambda meta, step: self._check_flags(meta.get("flags"),
                                                                                               step))
    if check is not None:
      check(meta)
    dropped = self.logger.rewind(meta.get("metrics_offset"))
    print(f"resumed from step {int(meta['step'])} in {self.directory}" + (
        f" ({dropped} metrics.jsonl records of later steps dropped)" if dropped else ""), file=sys.stderr)
    return tree, meta

  def stop_requested(self) -> bool:
    """Whether SIGTERM or SIGINT arrived (on any process: every process gets the same answer)."""
    return self.signals is not None and self.signals.stop_requested()

  def save(self, step: int, tree: Any, meta: dict, interrupted: bool = False) -> None:
    """Saves `tree` as step `step`, its metadata `meta` plus the step, the flags and the metrics offset; then, when
    `interrupted`, raises `preemption.Interrupted`."""
    self._ckpt.save(step, tree, {"step": step, **meta, "flags": self.recorded,
                                 "metrics_offset": self.logger.offset()})
    if interrupted:
      self.logger.newline()
      raise preemption.Interrupted(self.signals.signum, step, self.stage, self.directory)
