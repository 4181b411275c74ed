"""The runners' command line: one flag per `runner.Config` field, with that field's default.

The entry modules (`experiments/grpo_math.py`, `flow_grpo.py`, `train_reward_model.py`) import this module to
define the flags, then build their `Config` once in `main()` with `config_from_flags()`; nothing below them reads
a flag. Values are checked by `runner.Config` (one line naming the flag; absl checks only the enum choices at
parse time), so the same checks guard a config built in Python.
"""

import os
import shlex
import sys

from absl import app
from absl import flags
from absl import logging
import jax

from experiments.runner import config as config_lib
from experiments.runner import loop
from experiments.runner import preemption
from grpo_jax import data
from grpo_jax import distributed
from grpo_jax import host_memory
from grpo_jax import models
from grpo_jax import python_gc
from grpo_jax.training import checkpointing
from grpo_jax.training import logger as logger_lib

FLAGS = flags.FLAGS
ERRORS = (config_lib.RunError, models.CheckpointError, data.DatasetError, checkpointing.CheckpointError,
          FloatingPointError, ValueError, OSError)  # reported as one line, exit status 1
_D = {name: config_lib.default(name) for name in config_lib.Config().flat()}


def _choices(name: str) -> list[str]:
  return [c for c in config_lib.CHOICES[name] if c is not None]

# MODEL
flags.DEFINE_string("model", _D["model"],
    "Hugging Face checkpoint directory (Qwen2/2.5, Qwen3, Llama 3). Empty: the embedded tiny model, built in "
    "<work_dir>/base_model and warm-started by SFT.")
flags.DEFINE_string("init_checkpoint", _D["init_checkpoint"],
    "HF-format directory with the starting policy (skips SFT), e.g. a previous run's sft_policy or final_policy.")
flags.DEFINE_integer("tiny_layers", _D["tiny_layers"], "Embedded default model: decoder layers.")
flags.DEFINE_integer("tiny_hidden_size", _D["tiny_hidden_size"], "Embedded default model: hidden size (the MLP is 3x).")
flags.DEFINE_enum("dtype", _D["dtype"], _choices("dtype"), "Compute and parameter dtype.")
flags.DEFINE_bool("remat", _D["remat"], "Rematerialise each layer in the backward pass (saves memory).")
flags.DEFINE_enum("remat_policy", _D["remat_policy"], _choices("remat_policy"),
    "With --remat: what each layer keeps for the backward pass: nothing (full), its matmul outputs without a batch "
    "dimension (dots_no_batch), or all matmul outputs (dots).")
flags.DEFINE_bool("scan_layers", _D["scan_layers"],
    "Run the decoder layers as one lax.scan over stacked weights (compiles in a third of the time on deep models; "
    "the same HF checkpoints load and save). Checkpoints of the train state are layout-specific: resume with the "
    "same value.")
flags.DEFINE_bool("shared_prompt_forward", _D["shared_prompt_forward"],
    "GRPO: run each prompt once per group of G samples in the π_ref / π_old forwards and the update (its KV cache "
    "shared by the G completions): B·P + B·G·T tokens instead of B·G·(P + T), the same loss up to float rounding. "
    "Minibatches then shuffle whole groups; off when a micro-batch would split a group.")
flags.DEFINE_integer("logprob_chunk", _D["logprob_chunk"], "Sequence chunk of the memory-lean log-prob computation.")
flags.DEFINE_enum("attention", _D["attention"], _choices("attention"),
    "Attention of the training and scoring forwards (docs/scaling.md): einsum (the reference), xla "
    "(jax.nn.dot_product_attention), cudnn (its cuDNN flash kernel: NVIDIA GPU, bfloat16), pallas (the Pallas TPU "
    "flash kernel); auto: pallas on a TPU, cudnn on a GPU in bfloat16 (else xla), einsum on a CPU.")
flags.DEFINE_integer("lora_rank", _D["lora_rank"],
    "LoRA (docs/lora.md): > 0 trains rank-r adapters on --lora_targets with the base weights frozen (stage 2; the "
    "reference policy is the base with the adapters off, no second copy). 0: full fine-tuning.")
