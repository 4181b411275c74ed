"""The run's typed config (`experiments/runner/config.py`): defaults, resolution, flat records, checks."""

import dataclasses

import pytest

from experiments.runner import config as config_lib
from grpo_jax import losses
from grpo_jax import models
from grpo_jax import partitioning


def test_defaults_are_the_embedded_run_and_resolve_by_method():
  config = config_lib.Config()
  assert config.rollout.group_size == 8 and config.rows_per_step == 32 * 8
  assert config_lib.Config(algorithm=config_lib.AlgorithmConfig(algo="ppo")).rollout.group_size == 1
  iterative = config_lib.Config().replace(reward="orm", reward_model="rm", iterations=3, steps_per_iteration=7)
  assert iterative.optim.steps == 21  # I x M policy steps


def test_replace_flat_and_from_flat_round_trip():
  config = config_lib.Config().replace(steps=12, beta=0.0, seed=4, mesh="data:2")
  assert (config.optim.steps, config.algorithm.beta, config.run.seed, config.mesh.mesh) == (12, 0.0, 4, "data:2")
  flat = config.flat()
  assert len(flat) == sum(len(dataclasses.fields(c)) for c in config_lib.SECTIONS.values())  # names are unique
  assert config_lib.from_flat(flat) == config
  with pytest.raises(config_lib.ConfigError, match="unknown config fields: nope"):
    config_lib.from_flat({"nope": 1})
  with pytest.raises(KeyError):
    config_lib.Config().replace(nope=1)


@pytest.mark.parametrize("fields,message", [
    ({"group_size": 1}, "--group_size must be >= 2"),
    ({"algo": "ppo", "group_size": 1, "batch_size": 0}, "--batch_size must be >= 1"),
    ({"epsilon": 0.0}, "--epsilon must be > 0"),
    ({"minibatch_size": 7}, "--minibatch_size (0: batch_size*group_size) must divide"),
    ({"tiny_hidden_size": 36}, "--tiny_hidden_size must be a positive multiple of 8"),
    ({"top_p": 1.5}, "--top_p must be in (0, 1]"),
    ({"loss_aggregation": "sum"}, "--loss_aggregation must be one of"),
    ({"supervision": "process"}, "--supervision=process needs --reward=prm"),
    ({"algo": "dpo", "batch_size": 3, "group_size": 3}, "--algo=dpo needs an even"),
    ({"algo": "flow_grpo", "dynamic_sampling": True}, "--dynamic_sampling is a GRPO option that Flow-GRPO"),
    ({"advantage_estimator": "rloo", "algo": "ppo"}, "--advantage_estimator=rloo replaces GRPO's"),
    ({"forward_rows": 12}, "--forward_rows must be a multiple of --group_size"),
    ({"forward_memory_budget": -1.0}, "--forward_memory_budget must be >= 0"),
    ({"attention": "flash"}, "--attention must be one of auto, einsum, xla, cudnn, pallas"),
    ({"rollout_correction": "tis"}, "--rollout_correction must be one of none, token_tis, seq_tis, token_mis"),
    ({"rollout_correction_upper": 0.9}, "--rollout_correction_upper must be >= 1"),
    ({"rollout_correction_lower": 1.5}, "--rollout_correction_lower must be in [0, 1]"),
    ({"rollout_correction": "seq_mis", "algo": "online_rft"}, "--rollout_correction=seq_mis weights GRPO's and PPO's"),
])
def test_bad_values_are_one_line_naming_the_flag(fields, message):
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.Config().replace(**fields)
  assert message in str(info.value) and "\n" not in str(info.value)


def test_choices_are_the_librarys():
  choices = config_lib.CHOICES
  assert set(choices["loss_aggregation"]) == set(losses.aggregation.MODES)
  assert set(choices["remat_policy"]) == set(models.config.REMAT_POLICIES)
  assert set(choices["sharding_rules"]) == set(partitioning.RULES)
  assert choices["attention"] == models.attention.CHOICES
  assert config_lib.TINY_HEADS == models.tiny_config().num_attention_heads
  assert choices["rollout_correction"] == ("none", *losses.rollout_correction.CORRECTIONS)


def test_may_change_fields_exist():
  assert config_lib.MAY_CHANGE <= set(config_lib.Config().flat())


@pytest.mark.parametrize("fields,message", [
    ({"loss": "ppo"}, "--loss must be one of clip, cispo, sapo, not 'ppo'"),
    ({"loss": "sapo", "sapo_tau_neg": 0.0}, "--sapo_tau_neg must be > 0"),
    ({"entropy_coef": -0.01}, "--entropy_coef must be >= 0"),
    ({"top_entropy_quantile": 0.0}, "--top_entropy_quantile must be in (0, 1]"),
    ({"top_entropy_quantile": 1.2}, "--top_entropy_quantile must be in (0, 1]"),
    ({"algo": "ppo", "loss": "cispo"}, "--loss=cispo: GRPO's objective only; use --algo=grpo"),
    ({"algo": "online_rft", "entropy_coef": 0.01, "top_entropy_quantile": 0.2},
     "--entropy_coef, --top_entropy_quantile: GRPO's objective only"),
    ({"loss": "cispo", "dual_clip": 3.0}, "--dual_clip is the clip loss's"),
    ({"loss": "sapo", "epsilon_high": 0.28}, "--epsilon_high means nothing to --loss=sapo"),
    ({"sapo_tau_pos": 2.0}, "--sapo_tau_pos and --sapo_tau_neg are SAPO's temperatures: they need --loss=sapo"),
])
def test_policy_loss_flags_are_checked(fields, message):
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.Config().replace(**fields)
  assert message in str(info.value) and "\n" not in str(info.value)


def test_policy_loss_choices_are_the_librarys():
  assert config_lib.CHOICES["loss"] == losses.grpo.POLICY_LOSSES
  config = config_lib.Config().replace(loss="sapo", sapo_tau_pos=0.5, sapo_tau_neg=2.0, entropy_coef=0.01,
                                       top_entropy_quantile=0.2)
  assert config.algorithm.loss == "sapo" and config.algorithm.top_entropy_quantile == 0.2
