"""The run's typed config (`experiments/runner/config.py`): defaults, resolution, flat records, checks."""

import dataclasses
import re

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
    # Numbers as numbers: NaN passes every comparison, inf overflows what it sizes (issue 55).
    ({"lora_rank": 4, "lora_alpha": float("nan")}, "--lora_alpha must be a finite number, not nan"),
    ({"math_verify_time_limit": float("inf")}, "--math_verify_time_limit must be a finite number, not inf"),
    ({"forward_memory_budget": float("nan")}, "--forward_memory_budget must be a finite number, not nan"),
    ({"forward_memory_budget": float("inf")}, "--forward_memory_budget must be a finite number, not inf"),
    ({"forward_memory_budget": 1e300}, "--forward_memory_budget must be at most 1048576 GiB"),
    ({"math_verify_time_limit": 1e12}, "--math_verify_time_limit must be in (0, 86400] seconds"),
    ({"tool_time_limit": 0.0}, "--tool_time_limit must be in (0, 86400] seconds"),
    ({"learning_rate": float("-inf")}, "--learning_rate must be a finite number, not -inf"),
    ({"lora_rank": 10**12}, "--lora_rank=1000000000000 exceeds the embedded model's width (--tiny_hidden_size=128)"),
    ({"lora_rank": 33, "tiny_hidden_size": 32}, "--lora_rank=33 exceeds the embedded model's width"),
    ({"dynamic_sampling": True, "algo": "online_rft"}, "--dynamic_sampling is read only by --algo=grpo; "
                                                       "--algo=online_rft does not use it"),
    ({"process_center_tokens": True}, "--process_center_tokens centres process advantages: it needs"),
    ({"num_train": 10**12}, "--num_train + --num_test of the synthetic task must be at most 10,000,000"),
])
def test_bad_values_are_one_line_naming_the_flag(fields, message):
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.Config().replace(**fields)
  assert message in str(info.value) and "\n" not in str(info.value)


def test_choices_are_the_librarys():
  choices = config_lib.CHOICES
  assert set(choices["loss_aggregation"]) == set(losses.aggregation.MODES)
  assert set(choices["remat_policy"]) == set(models.config.REMAT_POLICIES)
  assert choices["decode_projections"] == models.DECODE_PROJECTIONS
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
def test_every_float_field_is_checked_finite():
  for name, value in config_lib.Config().flat().items():
    if isinstance(value, float) or name in ("epsilon_high", "dual_clip", "value_learning_rate"):
      with pytest.raises(config_lib.ConfigError, match=rf"^--{name} must be a finite number, not nan$"):
        config_lib.Config().replace(**{name: float("nan")})


def test_lora_rank_up_to_the_width_is_accepted():
  assert config_lib.Config().replace(lora_rank=128).model.lora_rank == 128
  assert config_lib.Config().replace(lora_rank=4096, model="some/hf/dir").model.lora_rank == 4096  # checked on load


# A value other than the default for each option that only some methods read.
_OTHER_VALUE = {
    "dynamic_sampling": True, "dynamic_sampling_max_rounds": 2, "importance": "sequence",
    "shared_prompt_forward": False, "advantage_scale": "none", "advantage_eps": 1e-3, "process_center_tokens": True,
    "recompute_old_logprobs": True, "mask_truncated": True, "overlong_buffer": 4, "completion_pad_multiple": 8,
    "beta": 0.1, "epsilon": 0.3, "epsilon_high": 0.28, "dual_clip": 3.0, "kl": "k1", "loss_aggregation": "token-mean",
    "gamma": 0.9, "gae_lambda": 0.9, "value_learning_rate": 1e-4, "value_clip": 0.1, "value_coef": 0.5,
    "whiten_advantages": False, "value_init": "some/dir", "dpo_beta": 0.2, "dpo_nll_coef": 1.0,
    "dpo_pairs_per_prompt": 2, "offline_prompts": 64, "max_turns": 2, "memory_budget": 30, "planner_prompt_len": 60,
    "action_tokens": 10, "tools": "calc", "tool_time_limit": 2.0, "tool_header": True, "answer_from_memory": False,
    "min_bucket": 4, "planner_objective": "trajectory_grpo", "temperature": 1.0, "top_p": 0.9, "top_k": 5,
    "sampler": "static", "num_slots": 4,
    "completion_widths": "doubling", "token_layout": "buckets",
}


