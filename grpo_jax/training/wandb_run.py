"""A Weights & Biases run beside the JSONL and TensorBoard logs (`MetricsLogger(wandb_run=...)`).

The run's whole config is attached; every record is logged under the JSONL's names with its step in a `step`
field, against which W&B plots every metric (SFT's and RL's steps both start at 1, as in TensorBoard). The run's id
is kept in `<work_dir>/wandb_run_id`, so that `--resume` continues the same W&B run (`resume="allow"`); in offline
mode each resume writes another offline directory with that id, and `wandb sync` joins them into one run.
wandb is an optional package (`pip install 'grpo_jax[wandb]'`), imported only here and only when asked for.
"""

import os
import pathlib
import re
import secrets
import string
from typing import Any, Mapping

RUN_ID_FILE = "wandb_run_id"
MODES = ("online", "offline", "disabled")


class NotInstalledError(ValueError):
  """wandb cannot be imported; the message says how to install it."""


class StartError(ValueError):
  """W&B could not start the run (no login, no network); `cause` is W&B's error in one line."""

  def __init__(self, cause: str):
    self.cause = cause
    super().__init__(f"W&B could not start the run ({cause}); log in (wandb login), or log offline "
                     "(mode=\"offline\") and upload later with `wandb sync`")


def _wandb():
  try:
    import wandb  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    raise NotInstalledError(f"W&B logging needs wandb, which is not installed ({err}): "
                            "pip install 'grpo_jax[wandb]'") from None
  return wandb


def check_installed() -> None:
  """Raises NotInstalledError (a ValueError) in one line when wandb cannot be imported."""
  _wandb()


def new_run_id() -> str:
  """A fresh W&B run id: 8 random characters from a-z0-9 (W&B's own form)."""
  return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def stored_run_id(work_dir: str | os.PathLike) -> str | None:
  """The run id kept in `<work_dir>/wandb_run_id`, or None when there is none (no file, or an empty one).

  Raises:
    ValueError: in one line naming the file, when it holds anything but one id (letters, digits, `_`, `-`, `.`;
      W&B's own ids are 8 of a-z0-9) or cannot be read.
  """
  path = pathlib.Path(work_dir) / RUN_ID_FILE
  if not path.is_file():
    return None
  try:
    stored = path.read_text(encoding="utf-8").strip()
  except (OSError, UnicodeDecodeError) as err:
    raise ValueError(f"{path}: cannot read the W&B run id ({err}); restore the file, or remove it to log to a new "
                     "W&B run") from None
  if stored and not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", stored):
    raise ValueError(f"{path}: not a W&B run id ({stored[:40]!r}); restore the file, or remove it to log to a new "
                     "W&B run")
  return stored or None


def run_id(work_dir: str | os.PathLike, resume: bool, new_id=new_run_id) -> str:
  """The W&B run id of `work_dir`: the stored one when resuming and there is one (`stored_run_id`), else
  `new_id()` (stored)."""
  path = pathlib.Path(work_dir) / RUN_ID_FILE
  stored = stored_run_id(work_dir) if resume else None
  if stored:
    return stored
  fresh = new_id()
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(fresh + "\n", encoding="utf-8")
  return fresh


def start(work_dir: str | os.PathLike, project: str, config: Mapping[str, Any], *, resume: bool = False,
          mode: str = "", entity: str = "", name: str = ""):
  """Starts (or, with `resume`, continues) the W&B run of `work_dir`; returns it.

  Args:
    work_dir: the run's directory: W&B writes under `<work_dir>/wandb`, and the id is kept beside it.
    project: the W&B project.
    config: the run's settings, attached as the W&B config (values may change on resume).
    resume: continue the run whose id `work_dir` holds (a new run when it holds none).
    mode: "online", "offline" or "disabled"; "" leaves it to W&B (WANDB_MODE, else online).
    entity: the W&B entity (team or user); "" for the default.
    name: the run's display name; "" lets W&B choose.

  Raises:
    ValueError: in one line, for an unknown mode; NotInstalledError for a missing wandb package; StartError for a
      run W&B cannot start (no login, no network: offline mode needs neither). Both are ValueErrors.
  """
  if mode and mode not in MODES:
    raise ValueError(f"W&B mode must be one of {', '.join(MODES)}, not {mode!r}")
  wandb = _wandb()
  work_dir = pathlib.Path(work_dir)
  try:
    run = wandb.init(project=project, entity=entity or None, name=name or None, mode=mode or None,
                     dir=str(work_dir), id=run_id(work_dir, resume), resume="allow")
  except wandb.errors.Error as err:
    raise StartError(f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}") from None
  run.config.update(dict(config), allow_val_change=True)  # a resumed run may change what `--resume` allows
  run.define_metric("step")
  run.define_metric("*", step_metric="step")
  return run
