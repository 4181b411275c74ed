"""Shared test configuration and fixtures."""

import functools

import jax
import pytest

# Full-precision float32 matmuls, so parity tests compare the math and not the backend's defaults.
jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture(params=["eager", "jit"])
def variant(request):
  """Runs a function eagerly or under `jax.jit`; keyword arguments are bound statically.

  Usage: `variant(losses.gae, gamma=0.9)(rewards, values, mask)`.
  """

  def wrap(fn, **static):
    bound = functools.partial(fn, **static)
    return jax.jit(bound) if request.param == "jit" else bound

  return wrap