@pytest.mark.parametrize("name", sorted(config_lib.READ_BY))
def test_an_option_a_method_does_not_read_is_refused_for_that_method(name):
  """Issue 55: `--dynamic_sampling --algo=online_rft` ran plain Online RFT without a word. Every method refuses
  the options it does not read (at a value other than the default), in one line naming the option."""
  value = _OTHER_VALUE[name]
  assert value != config_lib.default(name)
  for algo in config_lib.CHOICES["algo"]:
    fields = {name: value, "algo": algo, "group_size": 2} | (
        {"teacher_checkpoint": "some/teacher"} if algo == "distill" else {})
    if algo in config_lib.READ_BY[name] or (algo == "flow_grpo" and name in config_lib.FLOW_UNSUPPORTED):
      try:
        config_lib.Config().replace(**fields)
      except config_lib.ConfigError as err:  # refused for another reason (e.g. GRPO+PS is GRPO's), not this one
        assert "is read only by" not in str(err), (algo, err)
      continue
    with pytest.raises(config_lib.ConfigError) as info:
      config_lib.Config().replace(**fields)
    if "is read only by" in str(info.value):
      assert str(info.value) == (f"--{name} is read only by --algo={'|'.join(config_lib.READ_BY[name])}; "
                                 f"--algo={algo} does not use it: leave it at its default")
    elif algo == "distill":  # distillation's own line for the reward options it refuses
      assert str(info.value).startswith(f"--{name}: --algo=distill learns from its teacher"), info.value
    else:  # Flow-GRPO's own line for the GRPO options it refuses
      assert str(info.value).startswith(f"--{name} is a GRPO option that Flow-GRPO does not use"), info.value


def test_read_by_names_methods_and_fields():
  fields = set(config_lib.Config().flat())
  for name, readers in config_lib.READ_BY.items():
    assert name in fields and set(readers) <= set(config_lib.CHOICES["algo"]), name


@pytest.mark.parametrize("fields, needs", [
    ({"dynamic_sampling_max_rounds": 2}, "--dynamic_sampling"),
    ({"remat_policy": "dots"}, "--remat"),
    ({"eval_temperature": 1.0}, "--eval_samples > 0"),
    ({"lora_alpha": 8.0}, "--lora_rank > 0"),
    ({"lora_targets": "q,v"}, "--lora_rank > 0"),
    ({"math_verify_time_limit": 5.0}, "--reward=math_verify:..."),
    ({"math_verify_workers": 2}, "--reward=math_verify:..."),
    ({"bucket_micro_batches": 4}, "--token_layout=buckets"),
    ({"bucket_widths": 4}, "--token_layout=buckets"),
    ({"completion_widths": "doubling", "token_layout": "buckets"}, "--token_layout=padded"),
])
def test_an_option_without_its_feature_is_refused(fields, needs):
  """Issue 55's sweep: options that only matter when another turns their feature on did nothing without it."""
  name = next(iter(fields))
  with pytest.raises(config_lib.ConfigError, match=rf"^--{name} is read only with {re.escape(needs)}; leave it"):
    config_lib.Config().replace(**fields)
  on = {"--dynamic_sampling": {"dynamic_sampling": True}, "--remat": {"remat": True},
        "--eval_samples > 0": {"eval_samples": 4}, "--lora_rank > 0": {"lora_rank": 4},
        "--reward=math_verify:...": {"reward": "math_verify:1.0"}, "--token_layout=buckets": {"token_layout": "buckets"},
        "--token_layout=padded": {"token_layout": "padded"}}[needs]
  config_lib.Config().replace(**fields | on)  # with it: accepted


# One problem from each section of `check`, in its order; each pair of neighbours is also checked together.
_ONE_PROBLEM_PER_SECTION = (
    ({"batch_size": 0}, "--batch_size must be >= 1"),  # each field
    ({"top_p": 1.5}, "--top_p must be in (0, 1]"),  # ranges
    ({"tool_time_limit": 0.0}, "--tool_time_limit must be in (0, 86400] seconds"),  # limits
    ({"wandb_entity": "me"}, "--wandb_mode, --wandb_entity and --wandb_run_name need --wandb_project"),  # W&B
    ({"forward_rows": 12}, "--forward_rows must be a multiple of --group_size"),  # sizes
    ({"tiny_hidden_size": 36}, "--tiny_hidden_size must be a positive multiple of 8"),  # model
    ({"paths_min_steps": 1}, "--paths_min_steps and --paths_max_steps need 2 <= min <= max"),  # reward
    ({"algo": "ppo", "advantage_estimator": "rloo"}, "--advantage_estimator=rloo replaces GRPO's"),  # methods' options
    ({"algo": "ppo", "loss": "sapo"}, "--loss=sapo: GRPO's objective only"),  # policy loss
    ({"algo": "dpo", "teacher_checkpoint": "DIR"}, "--algo=distill and --teacher_checkpoint=DIR"),  # distill
    ({"algo": "dpo", "batch_size": 3, "group_size": 3}, "--algo=dpo needs an even"),  # DPO and Flow-GRPO
    ({"dynamic_sampling": True, "algo": "dpo"}, "--dynamic_sampling is read only by --algo=grpo"),  # unread
)


@pytest.mark.parametrize("earlier,later", list(zip(_ONE_PROBLEM_PER_SECTION, _ONE_PROBLEM_PER_SECTION[1:])))
def test_the_first_problem_in_check_order_is_reported(earlier, later):
  """A user sees the first problem: `check`'s sections keep their order (a config wrong twice names the same flag)."""
  for fields, message in (earlier, later):  # each alone is refused with its own line
    with pytest.raises(config_lib.ConfigError, match=re.escape(message)):
      config_lib.Config().replace(**fields)
  with pytest.raises(config_lib.ConfigError, match=re.escape(earlier[1])):
    config_lib.Config().replace(**later[0] | earlier[0])
