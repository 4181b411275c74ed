"""Test configuration: float32 matmuls at full precision so parity tests are meaningful."""

import jax

jax.config.update("jax_default_matmul_precision", "highest")
