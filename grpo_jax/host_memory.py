"""Host memory for XLA's CPU backend: freed buffers kept in the process for the next call, not returned to the kernel.

XLA's CPU client allocates each executable's temporary buffer afresh on every call and frees it afterwards: the
default run's GRPO update holds about 660 MB of activations there. glibc's malloc serves an allocation that large
with `mmap` (always, when a worker thread's arena asks: its heaps are 64 MB at most) and unmaps it on `free`, so
every call page-faults the whole buffer back in and the kernel zeroes it again: 56M page faults and 89 s of system
time in a 247 s default run on a 2-core CPU. With one arena, no `mmap` and no trimming, a freed buffer stays in the
heap and the next call reuses it: the same run in 206 s, the same records, a lower peak RSS (BENCHMARKS.md, ninth
pass; a run that compiles its programs in the process, rather than loading them from the compilation cache, gains
little: the compiles leave the one heap fragmented). The settings must be made before JAX starts its thread pools,
since a thread keeps the arena of its first allocation.

  from grpo_jax import host_memory
  if host_memory.cpu_only():
    host_memory.retain_freed_memory()   # first thing in main(), before any JAX computation
"""

import ctypes
import glob
import os
import pathlib

# mallopt(3) parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8

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
  """Makes glibc's malloc keep freed memory for reuse: one arena for every thread, no `mmap` for large blocks, no
  trimming of the heap's top (mallopt M_ARENA_MAX 1, M_MMAP_MAX 0, M_TRIM_THRESHOLD -1).

  Call it before JAX starts (threads that have allocated keep their arenas). The process's resident memory then
  stays at its peak instead of shrinking between calls. Returns False, changing nothing, where the C library is not
  glibc (macOS, musl).
  """
  try:
    libc = ctypes.CDLL(None)
  except OSError:
    return False
  # glibc only: musl's mallopt ignores these parameters, macOS has none.
  if not (hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version")):
    return False
  libc.mallopt.argtypes, libc.mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  done = [libc.mallopt(param, value) for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))]
  return all(ok == 1 for ok in done)
