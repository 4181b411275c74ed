"""The run's configuration: frozen dataclasses, one per concern, built from flags once in `main()`.

Every field has the name of its command-line flag, so a flagfile and a Python config say the same thing:

  config = runner.Config(optim=runner.OptimConfig(steps=50), rollout=runner.RolloutConfig(batch_size=16))
  summary = runner.run(config)            # == python -m experiments.grpo_math --steps=50 --batch_size=16

`Config()` is the embedded default run (`experiments/configs/cpu_default.cfg`). Each field is declared with
`flag(default, help_text, ...)`, which holds its flag's help text, its values (an enum flag) and its lower bound, and
`experiments.cli` defines the runners' flags from these fields: a new field is a new flag, with no second edit.
Everything below the entry modules takes a `Config` (or one of its sections) and never reads a flag.
`Config.flat()` is the flag-name -> value dict a checkpoint records and `--resume` compares.
"""

import dataclasses
import math
import re
from typing import Any


def flag(default: Any, help_text: str, *, choices: tuple | None = None, minimum: int | None = None):
  """A config field with the command-line flag of its name (`experiments.cli` defines one per field).

  Args:
    default: the field's default, and its flag's.
    help_text: the flag's help (`--helpfull`).
    choices: the allowed values (an enum flag, checked by `check`); None among them is an unset default that
      `Config` resolves, not a flag value.
    minimum: the least value `check` accepts (1 or 0), with one line naming the flag below it.

  Choices that name the library's implementations (remat_policy, attention, decode_projections, loss_aggregation, loss,
  rollout_correction, sharding_rules) are copies, so that this module imports no JAX;
  tests/experiments/runner/test_config.py holds them equal to the library's.
  """
  metadata = {"help": help_text}
  if choices is not None:
    metadata["choices"] = choices
  if minimum is not None:
    metadata["minimum"] = minimum
  return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
  """The policy: an HF checkpoint, or the embedded tiny model built and warm-started by SFT."""
  model: str = flag("", "Hugging Face checkpoint directory (Qwen2/2.5, Qwen3, Llama 3). Empty: the embedded tiny "
      "model, built in <work_dir>/base_model and warm-started by SFT.")
  init_checkpoint: str = flag("", "HF-format directory with the starting policy (skips SFT), e.g. a previous run's "
      "sft_policy or final_policy.")
  tiny_layers: int = flag(4, "Embedded default model: decoder layers.", minimum=1)
  tiny_hidden_size: int = flag(128, "Embedded default model: hidden size (the MLP is 3x).")
  dtype: str = flag("float32", "Compute and parameter dtype.", choices=("float32", "bfloat16"))
  remat: bool = flag(False, "Rematerialise each layer in the backward pass (saves memory).")
  remat_policy: str = flag("full", "With --remat: what each layer keeps for the backward pass: nothing (full), its "
      "matmul outputs without a batch dimension (dots_no_batch), or all matmul outputs (dots).",
      choices=("full", "dots_no_batch", "dots"))
  scan_layers: bool = flag(False, "Run the decoder layers as one lax.scan over stacked weights (compiles in a third of "
      "the time on deep models; the same HF checkpoints load and save). Checkpoints of the train state are "
      "layout-specific: resume with the same value.")
  logprob_chunk: int = flag(128, "Sequence chunk of the memory-lean log-prob computation.")
  attention: str = flag("auto", "Attention of the training and scoring forwards (docs/scaling.md): einsum (the "
      "reference), xla (jax.nn.dot_product_attention), cudnn (its cuDNN flash kernel: NVIDIA GPU, bfloat16), pallas "
      "(the Pallas TPU flash kernel); auto: pallas on a TPU, cudnn on a GPU in bfloat16 (else xla), einsum on a CPU.",
      choices=("auto", "einsum", "xla", "cudnn", "pallas"))
  decode_projections: str = flag("auto", "How a decode step (sampling, evaluation) runs the projections that read "
      "one input: auto, k with v and gate with up as one product each on a CPU, each its own elsewhere; together, "
      "q, k and v as one product and gate with up as one on every platform (fewer, wider kernels a step: "
      "docs/models.md); separate, each its own. The same tokens either way, up to float rounding.",
      choices=("auto", "together", "separate"))
  lora_rank: int = flag(0, "LoRA (docs/lora.md): > 0 trains rank-r adapters on --lora_targets with the base weights "
      "frozen (stage 2; the reference policy is the base with the adapters off, no second copy). 0: full fine-tuning.")
  lora_alpha: float = flag(16.0, "LoRA scale: the adapters add (x·A)·B·lora_alpha/lora_rank.")
  lora_targets: str = flag("q,k,v,o,gate,up,down", "LoRA: comma-separated projections to adapt, from q,k,v,o "
      "(attention) and gate,up,down (MLP).")
  lora_export_peft: bool = flag(False, "LoRA: also write the adapters in PEFT's format (adapter_config.json, "
      "adapter_model.safetensors) to <work_dir>/final_adapter, beside the merged final_policy.")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
  """Problems, prompt format and the rule reward."""
  task: str = flag("synthetic", "The task: synthetic (2-3 step chains, one solution path each), synthetic_paths (sums "
      "of products in 4-8 steps, many valid paths each; experiments/configs/synthetic_paths.cfg), gsm8k, math.",
      choices=("synthetic", "synthetic_paths", "gsm8k", "math"))
  train_file: str = flag("", "Training problems (gsm8k: question/answer; math: problem/solution[/level/type]): a JSONL "
      "or parquet file (or a glob of parquet files), a `datasets` save_to_disk folder, or a folder with train.jsonl, "
      "train[-*].parquet or a DatasetDict's train split (docs/integrations.md).")
  test_file: str = flag("", "Held-out problems, in the forms --train_file takes (split 'test').")
  num_train: int = flag(20000, "Synthetic task: training problems in the pool.", minimum=1)
  num_test: int = flag(500, "Held-out problems to evaluate on (all of test_file if larger).", minimum=1)
  synthetic_min_steps: int = flag(2, "Synthetic task: fewest operations per problem.")
  synthetic_max_steps: int = flag(3, "Synthetic task: most operations per problem.")
  synthetic_digits: int = flag(1, "Synthetic task: digits of + and - operands.")
  synthetic_ops: str = flag("+-*", "Synthetic task: operations.")
  paths_min_steps: int = flag(4, "--task=synthetic_paths: fewest steps per problem (numbers - 1), at least 2.")
  paths_max_steps: int = flag(8, "--task=synthetic_paths: most steps per problem.")
  prompt_template: str = flag("auto", "auto: chat template for real datasets when the tokenizer has one, else plain "
      "text.", choices=("auto", "plain", "chat"))
  max_prompt_len: int = flag(16, "Prompt tokens (longer prompts are cut from the left).", minimum=1)
  reward: str = flag("correctness:1.0", "Reward spec 'name:weight,...' (correctness, format, arithmetic_format, "
      "boxed_format, step_correctness, math_verify: math-verify's symbolic check, docs/integrations.md), or a learned "
      "reward model: 'orm' (an orm or orm_steps model) or 'prm' with --reward_model (see --supervision, --iterations), "
      "or 'exact_steps': the synthetic task's exact step labels as a perfect PRM.")
  math_verify_time_limit: float = flag(2.0, "--reward=math_verify: seconds one check may take; past it the check "
      "scores 0 and its worker process is killed and replaced.")
  math_verify_workers: int = flag(0, "--reward=math_verify: worker processes checking a step's completions in parallel "
      "(0: half the cores, 1 to 8).")
  sft_examples: int = flag(2000, "SFT demonstrations: the first N training problems, with solutions; GRPO draws its "
      "prompts from the other problems (it needs answers only). 0: all.", minimum=0)
  num_validation: int = flag(0, "> 0: hold N problems of the RL pool (drawn by the seed) out of training and evaluate "
      "the final policy on them too (summary final_val_accuracy): a validation split for choosing hyperparameters "
      "without the test set.", minimum=0)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """Stage 1, the warm start of the embedded model on worked solutions."""
  sft_steps: int = flag(600, "SFT steps of the warm start (embedded default only; 0 skips).", minimum=0)
  sft_batch_size: int = flag(32, "SFT sequences per step.", minimum=1)
  sft_learning_rate: float = flag(3e-3, "SFT peak learning rate (cosine decay).")
  sft_save_every: int = flag(0, "Checkpoint stage 1 every N SFT steps (the newest kept; --resume continues from it), "
                                "so that a run killed without a signal loses at most N steps (0: only when a signal "
                                "stops it).", minimum=0)


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Sampling the policy: B prompts x G completions per step."""
  batch_size: int = flag(32, "Prompts per step (B).", minimum=1)
  # None: 8, and 1 for PPO (resolved by `Config`)
  group_size: int | None = flag(None, "Samples per prompt (G); default 8, and 1 for --algo=ppo.")
  max_new_tokens: int = flag(40, "Completion budget in tokens.", minimum=1)
  temperature: float = flag(0.7, "Sampling temperature of the rollouts; the policy trained is softmax(logits / "
      "temperature), so old, reference and new log-probs all use it.")
  top_p: float = flag(1.0, "Nucleus sampling mass of the rollouts.")
  top_k: int = flag(0, "Top-k of the rollouts (0: off).", minimum=0)
  dynamic_sampling: bool = flag(False, "DAPO dynamic sampling: drop groups whose rewards are all equal and sample more "
      "prompts to refill the batch.")
  dynamic_sampling_max_rounds: int = flag(4, "Most sampling rounds per step with dynamic sampling.", minimum=1)
  overlong_buffer: int = flag(0, "DAPO overlong shaping: L_cache tokens before max_new_tokens (0: off).", minimum=0)
  mask_truncated: bool = flag(False, "Leave completions that hit max_new_tokens out of the loss.")
  completion_pad_multiple: int = flag(4, "Training batches keep a step's completions up to the longest one, rounded up "
      "to a multiple of this (each new width compiles the scoring and update programs once; use 64-128 for long "
      "completions on an accelerator); 0 keeps all max_new_tokens columns.", minimum=0)
  completion_widths: str = flag("multiple", "How --completion_pad_multiple rounds a step's longest completion: "
      "multiple (up to a multiple of it) or doubling (up to the smallest multiple * 2^k: at most log2(max_new_tokens / "
      "multiple) + 2 compiled widths of the scoring and update programs a run, for at most twice the columns).",
      choices=("multiple", "doubling"))
  # `grpo_jax.length_buckets`: one program for every length.
  token_layout: str = flag("padded", "GRPO/PPO/distill: the training rows' layout in the pi_ref / pi_old (and PPO's "
      "value) forwards and the update: padded (every row cut to the step's longest completion) or buckets (rows "
      "sorted by length into --bucket_micro_batches micro-batches, each at the narrowest of --bucket_widths halving "
      "widths that holds it: compute follows the tokens, and one program serves every length).",
      choices=("padded", "buckets"))
  bucket_micro_batches: int = flag(8, "With --token_layout=buckets: length-sorted micro-batches of a step's rows in "
      "the forwards, and of a minibatch in the update (at least --grad_accum_steps there); more fit the lengths "
      "closer, fewer run wider matmuls.", minimum=1)
  bucket_widths: int = flag(3, "With --token_layout=buckets: widths of the ladder, halving from --max_new_tokens and "
      "rounded up to --completion_pad_multiple: one compiled branch each in the update; the forwards run in blocks of "
      "the narrowest whose blocks hold 256 tokens a data shard (one compiled block).", minimum=1)
  # `grpo_jax.rollout_engine` (num_slots 0: `default_slots`) or `grpo_jax.sampling`.
  sampler: str = flag("engine", "Rollouts' and evaluation's sampler: engine (continuous batching over --num_slots "
      "decode slots: a finished completion's slot takes the next one, so a long tail of lengths costs its tokens) or "
      "static (every row decodes until the batch's longest ends). The same tokens for the same seed.",
      choices=("engine", "static"))
  num_slots: int = flag(0, "Decode slots of --sampler=engine over all devices (0: 4096 / --max_new_tokens a device on "
      "a CPU, at least 8, raised by at most 1.25x to whole waves; a quarter of the completions, at least 64, on an "
      "accelerator; fewer where --forward_memory_budget would not hold them).", minimum=0)


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
  """The stage-2 method and its loss (GRPO and its variants; PPO's critic; DPO; the offline data)."""
  algo: str = flag("grpo", "Stage-2 method: grpo, ppo (with a critic), online_rft, rft, dpo (offline from the start "
      "policy), sft (human solutions), flow_grpo (the multi-turn planner with tools; experiments.flow_grpo sets its "
      "defaults) or distill (on-policy distillation from --teacher_checkpoint).",
      choices=("grpo", "ppo", "online_rft", "rft", "rft_table10", "dpo", "sft", "flow_grpo", "distill"))
  beta: float = flag(0.04, "KL coefficient β (0 removes the KL term and the reference forward).", minimum=0)
  epsilon: float = flag(0.2, "Clip range ε (lower side).")
  epsilon_high: float | None = flag(None, "Upper clip range (DAPO clip-higher, e.g. 0.28); default ε.")
  dual_clip: float | None = flag(None, "Dual-clip constant c > 1 for negative advantages; default off.")
  # None: k3 in GRPO's loss, k1 in PPO's and REINFORCE++'s reward
  kl: str | None = flag(None, "KL estimator: in GRPO's loss (default k3, the paper's; k1's on-policy gradient is zero "
      "in expectation, so as a loss term it barely regularises), in PPO's per-token reward (default k1, eq. 2's "
      "log-ratio).", choices=(None, "k1", "k2", "k3"))
  loss_aggregation: str = flag("seq-mean-token-mean", "Loss aggregation: GRPO's seq-mean-token-mean, DAPO's "
      "token-mean, Dr. GRPO's seq-mean-token-sum-norm.",
      choices=("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum"))
  advantage_scale: str = flag("group", "Advantage normalisation: group std (GRPO), batch std, or none (Dr. GRPO).",
      choices=("group", "batch", "none"))
  advantage_eps: float = flag(1e-4, "Added to the std of the advantage normalisation.", minimum=0)
  advantage_estimator: str = flag("group", "GRPO's advantages: group (normalised within the G samples of a prompt, "
      "--advantage_scale), rloo (r_i minus the mean of the other G-1 rewards, unscaled), or reinforce_pp (REINFORCE++: "
      "the KL penalty β·--kl (default k1) in every token's reward instead of the loss, returns whitened over the "
      "batch).", choices=("group", "rloo", "reinforce_pp"))
  importance: str = flag("token", "Importance ratio level (sequence: GSPO).", choices=("token", "sequence"))
  # GRPO's policy term: PPO's clip, CISPO or SAPO (grpo_jax.losses.grpo_loss's policy_loss)
  loss: str = flag("clip", "GRPO's policy term (docs/losses.md): clip (PPO's clipped surrogate: GRPO, DAPO, GSPO), "
      "cispo (MiniMax-M1: the importance weight clipped to at most 1 + --epsilon_high (default --epsilon) under a "
      "stop-gradient, times Â log π, so no token's gradient is dropped; no lower bound) or sapo (a sigmoid gate on the "
      "ratio in place of the clip, temperatures --sapo_tau_pos / --sapo_tau_neg). The KL term and --loss_aggregation "
      "apply to all three.", choices=("clip", "cispo", "sapo"))
  sapo_tau_pos: float = flag(1.0, "--loss=sapo: the gate's temperature for tokens with Â > 0.")
  sapo_tau_neg: float = flag(1.05, "--loss=sapo: the gate's temperature for tokens with Â <= 0 (the paper: above "
      "--sapo_tau_pos, so negative updates fade sooner).")
  entropy_coef: float = flag(0.0, "GRPO: c of an entropy bonus, -c times the policy's token-mean entropy added to the "
      "loss (whatever --loss_aggregation). 0: off.")
  top_entropy_quantile: float = flag(1.0, "GRPO: ρ in (0, 1]: only the top ρ of each micro-batch's tokens by the "
      "policy's entropy keep their policy gradient (\"Beyond the 80/20 rule\": 0.2); the KL term and the normaliser "
      "keep every token. 1: off.")
  num_epochs: int = flag(1, "μ: passes over each step's samples.", minimum=1)
  minibatch_size: int = flag(0, "Sequences per optimiser step (0: all B·G of the step).", minimum=0)
  grad_accum_steps: int = flag(1, "Micro-batches per minibatch, accumulated exactly (--algo=flow_grpo: its turn rows "
                                  "in micro-batches of half the minibatch's trajectories / this, those past a step's "
                                  "turns skipped).", minimum=1)
  recompute_old_logprobs: bool = flag(False, "Recompute π_old with a forward pass instead of taking it exactly as "
      "stop_gradient(π_θ) (GRPO with one epoch over one minibatch: the default) or from the sampler's log-probs (at "
      "temperature 1).")
  # `grpo_jax.losses.rollout_correction`.
  rollout_correction: str = flag("none", "GRPO/PPO: correct the policy gradient for the gap between the sampler's and "
      "the trainer's log-probs of the sampled tokens (always logged as train/mismatch_*), with ratio ρ = "
      "π_trainer/π_sampler: token_tis / seq_tis weigh each token by min(ρ, --rollout_correction_upper), of the token "
      "or of its whole sequence (truncated IS); token_mis / seq_mis weigh it by ρ inside [--rollout_correction_lower, "
      "--rollout_correction_upper] and drop it outside (masked IS). With temperature 1, π_old is then recomputed by a "
      "forward instead of taken from the sampler.", choices=("none", "token_tis", "seq_tis", "token_mis", "seq_mis"))
  rollout_correction_lower: float = flag(0.5, "--rollout_correction=token_mis|seq_mis: the lowest ratio kept, in [0, "
      "1] (0: bounded from above only).")
  rollout_correction_upper: float = flag(2.0, "--rollout_correction: C of truncated IS (token_tis, seq_tis), the "
      "highest ratio kept by masked IS; >= 1.")
  shared_prompt_forward: bool = flag(True, "GRPO: run each prompt once per group of G samples in the π_ref / π_old "
      "forwards and the update (its KV cache shared by the G completions): B·P + B·G·T tokens instead of B·G·(P + T), "
      "the same loss up to float rounding. Minibatches then shuffle whole groups; off when a micro-batch would split a "
      "group.")
  gamma: float = flag(1.0, "PPO: discount γ of GAE.")
  gae_lambda: float = flag(0.95, "PPO: GAE λ.")
  value_learning_rate: float | None = flag(None, "PPO: peak learning rate of the value model; default --learning_rate.")
  value_clip: float = flag(0.2, "PPO: value-loss clip range around the sampling-time values (0: unclipped).")
  value_coef: float = flag(1.0, "PPO: weight of the value loss (separate optimisers, so it only rescales the critic's "
      "gradient before clipping).")
  whiten_advantages: bool = flag(True, "PPO: whiten GAE advantages over the batch's completion tokens.")
  value_init: str = flag("policy", "PPO: the value model's backbone: 'policy' (the start policy's) or an HF-format "
      "checkpoint directory (e.g. a reward model's backbone).")
  dpo_beta: float = flag(0.1, "DPO: β of the implicit reward.")
  dpo_nll_coef: float = flag(0.0, "DPO: α of the chosen output's length-normalised NLL added to the loss (Iterative "
      "RPO, arXiv 2404.19733, uses 1); 0 is plain DPO.", minimum=0)
  dpo_pairs_per_prompt: int = flag(1, "DPO: most (correct, wrong) pairs per prompt.", minimum=1)
  offline_prompts: int = flag(2048, "RFT/DPO: training prompts sampled once from the start policy (G samples each) to "
      "build the offline dataset.", minimum=1)
  # The imitation methods' (sft, rft, rft_table10, online_rft).
  likelihood_temperature: float = flag(1.0, "SFT/RFT/Online RFT: the temperature T of the likelihood log "
      "softmax(logits / T) they train (1: the model's own); set it to --temperature to have every method train one "
      "likelihood (GRPO and PPO train --temperature's).")
  teacher_checkpoint: str = flag("", "--algo=distill: the frozen teacher, an HF-format directory with the policy's "
      "tokenizer (a larger model, or e.g. another run's final_policy); the student learns from the per-token reverse "
      "KL to it on its own samples.")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """The stage-2 optimiser (AdamW) and the run's length."""
  steps: int = flag(200, "Stage-2 steps (each: collect, then μ epochs of updates).", minimum=0)
  learning_rate: float = flag(3e-4, "Stage-2 peak learning rate (the policy's).")
  lr_schedule: str = flag("cosine", "After warm-up: constant, or cosine decay to 10% over the run's optimiser steps.",
      choices=("constant", "cosine"))
  warmup_steps: int = flag(5, "Linear warm-up of the learning rate, in optimiser steps.")
  weight_decay: float = flag(0.0, "AdamW weight decay of the GRPO stage.")
  max_grad_norm: float = flag(1.0, "Global-norm gradient clipping (0: off).", minimum=0)


@dataclasses.dataclass(frozen=True)
class RewardModelConfig:
  """Learned rewards (GRPO+OS/PS with an ORM/PRM) and iterative RL (DeepSeekMath Algorithm 1)."""
  reward_model: str = flag("", "With --reward=orm|prm: a reward-model directory written by "
      "experiments.train_reward_model (HF-format backbone + reward_head.safetensors).")
  supervision: str = flag("outcome", "outcome: one reward per completion (GRPO+OS); process: a PRM reward per step "
      "(GRPO+PS, needs --reward=prm).", choices=("outcome", "process"))
  process_center_tokens: bool = flag(False, "GRPO+PS: subtract the group's mean token advantage (a constant baseline; "
      "the paper's suffix sums drift negative when later steps score lower). See losses.process_advantages.")
  prm_max_steps: int = flag(8, "PRM and orm_steps: most scored steps per completion (the first K-1 and the last).",
      minimum=1)
  iterations: int = flag(1, "Iterative RL: iterations I (1: plain RL, the reward model stays frozen).", minimum=1)
  steps_per_iteration: int = flag(0, "Iterative RL: policy steps M per iteration; the run is I*M steps.", minimum=0)
  replay_fraction: float = flag(0.1, "Iterative RL: share of historical data in each reward-model update.")
  replay_capacity: int = flag(16384, "Iterative RL: most historical reward-model rows kept (a uniform sample of all "
      "rows seen).", minimum=1)
  rm_update_prompts: int = flag(256, "Iterative RL: prompts sampled (G each) from the current policy to retrain the "
      "reward model at the end of an iteration.", minimum=1)
  rm_update_steps: int = flag(100, "Iterative RL: reward-model optimiser steps per iteration (0: never retrained; its "
      "accuracy and AUC on fresh samples are still measured).", minimum=0)
  rm_update_batch_size: int = flag(64, "Iterative RL: reward-model rows per step.", minimum=1)
  rm_update_learning_rate: float = flag(1e-4, "Iterative RL: reward-model learning rate (constant after a 10-step "
      "warm-up).")
  rm_update_eval_prompts: int = flag(0, "Iterative RL: further prompts (G samples each) of the current policy at each "
      "iteration's end, never trained on: the reward model's accuracy and within-problem AUC on them before and "
      "after its retraining (rm/held_out_before_*, rm/held_out_after_*): does it go stale, does a round catch up.",
      minimum=0)
  reset_reference: bool = flag(True, "Iterative RL: pi_ref <- pi_theta at each iteration's start (Algorithm 1); false "
      "keeps the start policy as the reference throughout.")
  rm_update_lora_rank: int = flag(0, "Iterative RL: > 0 retrains rank-r LoRA adapters on every projection of the "
      "reward model's backbone (and its head, alpha; the base weights as loaded), so a retraining can change which "
      "samples it prefers; 0: the whole backbone (a loglik-score model's stays frozen).", minimum=0)
  rm_update_lora_alpha: float = flag(16.0, "Iterative RL: --rm_update_lora_rank's scale (x·A)·B·alpha/rank.")
  replay_reward_model_rows: bool = flag(True, "Iterative RL: the replay buffer starts with the rows the reward model "
      "trained on (training_rows.npz, which experiments.train_reward_model saves beside it), the paper's historical "
      "data; false, or a model saved without them: it starts empty and holds earlier rounds' rows only.")


PLANNER_OBJECTIVES = ("flow_grpo", "trajectory_grpo", "sft")  # Flow-GRPO's updates of the planner


@dataclasses.dataclass(frozen=True)
class AgentConfig:
  """Flow-GRPO's agent (AgentFlow): turns, memory, tools, budgets."""
  max_turns: int = flag(4, "T_max: most planner turns per trajectory (training and evaluation).", minimum=1)
  memory_budget: int = flag(56, "Tokens of memory text in the planner's prompt; the oldest turns are dropped (and "
      "summarised in one line) beyond it.", minimum=0)
  planner_prompt_len: int = flag(72, "Planner prompt budget in tokens (query + memory + cue).", minimum=1)
  action_tokens: int = flag(20, "Token budget of one action.", minimum=1)
  tools: str = flag("calc,frac,recall", "The toolset K, from calc, frac, recall.")
  tool_time_limit: float = flag(1.0, "Seconds a tool call may take before it is an error observation.")
  tool_header: bool = flag(False, "Describe the tools and the action format at the top of every prompt (for "
      "instruction-tuned models; the tiny default learns the format from SFT).")
  answer_from_memory: bool = flag(True, "Without a final-answer action, the generator answers with the last tool "
      "result in memory.")
  min_bucket: int = flag(8, "Smallest padded active-set size of a turn (row counts are padded up to powers of two, so "
      "jit compiles a few shapes, not one per turn).", minimum=1)
  planner_objective: str = flag("flow_grpo", "Stage 2's update of the planner: flow_grpo (eq. 5: each turn's tokens "
      "averaged, then the turns of a trajectory), trajectory_grpo (the same samples, each trajectory's action tokens "
      "averaged as one sequence), sft (continued SFT on the teacher trajectories of the step's queries); "
      "docs/agents.md.", choices=PLANNER_OBJECTIVES)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Held-out evaluation: greedy accuracy, and maj@k / pass@k with `eval_samples` > 0."""
  eval_every: int = flag(100, "Evaluate every N GRPO steps (0: only before and after).", minimum=0)
  eval_batch_size: int = flag(250, "Prompts per evaluation batch.", minimum=1)
  eval_samples: int = flag(0, "k > 0: also sample k completions per problem for maj@k and pass@k.", minimum=0)
  eval_temperature: float = flag(0.7, "Temperature of the maj@k / pass@k samples.")


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Where the run writes, its checkpoints, and its seed."""
  work_dir: str = flag("runs/grpo_math", "Directory for checkpoints, logs and exported models.")
  save_every: int = flag(50, "Checkpoint every N training steps (stage 2's, or the reward model's).", minimum=0)
  keep_checkpoints: int = flag(2, "Checkpoints to keep.", minimum=1)
  resume: bool = flag(False, "Continue from the latest checkpoint in work_dir.")
  stop_after: int = flag(0, "Stop (as if interrupted) after this GRPO step, after saving; 0: off.", minimum=0)
  tensorboard: bool = flag(True, "Write TensorBoard event files.")
  wandb_project: str = flag("", "Also log to Weights & Biases, in this project (pip install 'grpo_jax[wandb]'): the "
      "same metrics, the run's config; --resume continues the same W&B run (its id is kept in "
      "<work_dir>/wandb_run_id). Empty: off.")
  wandb_mode: str = flag("", "W&B mode: online, offline (files under <work_dir>/wandb, uploaded later by `wandb sync`) "
      "or disabled. Empty: W&B's default (WANDB_MODE, else online).")
  wandb_entity: str = flag("", "W&B entity (team or user); empty: your default.")
  wandb_run_name: str = flag("", "W&B run name; empty: W&B chooses one.")
  seed: int = flag(0, "Random seed of data order, sampling and initialisation.")
  compilation_cache_dir: str = flag("~/.cache/grpo_jax/xla", "JAX's on-disk compilation cache: a later run of the same "
      "programs (the same model, shapes and flags that shape them) loads them instead of compiling. Empty: off. "
      "JAX_COMPILATION_CACHE_DIR, when set, wins.")
  compile_ahead: bool = flag(True, "Compile stage 2's first-step programs whose shapes are known before it (the "
      "rollouts' sampler; with --token_layout=buckets the scoring forwards and the update too) in background threads "
      "while the start policy is evaluated.")
  profile_steps: str = flag("", "FIRST:LAST: trace stage-2 steps FIRST to LAST (both included) with jax.profiler into "
      "<work_dir>/profile (TensorBoard's profile plugin, Perfetto) and print each compiled program's runs, time and op "
      "kinds. Empty: off.")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Devices and processes: a mesh spec and its sharding rules; the multi-host coordinator."""
  mesh: str = flag("", "Device mesh, e.g. 'data:2,fsdp:2,tensor:2' (one size may be -1: the remaining devices). Empty: "
      "one device (or, with several processes, every device on the data axis).")
  sharding_rules: str = flag("fsdp", "How params, optimiser state and activations map onto the mesh: dp (replicated "
      "params), fsdp (params split over fsdp), fsdp_tp (+ tensor).", choices=("dp", "fsdp", "fsdp_tp"))
  coordinator_address: str = flag("", "Multi-host: host:port of process 0's coordinator (or JAX_COORDINATOR_ADDRESS). "
      "Every process runs the same command.")
  num_processes: int | None = flag(None, "Multi-host: number of processes (or JAX_NUM_PROCESSES).")
  process_id: int | None = flag(None, "Multi-host: this process's index (or JAX_PROCESS_ID).")
  # `placement.Placement.from_config`.
  cpu_devices: int = flag(0, "One process on a CPU without --mesh: present the CPU as this many devices (0: one per "
      "core; 1: off) and split the sampler's rows over them (the same tokens as one device, each core decoding its own "
      "rows); training and scoring stay on the first. Ignored on GPU/TPU, with --mesh, several processes, or "
      "XLA_FLAGS' --xla_force_host_platform_device_count.", minimum=0)
  # `grpo_jax.row_chunks`; 0 and 0: `row_chunks.default_budget_bytes`.
  forward_rows: int = flag(0, "Rows per chunk of the forwards over a step's batch_size*group_size rows (π_ref, π_old, "
      "reward model, values), looped inside one program (a multiple of group_size). 0: as many as "
      "--forward_memory_budget holds.", minimum=0)
  forward_memory_budget: float = flag(0.0, "GiB per device for one chunk's activations in those forwards, and for the "
      "sampler's KV cache (prompts in chunks when all would not fit). 0: a quarter of an accelerator's memory, 4 GiB "
      "on a CPU.", minimum=0)


SECTIONS = {"model": PolicyConfig, "task": TaskConfig, "sft": SFTConfig, "rollout": RolloutConfig,
            "algorithm": AlgorithmConfig, "optim": OptimConfig, "reward_model": RewardModelConfig,
            "agent": AgentConfig, "eval": EvalConfig, "run": RunConfig, "mesh": MeshConfig}

# The fields of these sections only change how long a run goes, what it evaluates and logs, or where it
# runs: `--resume` accepts other values (`resume.check`).
MAY_CHANGE = frozenset({
    "steps", "resume", "stop_after", "save_every", "sft_save_every", "keep_checkpoints", "work_dir", "tensorboard",
    "wandb_project", "wandb_mode", "wandb_entity", "wandb_run_name", "math_verify_workers",
    "compilation_cache_dir", "compile_ahead", "profile_steps",
    "eval_every", "eval_batch_size", "eval_samples", "eval_temperature",
    "mesh", "sharding_rules", "coordinator_address", "num_processes", "process_id", "cpu_devices",
    "forward_rows", "forward_memory_budget", "attention", "decode_projections", "sampler", "num_slots",
    "lora_export_peft",
})

# Defaults an entry module sets over the fields' own, by method (`Config().replace(**PRESETS["flow_grpo"])`):
# `python -m experiments.flow_grpo` runs with these. Data here, so that reading them imports no method (nor JAX).
PRESETS = {
    "flow_grpo": dict(algo="flow_grpo", work_dir="runs/flow_grpo", sft_steps=300, sft_batch_size=64, steps=60,
                      batch_size=16, group_size=8, learning_rate=5e-5, eval_every=0, save_every=20),
}


class ConfigError(ValueError):
  """A configuration that cannot run, named in one line."""


class RunError(Exception):
  """A problem with the run's inputs (files, directories, data), reported as one line."""


@dataclasses.dataclass(frozen=True)
class Config:
  """A whole run: the sections above. Unset method-dependent values are resolved on construction."""
  model: PolicyConfig = PolicyConfig()
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


def _fields_with(key: str) -> dict[str, Any]:
  """Field name -> its `flag(...)` metadata `key`, for the fields that have one, in the sections' order."""
  return {f.name: f.metadata[key] for cls in SECTIONS.values() for f in dataclasses.fields(cls) if key in f.metadata}


CHOICES = _fields_with("choices")  # the allowed values of the enum fields (and flags)
_POSITIVE = tuple(name for name, least in _fields_with("minimum").items() if least == 1)
_NON_NEGATIVE = tuple(name for name, least in _fields_with("minimum").items() if least == 0)
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
    "shared_prompt_forward": ("grpo",), "advantage_scale": ("grpo", "flow_grpo"),
    "token_layout": ("grpo", "ppo", "distill"),
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
                                         "tool_time_limit", "tool_header", "answer_from_memory", "min_bucket",
                                         "planner_objective")},
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
    ("rm_update_lora_alpha", lambda v: v["rm_update_lora_rank"] > 0, "--rm_update_lora_rank > 0"),
    *((name, lambda v: v["iterations"] > 1, "--iterations > 1")
      for name in ("rm_update_eval_prompts", "reset_reference", "rm_update_lora_rank", "replay_reward_model_rows")),
    ("math_verify_time_limit", lambda v: "math_verify" in v["reward"], "--reward=math_verify:..."),
    ("math_verify_workers", lambda v: "math_verify" in v["reward"], "--reward=math_verify:..."),
    *((name, lambda v: v["task"] != "synthetic_paths", "--task=synthetic (the paths task has --paths_min_steps "
       "and --paths_max_steps)") for name in ("synthetic_min_steps", "synthetic_max_steps", "synthetic_digits",
                                               "synthetic_ops")),
    *((name, lambda v: v["task"] == "synthetic_paths", "--task=synthetic_paths")
      for name in ("paths_min_steps", "paths_max_steps")),
)
MAX_FORWARD_MEMORY_BUDGET = 1 << 20  # GiB: --forward_memory_budget above a PiB per device is a typo
MAX_TIME_LIMIT = 86400.0  # seconds: --math_verify_time_limit and --tool_time_limit
MAX_SYNTHETIC = 10_000_000  # problems of the synthetic task, all generated up front (tens of seconds per million)
SYNTHETIC_TASKS = ("synthetic", "synthetic_paths")  # the generated tasks, whose steps can be checked exactly


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
  """The first problem of `config` as one line, or None.

  The sections are checked in this order, and each in its own order: the first problem found is the one a user
  sees, so a later check may assume what an earlier one accepted (a number that is finite, a value among its choices).
  """
  v = config.flat()
  return (_check_each_field(v) or _check_ranges(v) or _check_limits(v) or _check_wandb(v)
          or _check_sizes(v, config.rows_per_step) or _check_model(v) or _check_reward(v)
          or _check_methods_options(v) or _check_policy_loss(v) or _check_distill(v)
          or _check_dpo_and_flow_grpo(v, config.rows_per_step) or _check_unread(v) or None)


