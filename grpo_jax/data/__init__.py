"""Tasks: the shared `Example`, final-answer parsing, the synthetic arithmetic task, GSM8K and MATH."""

from grpo_jax.data.datasets import (DatasetError, load_gsm8k, load_hf_dataset, load_math,
                                    load_task)
from grpo_jax.data.example import Example
from grpo_jax.data.steps import (Step, check_steps, parse_step, split_steps, step_end_offsets,
                                 step_spans)
from grpo_jax.data.synthetic import SyntheticConfig, format_prompt, make_splits, stream

__all__ = [
    "DatasetError", "Example", "Step", "SyntheticConfig", "check_steps", "format_prompt",
    "load_gsm8k", "load_hf_dataset", "load_math", "load_task", "make_splits", "parse_step",
    "split_steps", "step_end_offsets", "step_spans", "stream",
]
