"""The run's configuration: frozen dataclasses, one per concern, built from flags once in `main()`.

Every field has the name of its command-line flag, so a flagfile and a Python config say the same thing:

  config = runner.Config(optim=runner.OptimConfig(steps=50), rollout=runner.RolloutConfig(batch_size=16))
  summary = runner.run(config)            # == python -m experiments.grpo_math --steps=50 --batch_size=16

`Config()` is the embedded default run (`experiments/configs/cpu_default.cfg`); the runners' flags take their
defaults from these fields. Everything below the entry modules takes a `Config` (or one of its sections) and
never reads a flag. `Config.flat()` is the flag-name -> value dict a checkpoint records and `--resume` compares.
"""

import dataclasses
import math
import re
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The policy: an HF checkpoint, or the embedded tiny model built and warm-started by SFT."""
  model: str = ""  # HF checkpoint directory; empty: the embedded tiny model
  init_checkpoint: str = ""  # HF directory of the starting policy (skips SFT)
  tiny_layers: int = 4
  tiny_hidden_size: int = 128
  dtype: str = "float32"
  remat: bool = False
  remat_policy: str = "full"
  scan_layers: bool = False
  logprob_chunk: int = 128
  attention: str = "auto"  # multi-token attention (grpo_jax.models.attention); auto: by the backend
  lora_rank: int = 0  # > 0: train LoRA adapters of this rank on lora_targets, the base frozen (docs/lora.md)
  lora_alpha: float = 16.0  # the adapters' scale is lora_alpha / lora_rank
  lora_targets: str = "q,k,v,o,gate,up,down"  # comma-separated projections (grpo_jax.models.LORA_TARGETS)
  lora_export_peft: bool = False  # also write the adapters in PEFT's format to <work_dir>/final_adapter


@dataclasses.dataclass(frozen=True)
class TaskConfig:
  """Problems, prompt format and the rule reward."""
  task: str = "synthetic"
  train_file: str = ""
  test_file: str = ""
  num_train: int = 20000
  num_test: int = 500
  synthetic_min_steps: int = 2
  synthetic_max_steps: int = 3
  synthetic_digits: int = 1
  synthetic_ops: str = "+-*"
  prompt_template: str = "auto"
  max_prompt_len: int = 16
  reward: str = "correctness:1.0"
  math_verify_time_limit: float = 2.0  # --reward=math_verify: seconds a check may take before its worker is killed
  math_verify_workers: int = 0  # --reward=math_verify: worker processes (0: half the cores, 1 to 8)
  sft_examples: int = 2000
  # > 0: num_validation problems of the RL pool, drawn by the seed, are held out of training, and the run's end
  # evaluates the policy on them too (summary "final_val_accuracy"): a split for choosing hyperparameters, not test
  num_validation: int = 0


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """Stage 1, the warm start of the embedded model on worked solutions."""
  sft_steps: int = 600
  sft_batch_size: int = 32
  sft_learning_rate: float = 3e-3


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Sampling the policy: B prompts x G completions per step."""
  batch_size: int = 32
  group_size: int | None = None  # None: 8, and 1 for PPO (resolved by `Config`)
  max_new_tokens: int = 40
  temperature: float = 0.7
  top_p: float = 1.0
  top_k: int = 0
  dynamic_sampling: bool = False
  dynamic_sampling_max_rounds: int = 4
  overlong_buffer: int = 0
  mask_truncated: bool = False
  # The training batch's completion columns: the step's longest completion rounded up to a multiple of this (0: all
  # max_new_tokens). Each new width compiles the scoring and update programs once.
  completion_pad_multiple: int = 4
  # "multiple": the longest completion rounded up to a multiple of completion_pad_multiple; "doubling": to the
  # smallest completion_pad_multiple * 2^k that holds it (a few compiled widths a run, at most 2x the columns).
  completion_widths: str = "multiple"
  # The training rows' layout in the π_ref / π_old forwards and the update (GRPO, distill): "padded" (every row cut
  # to the step's longest, as above) or "buckets" (`grpo_jax.length_buckets`: the rows sorted by length into
  # bucket_micro_batches micro-batches, each run at the narrowest of bucket_widths halving widths that holds it;
  # one program for every length).
  token_layout: str = "padded"
  bucket_micro_batches: int = 8
  bucket_widths: int = 4
  # The rollouts' and evaluation's sampler: "engine" (`grpo_jax.rollout_engine`, continuous batching over
  # num_slots decode slots; 0: `default_slots`, fewer where the forward memory budget would not hold them) or "static"
  # (`grpo_jax.sampling`, every row decoded until the longest ends). The same tokens for the same key.
  sampler: str = "engine"
  num_slots: int = 0


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
  """The stage-2 method and its loss (GRPO and its variants; PPO's critic; DPO; the offline data)."""
  algo: str = "grpo"
  beta: float = 0.04
  epsilon: float = 0.2
  epsilon_high: float | None = None
  dual_clip: float | None = None
  kl: str | None = None  # None: k3 in GRPO's loss, k1 in PPO's and REINFORCE++'s reward
  loss_aggregation: str = "seq-mean-token-mean"
  advantage_scale: str = "group"
  advantage_eps: float = 1e-4
  advantage_estimator: str = "group"
  importance: str = "token"
  loss: str = "clip"  # GRPO's policy term: PPO's clip, CISPO or SAPO (grpo_jax.losses.grpo_loss's policy_loss)
  sapo_tau_pos: float = 1.0
  sapo_tau_neg: float = 1.05
  entropy_coef: float = 0.0
  top_entropy_quantile: float = 1.0
  num_epochs: int = 1
  minibatch_size: int = 0
  grad_accum_steps: int = 1
  recompute_old_logprobs: bool = False
  # The rollout-trainer log-prob mismatch's correction (losses.rollout_correction): none, token_tis, seq_tis,
  # token_mis or seq_mis; TIS truncates the ratio at rollout_correction_upper, MIS keeps it in [lower, upper].
  rollout_correction: str = "none"
  rollout_correction_lower: float = 0.5
  rollout_correction_upper: float = 2.0
  shared_prompt_forward: bool = True
  gamma: float = 1.0
  gae_lambda: float = 0.95
  value_learning_rate: float | None = None
  value_clip: float = 0.2
  value_coef: float = 1.0
  whiten_advantages: bool = True
  value_init: str = "policy"
  dpo_beta: float = 0.1
  dpo_nll_coef: float = 0.0
  dpo_pairs_per_prompt: int = 1
  offline_prompts: int = 2048
  # The temperature of the likelihood the imitation methods (sft, rft, rft_table10, online_rft) train; GRPO and PPO
  # train the sampling distribution's, --temperature. Equal to --temperature: every method trains one likelihood.
  likelihood_temperature: float = 1.0
  teacher_checkpoint: str = ""  # --algo=distill: the frozen teacher, an HF directory with the policy's tokenizer


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """The stage-2 optimiser (AdamW) and the run's length."""
  steps: int = 200
  learning_rate: float = 3e-4
  lr_schedule: str = "cosine"
  warmup_steps: int = 5
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0