def _check_each_field(v: dict) -> str | None:
  """Each field alone: a finite number, at least its `minimum`, one of its `choices`."""
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
  return None


def _check_ranges(v: dict) -> str | None:
  """The sampling and objective numbers in their ranges, and the rollout correction with the methods it weights."""
  algo = v["algo"]
  if v["group_size"] < (1 if algo in ("ppo", "distill") else 2):
    return ("--group_size must be >= 2 (GRPO compares samples within a group, RFT and DPO pick among them; "
            "PPO and distill accept 1)")
  for name in ("epsilon", "temperature", "eval_temperature", "learning_rate", "sft_learning_rate",
               "rm_update_learning_rate", "rm_update_lora_alpha", "dpo_beta", "likelihood_temperature"):
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
  return None


def _check_limits(v: dict) -> str | None:
  """What a run may claim of the machine: time limits, the synthetic task's size, memory, verifier workers."""
  for name in ("math_verify_time_limit", "tool_time_limit"):
    if not 0 < v[name] <= MAX_TIME_LIMIT:
      return f"--{name} must be in (0, {MAX_TIME_LIMIT:g}] seconds, not {v[name]}"
  if v["task"] in SYNTHETIC_TASKS and v["num_train"] + v["num_test"] > MAX_SYNTHETIC:
    return f"--num_train + --num_test of the synthetic task must be at most {MAX_SYNTHETIC:,} (generated up front)"
  if v["forward_memory_budget"] > MAX_FORWARD_MEMORY_BUDGET:
    return f"--forward_memory_budget must be at most {MAX_FORWARD_MEMORY_BUDGET} GiB, not {v['forward_memory_budget']}"
  if v["math_verify_workers"] < 0:
    return "--math_verify_workers must be >= 0"
  return None


