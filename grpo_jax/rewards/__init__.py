"""Final-answer parsing and rule-based rewards."""

from grpo_jax.data.answer import (answer_key, answers_equal, extract_answer, extract_boxed,
                                  normalize_answer, parse_number)
from grpo_jax.rewards.rule import (REWARD_NAMES, REWARDS, VERIFIED, RewardFn, get_reward_fn,
                                   has_final_answer_format, make_reward_fn, parse_reward_spec, score)

__all__ = [
    "REWARD_NAMES", "REWARDS", "RewardFn", "VERIFIED", "answer_key", "answers_equal", "extract_answer",
    "extract_boxed", "get_reward_fn", "has_final_answer_format", "make_reward_fn", "normalize_answer",
    "parse_number", "parse_reward_spec", "score",
]
