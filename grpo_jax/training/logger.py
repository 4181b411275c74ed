"""Metrics to the console (a progress line with ETA), a JSONL file, TensorBoard event files and W&B."""

import json
import math
import pathlib
import sys
import time

import jax
import numpy as np


_open_line = False  # a progress bar is on the terminal's current line, not yet ended by a newline


def end_progress_line() -> None:
  """Ends an open progress bar's line, so that what is printed next (an error) starts on a line of its own."""
  global _open_line
  if _open_line:
    sys.stderr.write("\n")
    sys.stderr.flush()
    _open_line = False


def _scalar(x):
  x = np.asarray(x)
  return x.item() if x.size == 1 else None


def _summary_writer_class():
  """tensorboardX's SummaryWriter, imported only when asked for (about a second of imports); a ValueError in one
  line where it is not installed."""
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    raise ValueError(f"tensorboard event files need tensorboardX, which is not installed ({err}): "
                     "pip install 'tensorboardX>=2.6', or turn tensorboard off") from None
  return SummaryWriter


class MetricsLogger:
  """Writes metrics from process 0 only.

  Args:
    work_dir: `metrics.jsonl` and TensorBoard files go to `work_dir` and `work_dir/tensorboard`.
    total_steps: for the progress bar and ETA.
    tensorboard: whether to write event files.
    wandb_run: a W&B run (`wandb_run.start`) that gets every record too, under the same names with its `step`;
      finished by `close`. None: no W&B.
  """

  def __init__(self, work_dir: str | pathlib.Path, total_steps: int, tensorboard: bool = True, wandb_run=None):
    self.enabled = jax.process_index() == 0
    self.total_steps = total_steps
    self._start = time.time()
    self._first_step = None
    self._writer = None
    self._jsonl = None
    self._wandb = wandb_run if self.enabled else None
    if not self.enabled:
      return
    summary_writer = _summary_writer_class() if tensorboard else None
    work_dir = pathlib.Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    self._jsonl = open(work_dir / "metrics.jsonl", "a", encoding="utf-8")
    if summary_writer is not None:
      self._writer = summary_writer(str(work_dir / "tensorboard"))

  def log(self, step: int, metrics: dict, *, prefix: str = "") -> dict:
    """Records `metrics` (scalars) at `step`; returns them as Python floats."""
    values = {f"{prefix}{k}": _scalar(v) for k, v in metrics.items()}
    values = {k: v for k, v in values.items() if v is not None}
    if not self.enabled:
      return values
    record = {"step": step, "time": round(time.time() - self._start, 3), **{
        k: (v if isinstance(v, (int, float)) and math.isfinite(v) else str(v)) for k, v in values.items()}}
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    if self._writer is not None:
      for k, v in values.items():
        self._writer.add_scalar(k, v, step)
    if self._wandb is not None:
      self._wandb.log({"step": step, **values})
    return values

  def start(self, total_steps: int) -> None:
    """Starts a new stage of `total_steps` steps: the progress bar and ETA restart."""
    self.total_steps = total_steps
    self._first_step = None

  def progress(self, step: int, text: str) -> None:
    """Redraws a one-line progress bar `[####....] step/total ETA` followed by `text`."""
    if not self.enabled:
      return
    if self._first_step is None:
      self._first_step, self._first_time = step - 1, time.time()
    done = max(step - self._first_step, 1)
    per_step = (time.time() - self._first_time) / done
    eta = per_step * max(self.total_steps - step, 0)
    width = 20
    filled = int(width * step / max(self.total_steps, 1))
    bar = "#" * filled + "." * (width - filled)
    line = f"\r[{bar}] {step}/{self.total_steps} {per_step:.2f}s/step ETA {eta // 60:.0f}m{eta % 60:02.0f}s {text}"
    sys.stderr.write(line[:200].ljust(120))
    sys.stderr.flush()
    global _open_line
    _open_line = True

  def newline(self) -> None:
    if self.enabled:
      end_progress_line()

  def offset(self) -> int:
    """The length in bytes of `metrics.jsonl` so far; saved with a checkpoint, see `rewind`."""
    return self._jsonl.tell() if self._jsonl is not None else 0

  def rewind(self, offset: int | None) -> int:
    """Drops what `metrics.jsonl` holds past `offset` (what was logged after a checkpoint, before a crash), so a
    resumed run logs each step once. Returns the number of records dropped."""
    if self._jsonl is None or offset is None or offset >= self._jsonl.tell():
      return 0
    path = pathlib.Path(self._jsonl.name)
    self._jsonl.close()
    with open(path, "rb") as f:
      f.seek(offset)
      dropped = f.read().count(b"\n")
    with open(path, "r+b") as f:
      f.truncate(offset)
    self._jsonl = open(path, "a", encoding="utf-8")
    return dropped

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
    if self._writer is not None:
      self._writer.close()
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None