def _check_wandb(v: dict) -> str | None:
  """The W&B options: a known mode, and a project for any of them."""
  if v["wandb_mode"] not in ("", "online", "offline", "disabled"):
    return f"--wandb_mode must be online, offline or disabled (empty: W&B's default), not {v['wandb_mode']!r}"
  if (v["wandb_entity"] or v["wandb_run_name"] or v["wandb_mode"]) and not v["wandb_project"]:
    return "--wandb_mode, --wandb_entity and --wandb_run_name need --wandb_project (W&B logging is off without it)"
  return None


def _check_sizes(v: dict, rows: int) -> str | None:
  """Sizes that must fit one another: the overlong buffer in a completion, the profiled steps in the run, the
  minibatches and forward chunks in a step's `rows`, the SFT batch in its accumulation."""
  if v["overlong_buffer"] > v["max_new_tokens"]:
    return "--overlong_buffer must be <= --max_new_tokens"
  try:
    window = profile_window(v["profile_steps"])
  except ValueError as err:
    return str(err)
  if window and window[1] > v["steps"]:
    return f"--profile_steps={v['profile_steps']} ends after the run's last step (--steps={v['steps']})"
  minibatch = v["minibatch_size"] or rows
  if minibatch % v["grad_accum_steps"] or rows % minibatch:
    return ("--minibatch_size (0: batch_size*group_size) must divide batch_size*group_size and be divisible by "
            "--grad_accum_steps")
  if v["forward_rows"] % v["group_size"]:
    return "--forward_rows must be a multiple of --group_size (a chunk holds whole groups)"
  if v["sft_steps"] and v["sft_batch_size"] % v["grad_accum_steps"]:
    return "--sft_batch_size must be divisible by --grad_accum_steps"
  return None