@dataclasses.dataclass(frozen=True)
class RewardModelConfig:
  """Learned rewards (GRPO+OS/PS with an ORM/PRM) and iterative RL (DeepSeekMath Algorithm 1)."""
  reward_model: str = ""
  supervision: str = "outcome"
  process_center_tokens: bool = False
  prm_max_steps: int = 8
  iterations: int = 1
  steps_per_iteration: int = 0
  replay_fraction: float = 0.1
  replay_capacity: int = 16384
  rm_update_prompts: int = 256
  rm_update_steps: int = 100
  rm_update_batch_size: int = 64
  rm_update_learning_rate: float = 1e-4


@dataclasses.dataclass(frozen=True)
class AgentConfig:
  """Flow-GRPO's agent (AgentFlow): turns, memory, tools, budgets."""
  max_turns: int = 4
  memory_budget: int = 56
  planner_prompt_len: int = 72
  action_tokens: int = 20
  tools: str = "calc,frac,recall"
  tool_time_limit: float = 1.0
  tool_header: bool = False
  answer_from_memory: bool = True
  min_bucket: int = 8


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Held-out evaluation: greedy accuracy, and maj@k / pass@k with `eval_samples` > 0."""
  eval_every: int = 100
  eval_batch_size: int = 250
  eval_samples: int = 0
  eval_temperature: float = 0.7


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Where the run writes, its checkpoints, and its seed."""
  work_dir: str = "runs/grpo_math"
  save_every: int = 50
  keep_checkpoints: int = 2
  resume: bool = False
  stop_after: int = 0
  tensorboard: bool = True
  wandb_project: str = ""  # empty: no W&B
  wandb_mode: str = ""  # online | offline | disabled; empty: W&B's default (WANDB_MODE, else online)
  wandb_entity: str = ""
  wandb_run_name: str = ""
  seed: int = 0
  compilation_cache_dir: str = "~/.cache/grpo_jax/xla"
  profile_steps: str = ""  # "FIRST:LAST": trace stage-2 steps FIRST to LAST into <work_dir>/profile


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Devices and processes: a mesh spec and its sharding rules; the multi-host coordinator."""
  mesh: str = ""
  sharding_rules: str = "fsdp"
  coordinator_address: str = ""
  num_processes: int | None = None
  process_id: int | None = None
  # One process on a CPU, no mesh: the CPU is presented as this many devices (0: one per core) and the sampler
  # splits its rows over them, while everything else runs on the first (`placement.Placement.from_config`).
  cpu_devices: int = 0
  # Forwards over a step's B·G rows (π_ref, π_old, reward model, values) and the sampler run in row chunks:
  # forward_rows at a time, or (0) as many as forward_memory_budget GiB per device hold (0: the backend's default).
  forward_rows: int = 0
  forward_memory_budget: float = 0.0


SECTIONS = {"model": ModelConfig, "task": TaskConfig, "sft": SFTConfig, "rollout": RolloutConfig,
            "algorithm": AlgorithmConfig, "optim": OptimConfig, "reward_model": RewardModelConfig,
            "agent": AgentConfig, "eval": EvalConfig, "run": RunConfig, "mesh": MeshConfig}

# The fields of these sections only change how long a run goes, what it evaluates and logs, or where it
# runs: `--resume` accepts other values (`resume.check`).
MAY_CHANGE = frozenset({
    "steps", "resume", "stop_after", "save_every", "keep_checkpoints", "work_dir", "tensorboard",
    "wandb_project", "wandb_mode", "wandb_entity", "wandb_run_name", "math_verify_workers",
    "compilation_cache_dir", "profile_steps",
    "eval_every", "eval_batch_size", "eval_samples", "eval_temperature",
    "mesh", "sharding_rules", "coordinator_address", "num_processes", "process_id", "cpu_devices",
    "forward_rows", "forward_memory_budget", "attention", "sampler", "num_slots",
    "lora_export_peft",
})


class ConfigError(ValueError):
  """A configuration that cannot run, named in one line."""


class RunError(Exception):
  """A problem with the run's inputs (files, directories, data), reported as one line."""


