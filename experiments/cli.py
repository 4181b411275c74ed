"""The runners' command line: one flag per `runner.Config` field, generated from the field (`config_lib.flag`).

The entry modules (`experiments/grpo_math.py`, `flow_grpo.py`, `train_reward_model.py`) import this module to
define the flags, then build their `Config` once in `main()` with `config_from_flags()`; nothing below them reads
a flag. Values are checked by `runner.Config` (one line naming the flag; absl checks only the enum choices at
parse time), so the same checks guard a config built in Python.
"""

import dataclasses
import os
import shlex
import sys
import typing

from absl import app
from absl import flags
from absl import logging
import jax

from experiments.runner import config as config_lib
from experiments.runner import preemption
from experiments.trainer import loop
from grpo_jax import data
from grpo_jax import distributed
from grpo_jax import host_memory
from grpo_jax import models
from grpo_jax import python_gc
from grpo_jax.training import checkpointing
from grpo_jax.training import logger as logger_lib

FLAGS = flags.FLAGS
ERRORS = (config_lib.RunError, models.CheckpointError, data.DatasetError,
          FloatingPointError, ValueError, OSError)  # reported as one line, exit status 1

# THE FLAGS: one per field of `runner.Config`'s sections, of the field's name, type and default, with the help text
# and values that `config_lib.flag(...)` declares on the field. A field added to a section is a flag. A flag that is
# not one field (an alias, a derived value; none today) would be defined by hand after `define_flags()`, with a
# comment saying why.
_DEFINE = {str: flags.DEFINE_string, int: flags.DEFINE_integer, float: flags.DEFINE_float, bool: flags.DEFINE_bool}


def _define(field: dataclasses.Field, annotation, flag_values: flags.FlagValues) -> None:
  """The flag of one config field: an enum of its `choices` (None left out: an unset default, not a value), else
  by its type (`T` or `T | None`)."""
  if "help" not in field.metadata:
    raise TypeError(f"config field {field.name} has no help text: declare it as config_lib.flag(default, help_text)")
  help_text, choices = field.metadata["help"], field.metadata.get("choices")
  if choices is not None:
    flags.DEFINE_enum(field.name, field.default, [c for c in choices if c is not None], help_text,
                      flag_values=flag_values)
    return
  (kind,) = [t for t in (typing.get_args(annotation) or (annotation,)) if t is not type(None)]
  _DEFINE[kind](field.name, field.default, help_text, flag_values=flag_values)


def define_flags(sections=None, flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the flag of every field of `sections` (default `config_lib.SECTIONS`; importing this module does)."""
  for section in (sections or config_lib.SECTIONS).values():
    annotations = typing.get_type_hints(section)
    for field in dataclasses.fields(section):
      _define(field, annotations[field.name], flag_values)


define_flags()


def config_from_flags(**overrides) -> config_lib.Config:
  """The `Config` of the parsed flags (fields without a defined flag keep their defaults), with `overrides`."""
  values = {name: FLAGS[name].value for name in config_lib.Config().flat() if name in FLAGS}
  values.update(overrides)
  return config_lib.from_flat(values)


def run_from_flags(**overrides) -> dict:
  """`loop.run` of the parsed flags' config."""
  return loop.run(config_from_flags(**overrides))


def enable_compilation_cache(path: str) -> None:
  """JAX's persistent compilation cache in `path`, every program kept (JAX's default keeps only those over a second
  of compile time, which leaves out most of a run's programs), unless
  JAX_COMPILATION_CACHE_DIR already chose a directory (or JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS a threshold)
  or `path` is empty."""
  if path and not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def split_cpu(devices: int) -> None:
  """Presents the CPU as `devices` devices (0: one per core) for a one-process run without a mesh, before JAX starts
  its backends; left alone when XLA_FLAGS or JAX_NUM_CPU_DEVICES already set the count, or when the backends are
  already up (a `main` called from a program that ran JAX first keeps its devices). On a GPU or TPU it only adds CPU
  devices that nothing uses."""
  if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "") or "JAX_NUM_CPU_DEVICES" in os.environ:
    return
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
  try:
    jax.config.update("jax_num_cpu_devices", devices or cores)
  except RuntimeError:
    return  # the backends are up (JAX ran before this main): the CPU keeps the devices it has


def resume_command(name: str, argv=None, resume: bool = True) -> str:
  """The command line that continues this run: the program as it was started (`python -m experiments.<name>`,
  or its script) with its arguments, and `--resume` in place of any resume flag it had (none: `resume` False)."""
  argv = list(sys.argv if argv is None else argv)
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  if spec is not None and spec.name:
    program = ["-m", spec.name]
  else:
    program = [argv[0]] if argv else ["-m", f"experiments.{name}"]
  args = [a for a in argv[1:] if a.split("=")[0] not in ("--resume", "--noresume")]
  return shlex.join([sys.executable, *program, *args] + (["--resume"] if resume else []))


def report_interrupted(name: str, err: preemption.Interrupted) -> None:
  """One line: where the run stopped, and the command that continues it."""
  logger_lib.end_progress_line()
  how = (f"continue with: {resume_command(name)}" if err.saved is not None
         else f"run it again: {resume_command(name, resume=False)}")
  print(f"{name}: {err}; {how}", file=sys.stderr)


def main_for(name: str, job=None, **overrides):
  """`main(argv)` of the runner called `name`: flags -> config -> `job(config)` (default: the training loop),
  errors as one line."""

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    python_gc.collect_less()  # the imports' objects out of every collection; fewer full collections
    if host_memory.cpu_only():  # before JAX's first computation
      host_memory.retain_freed_memory()
    try:
      config = config_from_flags(**overrides)
      mesh = config.mesh
      several = mesh.coordinator_address or mesh.num_processes or os.environ.get("JAX_COORDINATOR_ADDRESS")
      if not (mesh.mesh or several):
        split_cpu(mesh.cpu_devices)
      distributed.initialize(mesh.coordinator_address or None, mesh.num_processes, mesh.process_id)  # first
    except ValueError as err:
      sys.exit(f"{name}: error: {err}")
    enable_compilation_cache(config.run.compilation_cache_dir)
    if not FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO; -v 0 brings it back
    try:
      (job or loop.run)(config)
    except preemption.Interrupted as err:  # SIGTERM / SIGINT: the step saved; 128 + the signal (143, 130)
      report_interrupted(name, err)
      sys.exit(err.exit_status)
    except ERRORS as err:
      logger_lib.end_progress_line()
      sys.exit(f"{name}: error: {err}")
    except jax.errors.JaxRuntimeError as err:
      if "RESOURCE_EXHAUSTED" not in str(err):
        raise
      logger_lib.end_progress_line()  # a size no device holds (a model width, a batch, a completion budget)
      first = str(err).strip().splitlines()[0].rstrip(".")
      sys.exit(f"{name}: error: out of memory: {first}; lower the sizes the flags set (--batch_size, --group_size, "
               "--max_new_tokens, the model's), or --forward_memory_budget")
    except BaseException:
      logger_lib.end_progress_line()
      raise

  return main