def _check_model(v: dict) -> str | None:
  """The embedded model's width and the LoRA adapters."""
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
  return None


def _check_reward(v: dict) -> str | None:
  """The reward and its supervision: step rewards and the tasks whose steps they check, a reward model for a
  learned reward, and iterative RL's learned reward."""
  reward = v["reward"]
  if v["supervision"] == "process" and reward not in STEP_REWARDS:
    return "--supervision=process needs --reward=prm (a process reward model) or exact_steps (synthetic task)"
  if reward == "exact_steps" and v["task"] not in SYNTHETIC_TASKS:
    return "--reward=exact_steps needs --task=synthetic or synthetic_paths, whose steps can be checked exactly"
  if not 2 <= v["paths_min_steps"] <= v["paths_max_steps"]:
    return "--paths_min_steps and --paths_max_steps need 2 <= min <= max"
  if (reward in ("orm", "prm")) != bool(v["reward_model"]):
    return "--reward=orm|prm and --reward_model=DIR go together"
  if v["iterations"] > 1 and (v["steps_per_iteration"] < 1 or reward not in ("orm", "prm")):
    return "--iterations > 1 needs --steps_per_iteration >= 1 and a learned reward (--reward=orm|prm)"
  return None


def _check_methods_options(v: dict) -> str | None:
  """Options only some methods take: process supervision, advantage estimators, iterative RL, a likelihood
  temperature."""
  algo = v["algo"]
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