@dataclasses.dataclass(frozen=True)
class Config:
  """A whole run: the sections above. Unset method-dependent values are resolved on construction."""
  model: ModelConfig = ModelConfig()
  task: TaskConfig = TaskConfig()
  sft: SFTConfig = SFTConfig()
  rollout: RolloutConfig = RolloutConfig()
  algorithm: AlgorithmConfig = AlgorithmConfig()
  optim: OptimConfig = OptimConfig()
  reward_model: RewardModelConfig = RewardModelConfig()
  agent: AgentConfig = AgentConfig()
  eval: EvalConfig = EvalConfig()
  run: RunConfig = RunConfig()
  mesh: MeshConfig = MeshConfig()

  def __post_init__(self):
    if self.rollout.group_size is None:
      default = 1 if self.algorithm.algo == "ppo" else 8
      object.__setattr__(self, "rollout", dataclasses.replace(self.rollout, group_size=default))
    if self.reward_model.iterations > 1 and self.reward_model.steps_per_iteration >= 1:
      steps = self.reward_model.iterations * self.reward_model.steps_per_iteration
      object.__setattr__(self, "optim", dataclasses.replace(self.optim, steps=steps))
    problem = check(self)
    if problem:
      raise ConfigError(problem)

  def replace(self, **fields) -> "Config":
    """A copy with flat fields replaced by name: `config.replace(steps=10, seed=1)`."""
    sections = {name: {} for name in SECTIONS}
    for name, value in fields.items():
      sections[section_of(name)][name] = value
    return dataclasses.replace(self, **{name: dataclasses.replace(getattr(self, name), **values)
                                        for name, values in sections.items() if values})

  def flat(self) -> dict[str, Any]:
    """Every field by its flag name (the record a checkpoint keeps)."""
    return {f.name: getattr(getattr(self, section), f.name)
            for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}

  @property
  def rows_per_step(self) -> int:
    """Rows a step collects: B x G."""
    return self.rollout.batch_size * self.rollout.group_size


