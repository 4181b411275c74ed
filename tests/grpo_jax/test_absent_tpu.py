"""A machine without a TPU prints nothing about TPUs, with libtpu installed or not (grpo_jax/absent_tpu.py)."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from grpo_jax import absent_tpu
from tests.conftest import HANG_GUARD_S

REPO = pathlib.Path(__file__).resolve().parents[2]
LIBTPU = importlib.util.find_spec("libtpu") is not None


def _python(code: str):
  # JAX discovers its platforms, as in a user's shell; libtpu does not give up early, quietly, when another process
  # (a TPU compile of test_aot_compile) holds its lock file /tmp/libtpu_lockfile.
  env = dict(os.environ, PYTHONPATH=str(REPO), ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  env.pop("JAX_PLATFORMS", None)
  return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=HANG_GUARD_S)


def _tpu_lines(text: str) -> list[str]:
  return [l for l in text.splitlines() if "TPU" in l or "accelerator" in l.lower() or "Source Location" in l]


@pytest.mark.skipif(absent_tpu.tpu_may_be_present(), reason="this machine may have a TPU")
def test_importing_grpo_jax_keeps_jax_from_starting_libtpu():
  result = _python("import grpo_jax, jax; print(jax.default_backend(), len(jax.devices()))")
  assert result.returncode == 0, result.stderr
  assert not _tpu_lines(result.stderr), result.stderr
  assert result.stdout.split()[0] in ("cpu", "gpu")
  if LIBTPU:  # the control: JAX alone, with libtpu installed, does print them (so the check above can fail)
    control = _python("import jax; print(jax.default_backend())")
    assert control.returncode == 0 and _tpu_lines(control.stderr), control.stderr


def test_a_tpu_is_told_from_device_files_and_variables(tmp_path):
  dev = tmp_path / "dev"
  dev.mkdir()
  no_pci = not absent_tpu.tpu_may_be_present({}, dev=str(dev))  # this machine's PCI bus has no TPU chip
  if no_pci:
    (dev / "nvidia0").touch()
    assert not absent_tpu.tpu_may_be_present({}, dev=str(dev))
  (dev / "accel0").touch()  # TPU v4 and older
  assert absent_tpu.tpu_may_be_present({}, dev=str(dev))
  (dev / "accel0").unlink()
  (dev / "vfio").mkdir()
  (dev / "vfio" / "vfio").touch()  # the control file alone: no TPU
  assert absent_tpu.tpu_may_be_present({}, dev=str(dev)) is not no_pci
  (dev / "vfio" / "0").touch()  # v5e and later: a vfio group
  assert absent_tpu.tpu_may_be_present({}, dev=str(dev))
  assert absent_tpu.tpu_may_be_present({"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, dev=str(tmp_path / "none"))


def test_jax_platforms_or_a_possible_tpu_change_nothing(tmp_path):
  assert absent_tpu.skip_absent_tpu({"JAX_PLATFORMS": "cpu"}) is False
  (tmp_path / "accel0").touch()
  assert absent_tpu.skip_absent_tpu({}, dev=str(tmp_path)) is False