flags.DEFINE_float("lora_alpha", _D["lora_alpha"], "LoRA scale: the adapters add (x·A)·B·lora_alpha/lora_rank.")
flags.DEFINE_string("lora_targets", _D["lora_targets"],
    "LoRA: comma-separated projections to adapt, from q,k,v,o (attention) and gate,up,down (MLP).")
flags.DEFINE_bool("lora_export_peft", _D["lora_export_peft"],
    "LoRA: also write the adapters in PEFT's format (adapter_config.json, adapter_model.safetensors) to "
    "<work_dir>/final_adapter, beside the merged final_policy.")

# TASK AND DATA
flags.DEFINE_enum("task", _D["task"], _choices("task"), "The task.")
flags.DEFINE_string("train_file", _D["train_file"],
    "Training problems (gsm8k: question/answer; math: problem/solution[/level/type]): a JSONL or parquet file (or a "
    "glob of parquet files), a `datasets` save_to_disk folder, or a folder with train.jsonl, train[-*].parquet or a "
    "DatasetDict's train split (docs/integrations.md).")
flags.DEFINE_string("test_file", _D["test_file"], "Held-out problems, in the forms --train_file takes (split 'test').")
flags.DEFINE_integer("num_train", _D["num_train"], "Synthetic task: training problems in the pool.")
flags.DEFINE_integer("num_test", _D["num_test"], "Held-out problems to evaluate on (all of test_file if larger).")
flags.DEFINE_integer("num_validation", _D["num_validation"],
    "> 0: hold N problems of the RL pool (drawn by the seed) out of training and evaluate the final policy on them "
    "too (summary final_val_accuracy): a validation split for choosing hyperparameters without the test set.")
flags.DEFINE_integer("synthetic_min_steps", _D["synthetic_min_steps"], "Synthetic task: fewest operations per problem.")
flags.DEFINE_integer("synthetic_max_steps", _D["synthetic_max_steps"], "Synthetic task: most operations per problem.")
flags.DEFINE_integer("synthetic_digits", _D["synthetic_digits"], "Synthetic task: digits of + and - operands.")
flags.DEFINE_string("synthetic_ops", _D["synthetic_ops"], "Synthetic task: operations.")
flags.DEFINE_enum("prompt_template", _D["prompt_template"], _choices("prompt_template"),
    "auto: chat template for real datasets when the tokenizer has one, else plain text.")
flags.DEFINE_integer("max_prompt_len", _D["max_prompt_len"], "Prompt tokens (longer prompts are cut from the left).")
flags.DEFINE_string("reward", _D["reward"],
    "Reward spec 'name:weight,...' (correctness, format, arithmetic_format, boxed_format, step_correctness, "
    "math_verify: math-verify's symbolic check, docs/integrations.md), or a learned reward model: 'orm' (an orm or "
    "orm_steps model) or 'prm' with --reward_model (see --supervision, --iterations), or 'exact_steps': the synthetic "
    "task's exact step labels as a perfect PRM.")
flags.DEFINE_float("math_verify_time_limit", _D["math_verify_time_limit"],
    "--reward=math_verify: seconds one check may take; past it the check scores 0 and its worker process is killed "
    "and replaced.")
flags.DEFINE_integer("math_verify_workers", _D["math_verify_workers"],
    "--reward=math_verify: worker processes checking a step's completions in parallel (0: half the cores, 1 to 8).")
flags.DEFINE_integer("sft_examples", _D["sft_examples"],
    "SFT demonstrations: the first N training problems, with solutions; GRPO draws its prompts from the other "
    "problems (it needs answers only). 0: all.")

# STAGE 1: SFT WARM START
flags.DEFINE_integer("sft_steps", _D["sft_steps"], "SFT steps of the warm start (embedded default only; 0 skips).")
flags.DEFINE_integer("sft_batch_size", _D["sft_batch_size"], "SFT sequences per step.")
flags.DEFINE_float("sft_learning_rate", _D["sft_learning_rate"], "SFT peak learning rate (cosine decay).")

# ROLLOUTS
flags.DEFINE_integer("max_new_tokens", _D["max_new_tokens"], "Completion budget in tokens.")
flags.DEFINE_integer("batch_size", _D["batch_size"], "Prompts per step (B).")
flags.DEFINE_integer("group_size", _D["group_size"], "Samples per prompt (G); default 8, and 1 for --algo=ppo.")
flags.DEFINE_bool("dynamic_sampling", _D["dynamic_sampling"],
    "DAPO dynamic sampling: drop groups whose rewards are all equal and sample more prompts to refill the batch.")
