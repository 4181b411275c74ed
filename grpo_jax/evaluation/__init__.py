"""Evaluation metrics for sampled completions."""

from grpo_jax.evaluation.metrics import (format_rate, maj_at_k, majority_vote, mean_length,
                                         pass_at_k, summarize)

__all__ = ["format_rate", "maj_at_k", "majority_vote", "mean_length", "pass_at_k", "summarize"]