def _first_changed(v: dict, names) -> str | None:
  """The first of `names` whose value in `v` is not its flag's default, or None."""
  return next((name for name in names if v[name] != default(name)), None)


def _check_distill(v: dict) -> str | None:
  """--algo=distill and its teacher."""
  if (v["algo"] == "distill") != bool(v["teacher_checkpoint"]):
    return "--algo=distill and --teacher_checkpoint=DIR (the frozen teacher, an HF directory) go together"
  if v["algo"] == "distill":
    if name := _first_changed(v, DISTILL_UNUSED):
      return f"--{name}: --algo=distill learns from its teacher, not a reward; leave it at its default"
    if v["reward"] in ("orm", "prm", "exact_steps"):
      return "--reward: --algo=distill only reports a rule reward; its signal is the teacher's"
  return None


def _check_dpo_and_flow_grpo(v: dict, rows: int) -> str | None:
  """DPO's pairs of rows, and the GRPO options and rewards Flow-GRPO does not use."""
  if v["algo"] == "dpo" and rows % 2:
    return "--algo=dpo needs an even batch_size*group_size (rows come in pairs)"
  if v["algo"] == "flow_grpo":
    if name := _first_changed(v, FLOW_UNSUPPORTED):
      return f"--{name} is a GRPO option that Flow-GRPO does not use; leave it at its default"
    if v["reward"] in ("orm", "prm", "exact_steps"):
      return "--reward: Flow-GRPO scores the generator's answer with rule rewards, not a reward model"
    if v["planner_objective"] == "sft" and (v["num_epochs"] != 1 or v["minibatch_size"]):
      return ("--planner_objective=sft updates once a step on the step's teacher trajectories: leave --num_epochs "
              "at 1 and --minibatch_size at 0")
  return None


def _check_unread(v: dict) -> str | None:
  """Options moved from their default that this run would not read (`READ_BY`, `READ_WITH`)."""
  algo = v["algo"]
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