flags.DEFINE_integer("dynamic_sampling_max_rounds", _D["dynamic_sampling_max_rounds"],
    "Most sampling rounds per step with dynamic sampling.")
flags.DEFINE_integer("overlong_buffer", _D["overlong_buffer"],
    "DAPO overlong shaping: L_cache tokens before max_new_tokens (0: off).")
flags.DEFINE_bool("mask_truncated", _D["mask_truncated"], "Leave completions that hit max_new_tokens out of the loss.")
flags.DEFINE_integer("completion_pad_multiple", _D["completion_pad_multiple"],
    "Training batches keep a step's completions up to the longest one, rounded up to a multiple of this (each new "
    "width compiles the scoring and update programs once; use 64-128 for long completions on an accelerator); 0 keeps "
    "all max_new_tokens columns.")
flags.DEFINE_enum("completion_widths", _D["completion_widths"], _choices("completion_widths"),
    "How --completion_pad_multiple rounds a step's longest completion: multiple (up to a multiple of it) or "
    "doubling (up to the smallest multiple * 2^k: at most log2(max_new_tokens / multiple) + 2 compiled widths of "
    "the scoring and update programs a run, for at most twice the columns).")
flags.DEFINE_enum("token_layout", _D["token_layout"], _choices("token_layout"),
    "GRPO/distill: the training rows' layout in the pi_ref / pi_old forwards and the update: padded (every row cut "
    "to the step's longest completion) or buckets (rows sorted by length into --bucket_micro_batches micro-batches, "
    "each at the narrowest of --bucket_widths halving widths that holds it: compute follows the tokens, and one "
    "program serves every length).")
flags.DEFINE_integer("bucket_micro_batches", _D["bucket_micro_batches"],
    "With --token_layout=buckets: length-sorted micro-batches of a step's rows in the forwards, and of a "
    "minibatch in the update (at least --grad_accum_steps there); more fit the lengths closer, fewer run wider "
    "matmuls.")
flags.DEFINE_integer("bucket_widths", _D["bucket_widths"],
    "With --token_layout=buckets: widths of the ladder, halving from --max_new_tokens and rounded up to "
    "--completion_pad_multiple (one compiled branch each).")
flags.DEFINE_float("temperature", _D["temperature"],
    "Sampling temperature of the rollouts; the policy trained is softmax(logits / temperature), so old, reference "
    "and new log-probs all use it.")
flags.DEFINE_float("top_p", _D["top_p"], "Nucleus sampling mass of the rollouts.")
flags.DEFINE_integer("top_k", _D["top_k"], "Top-k of the rollouts (0: off).")
flags.DEFINE_enum("sampler", _D["sampler"], _choices("sampler"),
    "Rollouts' and evaluation's sampler: engine (continuous batching over --num_slots decode slots: a finished "
    "completion's slot takes the next one, so a long tail of lengths costs its tokens) or static (every row decodes "
    "until the batch's longest ends). The same tokens for the same seed.")
flags.DEFINE_integer("num_slots", _D["num_slots"],
    "Decode slots of --sampler=engine over all devices (0: 4096 / --max_new_tokens a device on a CPU, at least 8; "
    "a quarter of the completions, at least 64, on an accelerator; fewer where --forward_memory_budget would not "
    "hold them).")

# STAGE 2: THE METHOD AND ITS LOSS
flags.DEFINE_enum("algo", _D["algo"], _choices("algo"),
    "Stage-2 method: grpo, ppo (with a critic), online_rft, rft, dpo (offline from the start policy), sft (human "
    "solutions), flow_grpo (the multi-turn planner with tools; experiments.flow_grpo sets its defaults) or distill "
    "(on-policy distillation from --teacher_checkpoint).")
