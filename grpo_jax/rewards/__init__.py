"""Final-answer parsing and rule-based rewards."""

from grpo_jax.data.answer import (answer_key, answers_equal, extract_answer, extract_boxed,
                                  normalize_answer, parse_number)
from grpo_jax.rewards.rule import (REWARDS, RewardFn, get_reward_fn, has_final_answer_format,
                                   make_reward_fn, score)

__all__ = [
    "REWARDS", "RewardFn", "answer_key", "answers_equal", "extract_answer", "extract_boxed",
    "get_reward_fn", "has_final_answer_format", "make_reward_fn", "normalize_answer",
    "parse_number", "score",
]
