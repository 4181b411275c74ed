"""No TPU backend start where no TPU exists: with libtpu installed (the test extra installs it), JAX's backend
discovery loads it on every machine, and on one without a TPU libtpu prints five lines of errors ("Failed to find
host bounds for accelerator type", "INVALID_ARGUMENT: unexpected worker hostname", a "Source Location Trace")
before JAX falls back to the GPU or CPU, quietly, as it would have anyway.

`skip_absent_tpu()` replaces JAX's TPU backend factory by one that reports no TPU, where none can be present: no
TPU device file (/dev/accel*: v4 and older; /dev/vfio/<n>: v5e and later), no TPU chip on the PCI bus (JAX's own
test), no TPU_* / JAX_FORCE_TPU_INIT variable that asks for one, and JAX_PLATFORMS unset (the user's choice wins).
It runs when `grpo_jax` is imported, which every entry point does before JAX starts its backends.

  import grpo_jax          # nothing else to do; from a program that must decide itself:
  absent_tpu.skip_absent_tpu()
"""

import glob
import os
import pathlib

_TPU_FILES = ("accel[0-9]*", "vfio/[0-9]*")
_TPU_VARIABLES = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID", "TPU_NAME",
                  "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS", "JAX_FORCE_TPU_INIT")


def tpu_may_be_present(environ=None, dev: str = "/dev") -> bool:
  """Whether this machine may have a TPU: a TPU device file under `dev`, a TPU chip on the PCI bus, or a variable
  in `environ` that configures one."""
  environ = os.environ if environ is None else environ
  if any(environ.get(name) for name in _TPU_VARIABLES):
    return True
  if any(glob.glob(str(pathlib.Path(dev) / pattern)) for pattern in _TPU_FILES):
    return True
  try:  # JAX's own PCI test (private: a JAX without it leaves the device files to decide)
    from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel
    return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
  except (ImportError, AttributeError, OSError):
    return False


def _no_tpu():
  return None  # JAX reads None as "this backend did not start", and, for the TPU, says nothing


def skip_absent_tpu(environ=None, dev: str = "/dev") -> bool:
  """Keeps JAX from starting its TPU backend when `tpu_may_be_present` says no and JAX_PLATFORMS is unset.

  Call before JAX's first computation. Returns whether it did; False changes nothing (JAX_PLATFORMS or
  `jax_platforms` set, a TPU possible, or JAX's backends already started).
  """
  environ = os.environ if environ is None else environ
  if environ.get("JAX_PLATFORMS", "").strip() or tpu_may_be_present(environ, dev):
    return False  # (JAX is not imported here, so that `grpo_jax.python_gc` can act before it is)
  import jax  # pylint: disable=import-outside-toplevel
  from jax.extend import backend  # pylint: disable=import-outside-toplevel
  if jax.config.jax_platforms:
    return False
  try:
    backend.register_backend_factory("tpu", _no_tpu, priority=300, fail_quietly=True)
  except RuntimeError:  # the backends are up already: too late, and nothing to change
    return False
  return True