flags.DEFINE_float("beta", _D["beta"], "KL coefficient β (0 removes the KL term and the reference forward).")
flags.DEFINE_float("epsilon", _D["epsilon"], "Clip range ε (lower side).")
flags.DEFINE_float("epsilon_high", _D["epsilon_high"], "Upper clip range (DAPO clip-higher, e.g. 0.28); default ε.")
flags.DEFINE_float("dual_clip", _D["dual_clip"], "Dual-clip constant c > 1 for negative advantages; default off.")
flags.DEFINE_enum("kl", _D["kl"], _choices("kl"),
    "KL estimator: in GRPO's loss (default k3, the paper's; k1's on-policy gradient is zero in expectation, so as a"
    " loss term it barely regularises), in PPO's per-token reward (default k1, eq. 2's log-ratio).")
flags.DEFINE_enum("loss_aggregation", _D["loss_aggregation"], _choices("loss_aggregation"),
    "Loss aggregation: GRPO's seq-mean-token-mean, DAPO's token-mean, Dr. GRPO's seq-mean-token-sum-norm.")
flags.DEFINE_enum("advantage_scale", _D["advantage_scale"], _choices("advantage_scale"),
    "Advantage normalisation: group std (GRPO), batch std, or none (Dr. GRPO).")
flags.DEFINE_float("advantage_eps", _D["advantage_eps"], "Added to the std of the advantage normalisation.")
flags.DEFINE_enum("importance", _D["importance"], _choices("importance"), "Importance ratio level (sequence: GSPO).")
flags.DEFINE_enum("loss", _D["loss"], _choices("loss"),
    "GRPO's policy term (docs/losses.md): clip (PPO's clipped surrogate: GRPO, DAPO, GSPO), cispo (MiniMax-M1: the "
    "importance weight clipped to at most 1 + --epsilon_high (default --epsilon) under a stop-gradient, times Â log π, "
    "so no token's gradient is dropped; no lower bound) or sapo (a sigmoid gate on the ratio in place of the clip, "
    "temperatures --sapo_tau_pos / --sapo_tau_neg). The KL term and --loss_aggregation apply to all three.")
flags.DEFINE_float("sapo_tau_pos", _D["sapo_tau_pos"], "--loss=sapo: the gate's temperature for tokens with Â > 0.")
flags.DEFINE_float("sapo_tau_neg", _D["sapo_tau_neg"],
    "--loss=sapo: the gate's temperature for tokens with Â <= 0 (the paper: above --sapo_tau_pos, so negative updates "
    "fade sooner).")
flags.DEFINE_float("entropy_coef", _D["entropy_coef"],
    "GRPO: c of an entropy bonus, -c times the policy's token-mean entropy added to the loss (whatever "
    "--loss_aggregation). 0: off.")
flags.DEFINE_float("top_entropy_quantile", _D["top_entropy_quantile"],
    "GRPO: ρ in (0, 1]: only the top ρ of each micro-batch's tokens by the policy's entropy keep their policy "
    "gradient (\"Beyond the 80/20 rule\": 0.2); the KL term and the normaliser keep every token. 1: off.")
flags.DEFINE_integer("num_epochs", _D["num_epochs"], "μ: passes over each step's samples.")
flags.DEFINE_integer("minibatch_size", _D["minibatch_size"], "Sequences per optimiser step (0: all B·G of the step).")
flags.DEFINE_integer("grad_accum_steps", _D["grad_accum_steps"], "Micro-batches per minibatch, accumulated exactly.")
flags.DEFINE_bool("recompute_old_logprobs", _D["recompute_old_logprobs"],
    "Recompute π_old with a forward pass instead of taking it exactly as stop_gradient(π_θ) (GRPO with one epoch "
    "over one minibatch: the default) or from the sampler's log-probs (at temperature 1).")
flags.DEFINE_enum("rollout_correction", _D["rollout_correction"], _choices("rollout_correction"),
    "GRPO/PPO: correct the policy gradient for the gap between the sampler's and the trainer's log-probs of the "
    "sampled tokens (always logged as train/mismatch_*), with ratio ρ = π_trainer/π_sampler: token_tis / seq_tis "
    "weigh each token by min(ρ, --rollout_correction_upper), of the token or of its whole sequence (truncated IS); "
    "token_mis / seq_mis weigh it by ρ inside [--rollout_correction_lower, --rollout_correction_upper] and drop it "
    "outside (masked IS). With temperature 1, π_old is then recomputed by a forward instead of taken from the sampler.")
