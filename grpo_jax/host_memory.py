"""Host memory for XLA's CPU backend: freed buffers kept in the process for the next call, not returned to the kernel.

XLA's CPU client allocates each executable's temporary buffer afresh on every call and frees it afterwards: the
default run's GRPO update holds about 660 MB of activations there. With asynchronous dispatch a worker thread of the
client allocates it, and glibc's malloc serves a block that large to a worker thread's arena with `mmap` (those
heaps are 64 MB at most) and unmaps it on `free`, so every call page-faults the whole buffer back in and the kernel
zeroes it again: tens of millions of page faults in a default run. With synchronous dispatch the calling (main)
thread allocates it, from the main heap, and with no `mmap` and no trimming there the freed buffer stays in the
heap for the next call; every record of the run is the same. The worker threads keep their own arenas, so the many
small buffers the fused kernels allocate at every call do not search a heap that the compiles left fragmented
(one arena for every thread was slower).

  from grpo_jax import host_memory
  if host_memory.cpu_only():
    host_memory.retain_freed_memory()   # first thing in main(), before any JAX computation
"""

import ctypes
import glob
import os
import pathlib

import jax

# mallopt(3) parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4

# Device files of the accelerators JAX has backends for: NVIDIA and AMD GPUs, TPUs (v4 and older: accel; v5e and
# later: vfio groups).
_ACCELERATOR_FILES = ("nvidia[0-9]*", "kfd", "accel[0-9]*", "vfio/[0-9]*")


def cpu_only(environ=None, dev: str = "/dev") -> bool:
  """Whether this process's JAX will run on the CPU, decided before its backends start: JAX_PLATFORMS names cpu
  first, or, with it unset, the machine has no GPU or TPU device file under `dev`."""
  environ = os.environ if environ is None else environ
  platforms = environ.get("JAX_PLATFORMS", "").strip()
  if platforms:
    return platforms.split(",")[0].strip() == "cpu"
  return not any(glob.glob(str(pathlib.Path(dev) / pattern)) for pattern in _ACCELERATOR_FILES)


def retain_freed_memory() -> bool:
  """Makes XLA's CPU calls reuse freed memory: JAX's CPU dispatch synchronous (`jax_cpu_enable_async_dispatch`
  False: a call runs, and allocates, on the calling thread), and glibc's main heap with no `mmap` for large blocks
  and no trimming of its top (mallopt M_MMAP_MAX 0, M_TRIM_THRESHOLD -1).

  Call it before JAX's first computation. The process's resident memory then stays at its peak instead of
  shrinking between calls, and a jitted call returns when its result is ready. Returns False, changing nothing,
  where the C library is not glibc (macOS, musl).
  """
  try:
    libc = ctypes.CDLL(None)
  except OSError:
    return False
  # glibc only: musl's mallopt ignores these parameters, macOS has none.
  if not (hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version")):
    return False
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  libc.mallopt.argtypes, libc.mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  done = [libc.mallopt(param, value) for param, value in ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))]
  return all(ok == 1 for ok in done)
