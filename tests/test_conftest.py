"""The suite's own set-up (tests/conftest.py): what its processes inherit."""

import os
import subprocess
import sys

from tests.conftest import HANG_GUARD_S


def test_the_suite_writes_the_bytecode_of_what_it_imports():
  """The README installs with `pip install --no-compile`: the suite's processes must write .pyc as they import,
  even where the machine sets PYTHONDONTWRITEBYTECODE, or each of them compiles jax and torch from source."""
  assert not sys.dont_write_bytecode
  assert "PYTHONDONTWRITEBYTECODE" not in os.environ
  # A child process the suite starts (a runner subprocess, a worker) inherits it.
  child = subprocess.run([sys.executable, "-c", "import sys; print(sys.dont_write_bytecode)"], capture_output=True,
                         text=True, check=True, timeout=HANG_GUARD_S)
  assert child.stdout.strip() == "False"