flags.DEFINE_float("rollout_correction_lower", _D["rollout_correction_lower"],
    "--rollout_correction=token_mis|seq_mis: the lowest ratio kept, in [0, 1] (0: bounded from above only).")
flags.DEFINE_float("rollout_correction_upper", _D["rollout_correction_upper"],
    "--rollout_correction: C of truncated IS (token_tis, seq_tis), the highest ratio kept by masked IS; >= 1.")
flags.DEFINE_enum("advantage_estimator", _D["advantage_estimator"], _choices("advantage_estimator"),
    "GRPO's advantages: group (normalised within the G samples of a prompt, --advantage_scale), rloo (r_i minus the"
    " mean of the other G-1 rewards, unscaled), or reinforce_pp (REINFORCE++: the KL penalty β·--kl (default k1) in"
    " every token's reward instead of the loss, returns whitened over the batch).")
flags.DEFINE_float("gamma", _D["gamma"], "PPO: discount γ of GAE.")
flags.DEFINE_float("gae_lambda", _D["gae_lambda"], "PPO: GAE λ.")
flags.DEFINE_float("value_learning_rate", _D["value_learning_rate"],
    "PPO: peak learning rate of the value model; default --learning_rate.")
flags.DEFINE_float("value_clip", _D["value_clip"],
    "PPO: value-loss clip range around the sampling-time values (0: unclipped).")
flags.DEFINE_float("value_coef", _D["value_coef"],
    "PPO: weight of the value loss (separate optimisers, so it only rescales the critic's gradient before "
    "clipping).")
flags.DEFINE_bool("whiten_advantages", _D["whiten_advantages"],
    "PPO: whiten GAE advantages over the batch's completion tokens.")
flags.DEFINE_string("value_init", _D["value_init"],
    "PPO: the value model's backbone: 'policy' (the start policy's) or an HF-format checkpoint directory (e.g. a "
    "reward model's backbone).")
flags.DEFINE_float("dpo_beta", _D["dpo_beta"], "DPO: β of the implicit reward.")
flags.DEFINE_float("dpo_nll_coef", _D["dpo_nll_coef"],
    "DPO: α of the chosen output's length-normalised NLL added to the loss (Iterative RPO, arXiv 2404.19733, "
    "uses 1); 0 is plain DPO.")
flags.DEFINE_integer("dpo_pairs_per_prompt", _D["dpo_pairs_per_prompt"], "DPO: most (correct, wrong) pairs per prompt.")
flags.DEFINE_string("teacher_checkpoint", _D["teacher_checkpoint"],
    "--algo=distill: the frozen teacher, an HF-format directory with the policy's tokenizer (a larger model, or e.g. "
    "another run's final_policy); the student learns from the per-token reverse KL to it on its own samples.")
flags.DEFINE_integer("offline_prompts", _D["offline_prompts"],
    "RFT/DPO: training prompts sampled once from the start policy (G samples each) to build the offline dataset.")
flags.DEFINE_float("likelihood_temperature", _D["likelihood_temperature"],
    "SFT/RFT/Online RFT: the temperature T of the likelihood log softmax(logits / T) they train (1: the model's "
    "own); set it to --temperature to have every method train one likelihood (GRPO and PPO train --temperature's).")

# OPTIMISER
flags.DEFINE_integer("steps", _D["steps"], "Stage-2 steps (each: collect, then μ epochs of updates).")
flags.DEFINE_float("learning_rate", _D["learning_rate"], "Stage-2 peak learning rate (the policy's).")
flags.DEFINE_enum("lr_schedule", _D["lr_schedule"], _choices("lr_schedule"),
    "After warm-up: constant, or cosine decay to 10% over the run's optimiser steps.")
flags.DEFINE_integer("warmup_steps", _D["warmup_steps"], "Linear warm-up of the learning rate, in optimiser steps.")
flags.DEFINE_float("weight_decay", _D["weight_decay"], "AdamW weight decay of the GRPO stage.")
flags.DEFINE_float("max_grad_norm", _D["max_grad_norm"], "Global-norm gradient clipping (0: off).")

# LEARNED REWARDS AND ITERATIVE RL
flags.DEFINE_string("reward_model", _D["reward_model"],
    "With --reward=orm|prm: a reward-model directory written by experiments.train_reward_model (HF-format backbone "
    "+ reward_head.safetensors).")
