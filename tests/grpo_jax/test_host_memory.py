"""grpo_jax.host_memory: freed host memory kept for the next XLA call; the CPU decided before JAX starts."""

import os
import pathlib
import subprocess
import sys

import pytest

from grpo_jax import host_memory

REPO = pathlib.Path(__file__).resolve().parents[2]

# A fresh process: optionally retain freed memory first, then (a) malloc a 100 MB block and read how many bytes
# glibc holds in mmap'd blocks (mallinfo2's hblkhd) before and after, (b) call a jitted program whose 64 MB
# intermediate ([4096, 4096] float32) lives in XLA's temporary buffer, and count the page faults of its later calls,
# (c) print whether JAX's CPU dispatch is asynchronous.
_PROBE = """
import ctypes, resource, sys
from grpo_jax import host_memory
applied = host_memory.retain_freed_memory() if sys.argv[1] == "retain" else None
libc = ctypes.CDLL(None)
class Mallinfo2(ctypes.Structure):
  _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
before = libc.mallinfo2().hblkhd
block = libc.malloc(100 << 20)
mmapped = libc.mallinfo2().hblkhd - before
libc.free(ctypes.c_void_p(block))
import jax, jax.numpy as jnp
f = jax.jit(lambda x: jnp.sum(jnp.tanh(x @ x.T) @ x))
x = jnp.ones((4096, 64), jnp.float32) * 0.01
f(x).block_until_ready()
f(x).block_until_ready()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
  f(x).block_until_ready()
print(applied, mmapped, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 4,
      jax.config.read("jax_cpu_enable_async_dispatch"))
"""


def _probe(mode: str) -> tuple[str, int, float, str]:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-c", _PROBE, mode], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  applied, mmapped, faults, asynchronous = result.stdout.split()[-4:]
  return applied, int(mmapped), float(faults), asynchronous


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                    reason="glibc's malloc only")
def test_freed_buffers_stay_in_the_process_and_xla_calls_stop_faulting_them_in():
  applied, mmapped, faults, asynchronous = _probe("retain")
  assert (applied, asynchronous) == ("True", "False")  # the calls run, and allocate, on the main thread
  assert mmapped == 0  # 100 MB from the heap, not from mmap
  assert faults < 1024  # the 64 MB temporary (16,384 pages) is reused, not faulted in again
  # The defaults, in the same kind of process: the 100 MB block is mmap'd (and unmapped on free), dispatch async.
  default_applied, default_mmapped, _, default_asynchronous = _probe("default")
  assert (default_applied, default_asynchronous) == ("None", "True")
  assert default_mmapped >= 100 << 20


def test_the_cpu_is_told_from_jax_platforms_or_the_accelerators_device_files(tmp_path):
  dev = tmp_path / "dev"
  dev.mkdir()
  assert host_memory.cpu_only({}, dev=str(dev))
  assert host_memory.cpu_only({"JAX_PLATFORMS": "cpu"}, dev=str(dev))
  assert not host_memory.cpu_only({"JAX_PLATFORMS": "cuda,cpu"}, dev=str(dev))
  assert not host_memory.cpu_only({"JAX_PLATFORMS": "tpu"}, dev=str(dev))
  (dev / "vfio").mkdir()
  (dev / "vfio" / "vfio").touch()  # the vfio control file alone is not a TPU
  (dev / "nvidiactl").touch()  # nor is the NVIDIA control device without a GPU
  assert host_memory.cpu_only({}, dev=str(dev))
  for name in ("nvidia0", "kfd", "accel0", "vfio/0"):
    (dev / name).touch()
    assert not host_memory.cpu_only({}, dev=str(dev)), name
    assert host_memory.cpu_only({"JAX_PLATFORMS": "cpu"}, dev=str(dev)), name  # the environment wins
    (dev / name).unlink()
