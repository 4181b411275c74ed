"""Shared test configuration and fixtures.

Tests marked `@pytest.mark.devices(n)` need n devices. In a process with fewer
(the plain `pytest` run has one CPU device), such a test runs in a child pytest
process with `XLA_FLAGS=--xla_force_host_platform_device_count=n`, and passes
or fails with it; run with that flag already set, it runs in place.
"""

import functools
import gc
import importlib.metadata
import os
import pathlib
import subprocess
import sys
import tempfile

# Write the bytecode of what the suite imports, once. The README installs with `pip install --no-compile` (pip
# byte-compiles the 17k files of the test extra one by one, most of the install's time), and some
# machines set PYTHONDONTWRITEBYTECODE, under which each of the suite's ~100 processes (workers, runner
# subprocesses) would compile jax, torch and transformers from source again. Unset here, before the workers and
# child processes start (they inherit it), the first import of a module writes its .pyc (5.4k files) and later
# processes load it: a cold pytest takes as long as with pip's byte-compiled install.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
  sys.dont_write_bytecode = False  # (`python -B` alone is left as it is)

# One on-disk XLA compilation cache for the whole run, shared by the pytest workers and the child processes
# the tests start (they inherit these variables): the same tiny programs are compiled once, not once per test.
# Set before JAX is imported, which reads them.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      str(pathlib.Path(tempfile.gettempdir()) / f"grpo_jax_tests_xla_cache_{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
# CPU only: with libtpu installed (the test extra, for the ahead-of-time TPU compiles, which set up their own
# child processes), JAX would otherwise try to start a TPU backend in every worker and print its warnings.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compile the tests' programs fast: most of a cold run is XLA compiling small programs that then run for
# milliseconds. Without LLVM's optimisation passes, and with XLA CPU's older LLVM-IR fusion emitters instead of
# its MLIR ones (both compile faster; BENCHMARKS.md, the test suite). What the tests check is unchanged; timing and compiler output are
# measured by scripts/ (and test_aot_compile drops these flags for the TPU compiler).
# jaxlib 0.11's XLA no longer has the second flag and aborts the process on an unknown flag in XLA_FLAGS: it is
# set for the jaxlib releases that know it (seen on jax 0.11.2 CUDA).
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0",) + (
    ("--xla_cpu_use_fusion_emitters=false",)
    if tuple(int(x) for x in importlib.metadata.version("jaxlib").split(".")[:2]) < (0, 11) else ())
for _flag in FAST_COMPILE_FLAGS:
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), _flag]))

# Python's garbage collector as a runner sets it (`python_gc`), from before the imports of JAX and of the test
# modules: full collections over a worker's large heap took 8% of its time. The heap that collection built is
# frozen at its end (`pytest_collection_finish`).
from grpo_jax import python_gc  # pylint: disable=wrong-import-position

python_gc.collect_less()

from absl import flags  # pylint: disable=wrong-import-position
from absl import logging  # pylint: disable=wrong-import-position
import jax  # pylint: disable=wrong-import-position
import pytest  # pylint: disable=wrong-import-position

from grpo_jax import host_memory  # pylint: disable=wrong-import-position

# Full-precision float32 matmuls, so parity tests compare the math and not the backend's defaults.
jax.config.update("jax_default_matmul_precision", "highest")

_ROOT = pathlib.Path(__file__).resolve().parent.parent

# A child process that runs longer than this is hung, not slow: no test bounds wall-clock time more tightly,
# since the same suite runs 5x slower on some machines of this project's kind and slower still when busy.
HANG_GUARD_S = 3600


def pytest_collection_finish(session):
  gc.freeze()  # the test modules and what they imported: never examined by a collection again


def pytest_configure(config):
  config.addinivalue_line("markers", "devices(n): the test needs n devices (a child process with n fake CPU "
                          "devices when this one has fewer)")


def with_cpu_devices(n: int, env: dict | None = None) -> dict:
  """A copy of the environment whose JAX sees n CPU devices."""
  env = dict(os.environ if env is None else env)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
  env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
  return env


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
  marker = pyfuncitem.get_closest_marker("devices")
  if marker is None or jax.device_count() >= marker.args[0]:
    return None
  n = marker.args[0]
  result = subprocess.run(
      # One process (`-n 0`): pytest.ini's `-n auto` would start a worker per core for the one test.
      [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", "--no-header",
       pyfuncitem.nodeid],
      cwd=pyfuncitem.config.rootpath, env=with_cpu_devices(n), capture_output=True, text=True, timeout=HANG_GUARD_S)
  if result.returncode != 0:
    pytest.fail(f"on {n} CPU devices (child process):\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}",
                pytrace=False)
  return True


@pytest.fixture(params=["eager", "jit"])
def variant(request):
  """Runs a function eagerly or under `jax.jit`; keyword arguments are bound statically.

  Usage: `variant(losses.gae, gamma=0.9)(rewards, values, mask)`.
  """

  def wrap(fn, **static):
    bound = functools.partial(fn, **static)
    return jax.jit(bound) if request.param == "jit" else bound

  return wrap


def run_grpo_math(*argv) -> dict:
  """`experiments.grpo_math`'s run in this process with these flags (the program name first is added), its
  summary returned; the flags are unparsed afterwards, whatever happens."""
  from experiments import grpo_math  # pylint: disable=import-outside-toplevel

  flags.FLAGS.unparse_flags()
  flags.FLAGS(["grpo_math", *argv])
  try:
    return grpo_math.run()
  finally:
    flags.FLAGS.unparse_flags()


@pytest.fixture
def main_in_process(monkeypatch):
  """`run(main, argv, defaults=None)`: an entry point's `main(argv)` called in this process as `app.run` calls it,
  the flags parsed from `argv` (with `defaults` as the flags' defaults, as a program sets them before `app.run`),
  returning what it exits with: its one-line error (a string: printed to stderr, exit status 1), or None when it
  returns. The flags, their defaults and absl's logging verbosity (which main lowers) are restored afterwards.

  For the many bad-input cases of one program: a child process costs about a second of imports and backend start
  each, and each entry point keeps one child-process test of the real exit status and stderr. The process settings
  that a runner's main applies (`host_memory.retain_freed_memory`, `python_gc.collect_less`; test_cli tests them)
  are skipped, so that this worker's later tests run under the suite's settings (and no earlier test's garbage is
  frozen); and JAX's backends are started first, so that main leaves this process's devices as they are
  (`cli.split_cpu`).
  """
  monkeypatch.setattr(host_memory, "retain_freed_memory", lambda: False)
  monkeypatch.setattr(python_gc, "collect_less", lambda: None)
  jax.devices()

  def run(main, argv, defaults=None):
    saved, verbosity = {name: flags.FLAGS[name].default for name in defaults or {}}, logging.get_verbosity()
    flags.FLAGS.unparse_flags()
    try:
      for name, value in (defaults or {}).items():
        flags.FLAGS.set_default(name, value)
      main(flags.FLAGS(argv))
    except SystemExit as exit_:
      return exit_.code
    finally:
      for name, value in saved.items():
        flags.FLAGS.set_default(name, value)
      flags.FLAGS.unparse_flags()
      logging.set_verbosity(verbosity)
    return None

  return run