flags.DEFINE_enum("supervision", _D["supervision"], _choices("supervision"),
    "outcome: one reward per completion (GRPO+OS); process: a PRM reward per step (GRPO+PS, needs --reward=prm).")
flags.DEFINE_bool("process_center_tokens", _D["process_center_tokens"],
    "GRPO+PS: subtract the group's mean token advantage (a constant baseline; the paper's suffix sums drift "
    "negative when later steps score lower). See losses.process_advantages.")
flags.DEFINE_integer("prm_max_steps", _D["prm_max_steps"],
    "PRM and orm_steps: most scored steps per completion (the first K-1 and the last).")
flags.DEFINE_integer("iterations", _D["iterations"],
    "Iterative RL: iterations I (1: plain RL, the reward model stays frozen).")
flags.DEFINE_integer("steps_per_iteration", _D["steps_per_iteration"],
    "Iterative RL: policy steps M per iteration; the run is I*M steps.")
flags.DEFINE_float("replay_fraction", _D["replay_fraction"],
    "Iterative RL: share of historical data in each reward-model update.")
flags.DEFINE_integer("replay_capacity", _D["replay_capacity"],
    "Iterative RL: most historical reward-model rows kept (a uniform sample of all rows seen).")
flags.DEFINE_integer("rm_update_prompts", _D["rm_update_prompts"],
    "Iterative RL: prompts sampled (G each) from the current policy to retrain the reward model at the end of an "
    "iteration.")
flags.DEFINE_integer("rm_update_steps", _D["rm_update_steps"],
    "Iterative RL: reward-model optimiser steps per iteration.")
flags.DEFINE_integer("rm_update_batch_size", _D["rm_update_batch_size"], "Iterative RL: reward-model rows per step.")
flags.DEFINE_float("rm_update_learning_rate", _D["rm_update_learning_rate"],
    "Iterative RL: reward-model learning rate (constant after a 10-step warm-up).")

# EVALUATION
flags.DEFINE_integer("eval_every", _D["eval_every"], "Evaluate every N GRPO steps (0: only before and after).")
flags.DEFINE_integer("eval_batch_size", _D["eval_batch_size"], "Prompts per evaluation batch.")
flags.DEFINE_integer("eval_samples", _D["eval_samples"],
    "k > 0: also sample k completions per problem for maj@k and pass@k.")
flags.DEFINE_float("eval_temperature", _D["eval_temperature"], "Temperature of the maj@k / pass@k samples.")

# RUN, CHECKPOINTS, LOGS
flags.DEFINE_string("work_dir", _D["work_dir"], "Directory for checkpoints, logs and exported models.")
flags.DEFINE_integer("save_every", _D["save_every"], "Checkpoint every N training steps (stage 2's, or the reward model's).")
flags.DEFINE_integer("keep_checkpoints", _D["keep_checkpoints"], "Checkpoints to keep.")
flags.DEFINE_bool("resume", _D["resume"], "Continue from the latest checkpoint in work_dir.")
flags.DEFINE_integer("stop_after", _D["stop_after"],
    "Stop (as if interrupted) after this GRPO step, after saving; 0: off.")
flags.DEFINE_bool("tensorboard", _D["tensorboard"], "Write TensorBoard event files.")
flags.DEFINE_string("wandb_project", _D["wandb_project"],
    "Also log to Weights & Biases, in this project (pip install 'grpo_jax[wandb]'): the same metrics, the run's "
    "config; --resume continues the same W&B run (its id is kept in <work_dir>/wandb_run_id). Empty: off.")
flags.DEFINE_string("wandb_mode", _D["wandb_mode"],
    "W&B mode: online, offline (files under <work_dir>/wandb, uploaded later by `wandb sync`) or disabled. Empty: "
    "W&B's default (WANDB_MODE, else online).")
flags.DEFINE_string("wandb_entity", _D["wandb_entity"], "W&B entity (team or user); empty: your default.")
flags.DEFINE_string("wandb_run_name", _D["wandb_run_name"], "W&B run name; empty: W&B chooses one.")
flags.DEFINE_integer("seed", _D["seed"], "Random seed of data order, sampling and initialisation.")
flags.DEFINE_string("compilation_cache_dir", _D["compilation_cache_dir"],
    "JAX's on-disk compilation cache: a later run of the same programs (the same model, shapes and flags that "
    "shape them) loads them instead of compiling. Empty: off. JAX_COMPILATION_CACHE_DIR, when set, wins.")