def section_of(name: str) -> str:
  """The section holding the field `name`."""
  for section, cls in SECTIONS.items():
    if any(f.name == name for f in dataclasses.fields(cls)):
      return section
  raise KeyError(f"no config field named {name!r}")


def from_flat(values: dict[str, Any], base: Config | None = None) -> Config:
  """A `Config` from flag-name -> value pairs (unknown names are an error); the rest from `base`."""
  base = base or Config()
  sections = {}
  for section, cls in SECTIONS.items():
    names = {f.name for f in dataclasses.fields(cls)}
    picked = {k: v for k, v in values.items() if k in names}
    sections[section] = dataclasses.replace(getattr(base, section), **picked)
  unknown = set(values) - {f.name for cls in SECTIONS.values() for f in dataclasses.fields(cls)}
  if unknown:
    raise ConfigError(f"unknown config fields: {', '.join(sorted(unknown))}")
  return Config(**sections)


def refuse_unread(config: Config, names, runner: str, instead: str = "") -> None:
  """Raises ConfigError naming the first of the shared flags `names`, which the entry module `runner` does not
  read, set to anything but its default (`instead`: what to use, e.g. "--rm_dir")."""
  base, now = Config(algorithm=AlgorithmConfig(algo=config.algorithm.algo)).flat(), config.flat()  # group_size's
  base["algo"] = default("algo")
  for name in names:
    if now[name] != base[name]:
      raise ConfigError(f"--{name}: {runner} does not read it{f' (use {instead})' if instead else ''}; leave it at its "
                        "default")


def default(name: str) -> Any:
  """The default of the field `name` (what the flag of that name defaults to)."""
  section = section_of(name)
  return next(f.default for f in dataclasses.fields(SECTIONS[section]) if f.name == name)


# VALIDATION: one line naming the field (by its flag name) and what it must be.

_POSITIVE = ("tiny_layers", "sft_batch_size", "num_train", "num_test", "max_prompt_len", "max_new_tokens",
             "batch_size", "num_epochs", "grad_accum_steps", "eval_batch_size", "keep_checkpoints",
             "dynamic_sampling_max_rounds", "dpo_pairs_per_prompt", "offline_prompts", "prm_max_steps",
             "iterations", "replay_capacity", "rm_update_prompts", "rm_update_steps", "rm_update_batch_size",
             "max_turns", "planner_prompt_len", "action_tokens", "min_bucket", "bucket_micro_batches", "bucket_widths")
_NON_NEGATIVE = ("cpu_devices", "steps", "sft_steps", "sft_examples", "eval_every", "save_every", "minibatch_size",
                 "overlong_buffer", "eval_samples", "stop_after", "top_k", "max_grad_norm", "advantage_eps",
                 "steps_per_iteration", "memory_budget", "beta", "completion_pad_multiple", "forward_rows",
                 "forward_memory_budget", "dpo_nll_coef", "num_slots", "num_validation")
CHOICES = {  # the allowed values of the enum fields (and flags)
    "dtype": ("float32", "bfloat16"), "remat_policy": ("full", "dots_no_batch", "dots"),
    "task": ("synthetic", "gsm8k", "math"), "prompt_template": ("auto", "plain", "chat"),
    "algo": ("grpo", "ppo", "online_rft", "rft", "rft_table10", "dpo", "sft", "flow_grpo", "distill"),
    "kl": (None, "k1", "k2", "k3"),
    "loss_aggregation": ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum"),
    "advantage_scale": ("group", "batch", "none"), "advantage_estimator": ("group", "rloo", "reinforce_pp"),
    "importance": ("token", "sequence"), "loss": ("clip", "cispo", "sapo"), "lr_schedule": ("constant", "cosine"),
    "rollout_correction": ("none", "token_tis", "seq_tis", "token_mis", "seq_mis"),
    "supervision": ("outcome", "process"), "sharding_rules": ("dp", "fsdp", "fsdp_tp"),
    "attention": ("auto", "einsum", "xla", "cudnn", "pallas"), "sampler": ("engine", "static"),
    "completion_widths": ("multiple", "doubling"), "token_layout": ("padded", "buckets"),
}
STEP_REWARDS = ("prm", "exact_steps")  # the `reward` values that score every step
TINY_HEADS = 4  # attention heads of the embedded tiny model (`grpo_jax.models.tiny_config`)
# GRPO knobs that mean nothing for Flow-GRPO's per-turn objective (eq. 5): refused unless at their defaults.
FLOW_UNSUPPORTED = ("loss_aggregation", "importance", "dynamic_sampling", "overlong_buffer", "mask_truncated",
                    "completion_pad_multiple", "eval_samples", "reward_model", "supervision", "iterations",
                    "steps_per_iteration", "advantage_estimator")


