"""Learned reward models for GRPO: outcome (ORM) and process (PRM) reward models on the policy backbone.

  from grpo_jax import reward_models as rm
  params = rm.init_reward_params(policy_params, config, key)            # backbone copied, fresh head
  s = rm.outcome_scores(params, config, tokens, mask)                   # [N] logits, σ(s) = P(correct)
  s = rm.outcome_logits(params, config, tokens, mask, ends, step_mask, starts, kind="orm_steps")  # + α·loglik
  s = rm.step_scores(params, config, tokens, mask, step_ends, step_mask) # [N, K] logits (PRM, orm_steps)
  rm.save_reward_model(params, config, out_dir, kind="prm"); rm.load_reward_model(out_dir)
  params, config = rm.adapters.add(params, config, key, rank=8)        # LoRA on the backbone: its likelihood trains

DeepSeekMath §4.1.2-4.1.4 (arXiv 2402.03300); step labels as in Math-Shepherd (arXiv 2312.08935).
"""

from grpo_jax.reward_models import adapters
from grpo_jax.reward_models.collect import STEP_LABELS, label_samples, sample_reward_data
from grpo_jax.reward_models.data import (RewardData, build_reward_data, concat, exact_step_labels,
                                         monte_carlo_step_labels, outcome_labels, problem_id, take)
from grpo_jax.reward_models.io import (HEAD_FILE, ROWS_FILE, load_reward_model, load_training_rows, read_reward_model,
                                       save_reward_model, save_training_rows)
from grpo_jax.reward_models.metrics import binary_accuracy, binary_auc, group_auc
from grpo_jax.reward_models.model import (KINDS, OUTCOME_KINDS, SCORES, STEP_KINDS, completion_loglik,
                                          init_reward_params, last_token_index, outcome_logits, outcome_scores,
                                          score_of, step_scores, token_scores)
from grpo_jax.reward_models.positions import sample_segment_ends, segment_token_ends
from grpo_jax.reward_models.monte_carlo import policy_rollout
from grpo_jax.reward_models.train import (LOSSES, batch_indices, completion_logliks, evaluate, fit,
                                          frozen_backbone_optimizer, make_reward_train_step, noisy_and_from_steps,
                                          outcome_from_steps, reward_objective, score)

__all__ = (
    "HEAD_FILE",
    "KINDS",
    "LOSSES",
    "OUTCOME_KINDS",
    "ROWS_FILE",
    "RewardData",
    "SCORES",
    "STEP_KINDS",
    "STEP_LABELS",
    "adapters",
    "batch_indices",
    "binary_accuracy",
    "binary_auc",
    "build_reward_data",
    "completion_loglik",
    "completion_logliks",
    "concat",
    "evaluate",
    "exact_step_labels",
    "fit",
    "frozen_backbone_optimizer",
    "group_auc",
    "init_reward_params",
    "label_samples",
    "last_token_index",
    "load_reward_model",
    "load_training_rows",
    "make_reward_train_step",
    "monte_carlo_step_labels",
    "noisy_and_from_steps",
    "outcome_from_steps",
    "outcome_labels",
    "outcome_logits",
    "outcome_scores",
    "policy_rollout",
    "problem_id",
    "read_reward_model",
    "reward_objective",
    "sample_segment_ends",
    "sample_reward_data",
    "save_reward_model",
    "save_training_rows",
    "score",
    "score_of",
    "segment_token_ends",
    "step_scores",
    "take",
    "token_scores",
)