flags.DEFINE_string("profile_steps", _D["profile_steps"],
    "FIRST:LAST: trace stage-2 steps FIRST to LAST (both included) with jax.profiler into <work_dir>/profile "
    "(TensorBoard's profile plugin, Perfetto) and print each compiled program's runs, time and op kinds. Empty: off.")

# DEVICES AND PROCESSES
flags.DEFINE_string("mesh", _D["mesh"],
    "Device mesh, e.g. 'data:2,fsdp:2,tensor:2' (one size may be -1: the remaining devices). Empty: one device (or,"
    " with several processes, every device on the data axis).")
flags.DEFINE_enum("sharding_rules", _D["sharding_rules"], _choices("sharding_rules"),
    "How params, optimiser state and activations map onto the mesh: dp (replicated params), fsdp (params split over"
    " fsdp), fsdp_tp (+ tensor).")
flags.DEFINE_string("coordinator_address", _D["coordinator_address"],
    "Multi-host: host:port of process 0's coordinator (or JAX_COORDINATOR_ADDRESS). Every process runs the same "
    "command.")
flags.DEFINE_integer("num_processes", _D["num_processes"], "Multi-host: number of processes (or JAX_NUM_PROCESSES).")
flags.DEFINE_integer("process_id", _D["process_id"], "Multi-host: this process's index (or JAX_PROCESS_ID).")
flags.DEFINE_integer("cpu_devices", _D["cpu_devices"],
    "One process on a CPU without --mesh: present the CPU as this many devices (0: one per core; 1: off) and split "
    "the sampler's rows over them (the same tokens as one device, each core decoding its own rows); training and "
    "scoring stay on the first. Ignored on GPU/TPU, with --mesh, several processes, or XLA_FLAGS' "
    "--xla_force_host_platform_device_count.")
flags.DEFINE_integer("forward_rows", _D["forward_rows"],
    "Rows per chunk of the forwards over a step's batch_size*group_size rows (π_ref, π_old, reward model, values), "
    "looped inside one program (a multiple of group_size). 0: as many as --forward_memory_budget holds.")
flags.DEFINE_float("forward_memory_budget", _D["forward_memory_budget"],
    "GiB per device for one chunk's activations in those forwards, and for the sampler's KV cache (prompts in "
    "chunks when all would not fit). 0: a quarter of an accelerator's memory, 4 GiB on a CPU.")


# FLOW-GRPO'S AGENT (--algo=flow_grpo)
flags.DEFINE_integer("max_turns", _D["max_turns"],
    "T_max: most planner turns per trajectory (training and evaluation).")
flags.DEFINE_integer("memory_budget", _D["memory_budget"],
    "Tokens of memory text in the planner's prompt; the oldest turns are dropped (and summarised in one line) "
    "beyond it.")
flags.DEFINE_integer("planner_prompt_len", _D["planner_prompt_len"],
    "Planner prompt budget in tokens (query + memory + cue).")
flags.DEFINE_integer("action_tokens", _D["action_tokens"], "Token budget of one action.")
flags.DEFINE_string("tools", _D["tools"], "The toolset K, from calc, frac, recall.")
flags.DEFINE_float("tool_time_limit", _D["tool_time_limit"],
    "Seconds a tool call may take before it is an error observation.")
flags.DEFINE_bool("tool_header", _D["tool_header"],
    "Describe the tools and the action format at the top of every prompt (for instruction-tuned models; the tiny "
    "default learns the format from SFT).")
flags.DEFINE_bool("answer_from_memory", _D["answer_from_memory"],
    "Without a final-answer action, the generator answers with the last tool result in memory.")
flags.DEFINE_integer("min_bucket", _D["min_bucket"],
    "Smallest padded active-set size of a turn (row counts are padded up to powers of two, so jit compiles a few "
    "shapes, not one per turn).")


