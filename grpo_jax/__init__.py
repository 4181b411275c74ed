"""grpo_jax: reinforcement-learning post-training of language models in JAX/Flax."""

from grpo_jax import absent_tpu as _absent_tpu

__version__ = "0.1.0"

_absent_tpu.skip_absent_tpu()  # a machine without a TPU: JAX does not start libtpu (and print its errors)