# Options that only some methods read (beyond FLOW_UNSUPPORTED): any other method refuses them unless at their
# defaults, so a flag never silently does nothing.
READ_BY = {
    "dynamic_sampling": ("grpo",), "dynamic_sampling_max_rounds": ("grpo",), "importance": ("grpo",),
    "shared_prompt_forward": ("grpo",), "advantage_scale": ("grpo", "flow_grpo"), "token_layout": ("grpo", "distill"),
    "advantage_eps": ("grpo", "flow_grpo"), "process_center_tokens": ("grpo",),
    "recompute_old_logprobs": ("grpo", "ppo", "distill"), "mask_truncated": ("grpo", "ppo", "distill"),
    "overlong_buffer": ("grpo", "ppo"),
    **{name: ("grpo", "ppo", "online_rft", "rft_table10", "distill")
       for name in ("completion_pad_multiple", "completion_widths")},
    **{name: ("grpo", "ppo", "flow_grpo") for name in ("beta", "dual_clip", "kl")},
    **{name: ("grpo", "ppo", "flow_grpo", "distill") for name in ("epsilon", "epsilon_high")},
    "loss_aggregation": ("grpo", "ppo", "online_rft", "rft_table10", "rft", "sft", "distill"),
    **{name: ("ppo",) for name in ("gamma", "gae_lambda", "value_learning_rate", "value_clip", "value_coef",
                                   "whiten_advantages", "value_init")},
    **{name: ("dpo",) for name in ("dpo_beta", "dpo_nll_coef", "dpo_pairs_per_prompt")},
    "offline_prompts": ("rft", "dpo"),
    **{name: ("grpo", "ppo", "online_rft", "rft_table10", "rft", "dpo", "flow_grpo", "distill")
       for name in ("temperature", "top_p", "top_k")},
    # Flow-GRPO's planner samples its actions with `sampling.sample` (one action a turn), not the rollouts' sampler.
    **{name: ("grpo", "ppo", "online_rft", "rft_table10", "rft", "dpo", "sft", "distill")
       for name in ("sampler", "num_slots")},
    **{name: ("flow_grpo",) for name in ("max_turns", "memory_budget", "planner_prompt_len", "action_tokens", "tools",
                                         "tool_time_limit", "tool_header", "answer_from_memory", "min_bucket")},
}
# Options read only when another option turns their feature on: (option, the condition, what it needs).
READ_WITH = (
    ("dynamic_sampling_max_rounds", lambda v: v["dynamic_sampling"], "--dynamic_sampling"),
    ("bucket_micro_batches", lambda v: v["token_layout"] == "buckets", "--token_layout=buckets"),
    ("bucket_widths", lambda v: v["token_layout"] == "buckets", "--token_layout=buckets"),
    ("completion_widths", lambda v: v["token_layout"] == "padded", "--token_layout=padded"),
    ("remat_policy", lambda v: v["remat"], "--remat"),
    ("eval_temperature", lambda v: v["eval_samples"] > 0, "--eval_samples > 0"),
    ("lora_alpha", lambda v: v["lora_rank"] > 0, "--lora_rank > 0"),
    ("lora_targets", lambda v: v["lora_rank"] > 0, "--lora_rank > 0"),
    ("math_verify_time_limit", lambda v: "math_verify" in v["reward"], "--reward=math_verify:..."),
    ("math_verify_workers", lambda v: "math_verify" in v["reward"], "--reward=math_verify:..."),
)
MAX_FORWARD_MEMORY_BUDGET = 1 << 20  # GiB: --forward_memory_budget above a PiB per device is a typo
MAX_TIME_LIMIT = 86400.0  # seconds: --math_verify_time_limit and --tool_time_limit
MAX_SYNTHETIC = 10_000_000  # problems of the synthetic task, all generated up front (tens of seconds per million)


LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # grpo_jax.models.config.LORA_TARGETS


def lora_targets(spec: str) -> tuple[str, ...]:
  """`--lora_targets`: "q,v" -> ("q", "v")."""
  return tuple(t.strip() for t in spec.split(",") if t.strip())


def profile_window(spec: str) -> tuple[int, int] | None:
  """`--profile_steps`: "FIRST:LAST" -> (FIRST, LAST), the stage-2 steps traced (both included); "" -> None.
  Raises ValueError with one line for anything else."""
  if not spec:
    return None
  match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", spec)
  if not match or not 1 <= int(match[1]) <= int(match[2]):
    raise ValueError(f"--profile_steps must be FIRST:LAST with 1 <= FIRST <= LAST (stage-2 steps, both traced), "
                     f"not {spec!r}")
  return int(match[1]), int(match[2])


def check(config: Config) -> str | None:
  """The first problem of `config` as one line, or None."""
  v = config.flat()
  for name, value in v.items():  # NaN passes every comparison below, inf overflows whatever it sizes
    if isinstance(value, float) and not math.isfinite(value):
      return f"--{name} must be a finite number, not {value}"
  for name in _POSITIVE:
    if v[name] is None or v[name] < 1:
      return f"--{name} must be >= 1"
  for name in _NON_NEGATIVE:
    if v[name] < 0:
      return f"--{name} must be >= 0"
  for name, choices in CHOICES.items():
    if v[name] not in choices:
      return f"--{name} must be one of {', '.join(str(c) for c in choices if c is not None)}, not {v[name]!r}"
  algo = v["algo"]
  if v["group_size"] < (1 if algo in ("ppo", "distill") else 2):
    return ("--group_size must be >= 2 (GRPO compares samples within a group, RFT and DPO pick among them; "
            "PPO and distill accept 1)")
  for name in ("epsilon", "temperature", "eval_temperature", "learning_rate", "sft_learning_rate",
               "rm_update_learning_rate", "dpo_beta", "likelihood_temperature"):
    if v[name] <= 0:
      return f"--{name} must be > 0"
  for name in ("epsilon_high", "value_learning_rate"):
    if v[name] is not None and v[name] <= 0:
      return f"--{name} must be > 0"
  if v["dual_clip"] is not None and v["dual_clip"] <= 1:
    return "--dual_clip must be > 1"
  if not 0 < v["top_p"] <= 1:
    return "--top_p must be in (0, 1]"
  if not 0 <= v["gamma"] <= 1 or not 0 <= v["gae_lambda"] <= 1:
    return f"--{'gamma' if not 0 <= v['gamma'] <= 1 else 'gae_lambda'} must be in [0, 1]"
  if v["value_clip"] < 0:
    return "--value_clip must be >= 0"
  if not v["rollout_correction_upper"] >= 1:
    return "--rollout_correction_upper must be >= 1 (the importance ratio of identical policies is 1)"
  if not 0 <= v["rollout_correction_lower"] <= 1:
    return "--rollout_correction_lower must be in [0, 1] (the importance ratio of identical policies is 1)"
  if v["rollout_correction"] != "none" and algo not in ("grpo", "ppo"):
    return (f"--rollout_correction={v['rollout_correction']} weights GRPO's and PPO's policy-gradient loss: it needs "
            f"--algo=grpo or ppo")
  if not 0 <= v["replay_fraction"] < 1:
    return "--replay_fraction must be in [0, 1)"
  for name in ("math_verify_time_limit", "tool_time_limit"):
    if not 0 < v[name] <= MAX_TIME_LIMIT:
      return f"--{name} must be in (0, {MAX_TIME_LIMIT:g}] seconds, not {v[name]}"
  if v["task"] == "synthetic" and v["num_train"] + v["num_test"] > MAX_SYNTHETIC:
    return f"--num_train + --num_test of the synthetic task must be at most {MAX_SYNTHETIC:,} (generated up front)"
  if v["forward_memory_budget"] > MAX_FORWARD_MEMORY_BUDGET:
    return f"--forward_memory_budget must be at most {MAX_FORWARD_MEMORY_BUDGET} GiB, not {v['forward_memory_budget']}"
  if v["math_verify_workers"] < 0:
    return "--math_verify_workers must be >= 0"
  if v["wandb_mode"] not in ("", "online", "offline", "disabled"):
    return f"--wandb_mode must be online, offline or disabled (empty: W&B's default), not {v['wandb_mode']!r}"
  if (v["wandb_entity"] or v["wandb_run_name"] or v["wandb_mode"]) and not v["wandb_project"]:
    return "--wandb_mode, --wandb_entity and --wandb_run_name need --wandb_project (W&B logging is off without it)"
  if v["overlong_buffer"] > v["max_new_tokens"]:
    return "--overlong_buffer must be <= --max_new_tokens"
  try:
    window = profile_window(v["profile_steps"])
  except ValueError as err:
    return str(err)
  if window and window[1] > v["steps"]:
    return f"--profile_steps={v['profile_steps']} ends after the run's last step (--steps={v['steps']})"
  rows = config.rows_per_step
  minibatch = v["minibatch_size"] or rows
  if minibatch % v["grad_accum_steps"] or rows % minibatch:
    return ("--minibatch_size (0: batch_size*group_size) must divide batch_size*group_size and be divisible by "
            "--grad_accum_steps")
  if v["forward_rows"] % v["group_size"]:
    return "--forward_rows must be a multiple of --group_size (a chunk holds whole groups)"
  if v["sft_steps"] and v["sft_batch_size"] % v["grad_accum_steps"]:
    return "--sft_batch_size must be divisible by --grad_accum_steps"
  if v["tiny_hidden_size"] < 1 or v["tiny_hidden_size"] % (2 * TINY_HEADS):
    return (f"--tiny_hidden_size must be a positive multiple of {2 * TINY_HEADS} (the embedded model's "
            f"{TINY_HEADS} attention heads each need an even head size for RoPE)")
  if v["lora_rank"] < 0 or (v["lora_rank"] and v["lora_alpha"] <= 0):
    return "--lora_rank must be >= 0 (0: no LoRA) and, with LoRA, --lora_alpha > 0"
  if v["lora_rank"] > v["tiny_hidden_size"] and not (v["model"] or v["init_checkpoint"]):
    return (f"--lora_rank={v['lora_rank']} exceeds the embedded model's width (--tiny_hidden_size="
            f"{v['tiny_hidden_size']}): a rank-r adapter needs r <= the hidden size")
  if v["lora_export_peft"] and not v["lora_rank"]:
    return "--lora_export_peft writes LoRA adapters: it needs --lora_rank > 0"
  if v["lora_rank"] and (not lora_targets(v["lora_targets"])
                         or not set(lora_targets(v["lora_targets"])) <= set(LORA_TARGETS)):
    return f"--lora_targets must be a comma-separated list of {','.join(LORA_TARGETS)}, not {v['lora_targets']!r}"
  reward = v["reward"]
  if v["supervision"] == "process" and reward not in STEP_REWARDS:
    return "--supervision=process needs --reward=prm (a process reward model) or exact_steps (synthetic task)"
  if reward == "exact_steps" and v["task"] != "synthetic":
    return "--reward=exact_steps needs --task=synthetic, whose steps can be checked exactly"
  if (reward in ("orm", "prm")) != bool(v["reward_model"]):
    return "--reward=orm|prm and --reward_model=DIR go together"
  if v["iterations"] > 1 and (v["steps_per_iteration"] < 1 or reward not in ("orm", "prm")):
    return "--iterations > 1 needs --steps_per_iteration >= 1 and a learned reward (--reward=orm|prm)"
  if v["supervision"] == "process" and algo != "grpo":
    return "--supervision=process is GRPO's (GRPO+PS); use --algo=grpo"
  if v["advantage_estimator"] != "group" and (algo != "grpo" or v["supervision"] == "process"):
    return (f"--advantage_estimator={v['advantage_estimator']} replaces GRPO's outcome advantages: it needs "
            f"--algo=grpo and --supervision=outcome")
  if v["iterations"] > 1 and algo not in ("grpo", "ppo"):
    return "--iterations > 1 (iterative RL) needs an online RL method: --algo=grpo or ppo"
  if (v["likelihood_temperature"] != 1.0 and algo not in ("sft", "rft", "rft_table10", "online_rft")
      and not (algo in ("grpo", "ppo") and v["likelihood_temperature"] == v["temperature"])):
    return ("--likelihood_temperature is the imitation methods' (sft, rft, rft_table10, online_rft); GRPO and PPO "
            "train the likelihood of --temperature (it may equal that), the others T = 1's")
  problem = _check_policy_loss(v) or _check_distill(v)
  if problem:
    return problem
  if algo == "dpo" and rows % 2:
    return "--algo=dpo needs an even batch_size*group_size (rows come in pairs)"
  if algo == "flow_grpo":
    for name in FLOW_UNSUPPORTED:
      if v[name] != default(name):
        return f"--{name} is a GRPO option that Flow-GRPO does not use; leave it at its default"
    if reward in ("orm", "prm", "exact_steps"):
      return "--reward: Flow-GRPO scores the generator's answer with rule rewards, not a reward model"
  for name, readers in READ_BY.items():
    if algo not in readers and v[name] != default(name):
      return (f"--{name} is read only by --algo={'|'.join(readers)}; --algo={algo} does not use it: leave it at its "
              f"default")
  for name, used, needs in READ_WITH:
    if v[name] != default(name) and not used(v):
      return f"--{name} is read only with {needs}; leave it at its default"
  if v["process_center_tokens"] and v["supervision"] != "process":
    return "--process_center_tokens centres process advantages: it needs --supervision=process"
  return None