def config_from_flags(**overrides) -> config_lib.Config:
  """The `Config` of the parsed flags (fields without a defined flag keep their defaults), with `overrides`."""
  values = {name: FLAGS[name].value for name in config_lib.Config().flat() if name in FLAGS}
  values.update(overrides)
  return config_lib.from_flat(values)


def run_from_flags(**overrides) -> dict:
  """`loop.run` of the parsed flags' config."""
  return loop.run(config_from_flags(**overrides))


def enable_compilation_cache(path: str) -> None:
  """JAX's persistent compilation cache in `path`, every program kept (JAX's default keeps only those over a second
  of compile time, which leaves out most of a run's programs), unless
  JAX_COMPILATION_CACHE_DIR already chose a directory (or JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS a threshold)
  or `path` is empty."""
  if path and not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def split_cpu(devices: int) -> None:
  """Presents the CPU as `devices` devices (0: one per core) for a one-process run without a mesh, before JAX starts
  its backends; left alone when XLA_FLAGS or JAX_NUM_CPU_DEVICES already set the count, or when the backends are
  already up (a `main` called from a program that ran JAX first keeps its devices). On a GPU or TPU it only adds CPU
  devices that nothing uses."""
  if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "") or "JAX_NUM_CPU_DEVICES" in os.environ:
    return
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
  try:
    jax.config.update("jax_num_cpu_devices", devices or cores)
  except RuntimeError:
    return  # the backends are up (JAX ran before this main): the CPU keeps the devices it has


def resume_command(name: str, argv=None, resume: bool = True) -> str:
  """The command line that continues this run: the program as it was started (`python -m experiments.<name>`,
  or its script) with its arguments, and `--resume` in place of any resume flag it had (none: `resume` False)."""
  argv = list(sys.argv if argv is None else argv)
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  if spec is not None and spec.name:
    program = ["-m", spec.name]
  else:
    program = [argv[0]] if argv else ["-m", f"experiments.{name}"]
  args = [a for a in argv[1:] if a.split("=")[0] not in ("--resume", "--noresume")]
  return shlex.join([sys.executable, *program, *args] + (["--resume"] if resume else []))


def report_interrupted(name: str, err: preemption.Interrupted) -> None:
  """One line: where the run stopped, and the command that continues it."""
  logger_lib.end_progress_line()
  how = (f"continue with: {resume_command(name)}" if err.saved is not None
         else f"run it again: {resume_command(name, resume=False)}")
  print(f"{name}: {err}; {how}", file=sys.stderr)


def main_for(name: str, job=None, **overrides):
  """`main(argv)` of the runner called `name`: flags -> config -> `job(config)` (default: the training loop),
  errors as one line."""

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    python_gc.collect_less()  # the imports' objects out of every collection; fewer full collections
    if host_memory.cpu_only():  # before JAX's first computation
      host_memory.retain_freed_memory()
    try:
      config = config_from_flags(**overrides)
      mesh = config.mesh
      several = mesh.coordinator_address or mesh.num_processes or os.environ.get("JAX_COORDINATOR_ADDRESS")
      if not (mesh.mesh or several):
        split_cpu(mesh.cpu_devices)
      distributed.initialize(mesh.coordinator_address or None, mesh.num_processes, mesh.process_id)  # first
    except ValueError as err:
      sys.exit(f"{name}: error: {err}")
    enable_compilation_cache(config.run.compilation_cache_dir)
    if not FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO; -v 0 brings it back
    try:
      (job or loop.run)(config)
    except preemption.Interrupted as err:  # SIGTERM / SIGINT: the step saved; 128 + the signal (143, 130)
      report_interrupted(name, err)
      sys.exit(err.exit_status)
    except ERRORS as err:
      logger_lib.end_progress_line()
      sys.exit(f"{name}: error: {err}")
    except jax.errors.JaxRuntimeError as err:
      if "RESOURCE_EXHAUSTED" not in str(err):
        raise
      logger_lib.end_progress_line()  # a size no device holds (a model width, a batch, a completion budget)
      first = str(err).strip().splitlines()[0].rstrip(".")
      sys.exit(f"{name}: error: out of memory: {first}; lower the sizes the flags set (--batch_size, --group_size, "
               "--max_new_tokens, the model's), or --forward_memory_budget")
    except BaseException:
      logger_lib.end_progress_line()
      raise

  return main
