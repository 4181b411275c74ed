"""Pure-functional RL losses for language models: arrays in, arrays out.

  from grpo_jax import losses
  adv = losses.group_advantages(rewards)                  # [P, G]
  loss, metrics = losses.grpo_loss(logp, old_logp, ref_logp, adv.reshape(-1), mask,
                                   epsilon=0.2, beta=0.04)

Every function is jit- and vmap-compatible, checks shapes first, and computes in float32.
"""

from grpo_jax.losses.advantages import group_advantages
from grpo_jax.losses.advantages import process_advantages
from grpo_jax.losses.advantages import reinforce_pp_advantages
from grpo_jax.losses.advantages import rloo_advantages
from grpo_jax.losses.advantages import whiten
from grpo_jax.losses.aggregation import aggregate
from grpo_jax.losses.aggregation import aggregation_weights
from grpo_jax.losses.aggregation import masked_mean
from grpo_jax.losses.cispo import cispo_surrogate
from grpo_jax.losses.cispo import cispo_truncation
from grpo_jax.losses.distill import distill_loss
from grpo_jax.losses.distill import reverse_kl_rewards
from grpo_jax.losses.dpo import dpo_loss
from grpo_jax.losses.entropy import entropy_bonus
from grpo_jax.losses.entropy_mask import top_entropy_mask
from grpo_jax.losses.flow_grpo import broadcast_outcome_advantages
from grpo_jax.losses.flow_grpo import flow_grpo_loss
from grpo_jax.losses.flow_grpo import flow_grpo_weights
from grpo_jax.losses.gae import discounted_returns
from grpo_jax.losses.gae import gae
from grpo_jax.losses.grpo import grpo_loss
from grpo_jax.losses.kl import exact_kl
from grpo_jax.losses.kl import kl_divergence
from grpo_jax.losses.paradigm import dpo_coefficient
from grpo_jax.losses.paradigm import grpo_coefficient
from grpo_jax.losses.paradigm import online_rft_coefficient
from grpo_jax.losses.paradigm import paradigm_loss
from grpo_jax.losses.paradigm import ppo_coefficient
from grpo_jax.losses.paradigm import rft_coefficient
from grpo_jax.losses.paradigm import sft_coefficient
from grpo_jax.losses.ppo import kl_penalized_rewards
from grpo_jax.losses.ppo import last_token_mask
from grpo_jax.losses.ppo import ppo_loss
from grpo_jax.losses.reward import noisy_and_logits
from grpo_jax.losses.reward import noisy_and_outcome_loss
from grpo_jax.losses.reward import outcome_bce_loss
from grpo_jax.losses.reward import pairwise_reward_loss
from grpo_jax.losses.reward import step_bce_loss
from grpo_jax.losses.reward import within_problem_pairwise_loss
from grpo_jax.losses.rollout_correction import masked_is_weights
from grpo_jax.losses.rollout_correction import mismatch_metrics
from grpo_jax.losses.rollout_correction import rollout_correction_weights
from grpo_jax.losses.rollout_correction import truncated_is_weights
from grpo_jax.losses.rollout_correction import weight_metrics
from grpo_jax.losses.sapo import sapo_gate
from grpo_jax.losses.sapo import sapo_gradient_scale
from grpo_jax.losses.sapo import sapo_surrogate
from grpo_jax.losses.shaping import overlong_penalty
from grpo_jax.losses.surrogate import clip_fractions
from grpo_jax.losses.surrogate import clipped_surrogate
from grpo_jax.losses.surrogate import log_importance_ratios
from grpo_jax.losses.value import value_loss

__all__ = (
    "aggregate",
    "aggregation_weights",
    "broadcast_outcome_advantages",
    "cispo_surrogate",
    "cispo_truncation",
    "clip_fractions",
    "clipped_surrogate",
    "discounted_returns",
    "distill_loss",
    "dpo_coefficient",
    "dpo_loss",
    "entropy_bonus",
    "exact_kl",
    "flow_grpo_loss",
    "flow_grpo_weights",
    "gae",
    "group_advantages",
    "grpo_coefficient",
    "grpo_loss",
    "kl_divergence",
    "kl_penalized_rewards",
    "last_token_mask",
    "log_importance_ratios",
    "masked_is_weights",
    "masked_mean",
    "mismatch_metrics",
    "noisy_and_logits",
    "noisy_and_outcome_loss",
    "online_rft_coefficient",
    "outcome_bce_loss",
    "overlong_penalty",
    "pairwise_reward_loss",
    "paradigm_loss",
    "ppo_coefficient",
    "ppo_loss",
    "process_advantages",
    "reinforce_pp_advantages",
    "reverse_kl_rewards",
    "rft_coefficient",
    "rloo_advantages",
    "rollout_correction_weights",
    "sapo_gate",
    "sapo_gradient_scale",
    "sapo_surrogate",
    "sft_coefficient",
    "step_bce_loss",
    "top_entropy_mask",
    "truncated_is_weights",
    "value_loss",
    "weight_metrics",
    "whiten",
    "within_problem_pairwise_loss",
)