def _check_policy_loss(v: dict) -> str | None:
  """GRPO's policy term (--loss) and its entropy options."""
  loss = v["loss"]
  if not v["sapo_tau_pos"] > 0 or not v["sapo_tau_neg"] > 0:
    return f"--{'sapo_tau_pos' if not v['sapo_tau_pos'] > 0 else 'sapo_tau_neg'} must be > 0"
  if not v["entropy_coef"] >= 0:
    return "--entropy_coef must be >= 0 (0: no entropy bonus)"
  if not 0 < v["top_entropy_quantile"] <= 1:
    return "--top_entropy_quantile must be in (0, 1] (1: every token keeps its policy gradient)"
  uses = [f"--loss={loss}"] if loss != "clip" else []
  uses += [f"--{n}" for n in ("entropy_coef", "top_entropy_quantile") if v[n] != default(n)]
  if uses and v["algo"] != "grpo":
    return f"{', '.join(uses)}: GRPO's objective only; use --algo=grpo"
  if loss != "clip" and v["dual_clip"] is not None:
    return f"--dual_clip is the clip loss's; --loss={loss} does not clip the update"
  if loss == "sapo" and v["epsilon_high"] is not None:
    return "--epsilon_high means nothing to --loss=sapo (its gate has --sapo_tau_pos and --sapo_tau_neg)"
  if loss != "sapo" and (v["sapo_tau_pos"], v["sapo_tau_neg"]) != (default("sapo_tau_pos"), default("sapo_tau_neg")):
    return "--sapo_tau_pos and --sapo_tau_neg are SAPO's temperatures: they need --loss=sapo"
  return None


# GRPO options that mean nothing to on-policy distillation, whose signal is the teacher's, not a reward's.
DISTILL_UNUSED = ("dynamic_sampling", "overlong_buffer", "advantage_scale", "advantage_estimator", "supervision",
                  "reward_model", "iterations")


def _check_distill(v: dict) -> str | None:
  """--algo=distill and its teacher."""
  if (v["algo"] == "distill") != bool(v["teacher_checkpoint"]):
    return "--algo=distill and --teacher_checkpoint=DIR (the frozen teacher, an HF directory) go together"
  if v["algo"] == "distill":
    for name in DISTILL_UNUSED:
      if v[name] != default(name):
        return f"--{name}: --algo=distill learns from its teacher, not a reward; leave it at its default"
    if v["reward"] in ("orm", "prm", "exact_steps"):
      return "--reward: --algo=distill only reports a rule reward; its signal is the teacher's"
  return None
