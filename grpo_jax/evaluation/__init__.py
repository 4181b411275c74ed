"""Evaluation: batched generation and metrics (pass@k, maj@k, format rate) of sampled completions."""

from grpo_jax.evaluation.generate import decode, generate
from grpo_jax.evaluation.metrics import (format_rate, maj_at_k, majority_vote, mean_length, pass_at_k,
                                         summarize)

__all__ = ["decode", "format_rate", "generate", "maj_at_k", "majority_vote", "mean_length", "pass_at_k",
           "summarize"]
