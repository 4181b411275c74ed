"""grpo_jax: reinforcement-learning post-training of language models in JAX."""

import pathlib

import setuptools

_HERE = pathlib.Path(__file__).parent


def _requirements():
  lines = (_HERE / "requirements.txt").read_text().splitlines()
  return [l.strip() for l in lines if l.strip() and not l.startswith("#")]


_TPU = "jax[tpu]"  # jax's own extra pins libtpu (and jaxlib) to the jax release it installs
# Optional integrations (docs/integrations.md): W&B logging, the math_verify reward, `datasets` files on disk.
_WANDB = ["wandb>=0.19"]
_MATH = ["math-verify[antlr4_13_2]>=0.9,<0.10"]  # the agreement table in the docs is of 0.9
_HF = ["datasets>=3", "pyarrow>=15"]

setuptools.setup(
    name="grpo_jax",
    version="0.1.0",
    description="GRPO, PPO and Flow-GRPO post-training of language models in JAX/Flax.",
    long_description=(_HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["grpo_jax", "grpo_jax.*", "experiments", "experiments.*"]),
    package_data={"experiments": ["configs/*.cfg"]},
    install_requires=_requirements(),
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.5",  # pytest.ini runs the suite on one worker per core
            "rlax>=0.1.6",  # oracle for GAE parity
            "torch==2.13.0",  # CPU wheel; oracle for model-logit parity
            "peft>=0.17",  # oracle: PEFT loads the exported LoRA adapters (tests/grpo_jax/models/test_lora.py)
            "trl>=1.16",  # oracle: TRL's GRPOTrainer losses (tests/grpo_jax/losses/test_grpo_trl_parity.py)
            _TPU,  # the TPU compiler: tests compile for TPU topologies ahead of time (no TPU needed)
            *_WANDB, *_MATH, *_HF,  # the integrations' tests run too (datasets writes the files they read)
        ],
        "wandb": _WANDB,
        "math": _MATH,
        "hf": _HF,
        # libtpu at the installed jax's version: run on TPUs, or compile for them on any machine
        # (scripts/aot_compile.py).
        "tpu": [_TPU],
        # The PyTorch peers of scripts/bench_vs_torch.py (issue #16): HF generate and TRL's GRPOTrainer.
        "bench": ["torch==2.13.0", "transformers>=5", "trl>=1.16", "datasets", "accelerate"],
    },
)
