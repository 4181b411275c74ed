r"""GRPO (and PPO, SFT, RFT, Online RFT, DPO) on math word problems: SFT warm start, then RL.

  python -m experiments.grpo_math                       # embedded default: tiny model, synthetic task, CPU
  python -m experiments.grpo_math --algo=ppo --batch_size=256   # PPO with a critic, same samples per step
  python -m experiments.grpo_math --flagfile=experiments/configs/deepseekmath_gsm8k.cfg \
      --model=/path/to/Qwen2.5-0.5B-Instruct --train_file=gsm8k/train.jsonl --test_file=gsm8k/test.jsonl

Stage 1 (embedded default only) fine-tunes the random-init tiny model on the task's step-by-step
solutions, because RL needs a policy that is sometimes right. Stage 2 is GRPO as in DeepSeekMath
(arXiv 2402.03300) §4.1: per step, B prompts, G samples each from π_old; rule rewards; group-normalised
advantages; μ epochs of minibatch updates of the clipped surrogate with the k3 KL to the frozen
reference (the stage-1 policy) in the loss. Every knob of the later variants (DAPO, Dr. GRPO, GSPO) is
a flag. `--algo` picks another method of DeepSeekMath's unified paradigm (§5.2.1, Table 10;
`experiments/methods/`): each is a data source and a gradient coefficient over the same sampler,
rewards, update step, evaluation, logging and checkpoints. Policy, value model, reference and
optimiser state are pytrees; checkpoints resume exactly.
"""

import json
import math
import pathlib
import resource
import shutil
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from experiments import methods as methods_lib
from experiments.methods import learned_reward
from experiments.methods import resume as resume_lib
from grpo_jax import data
from grpo_jax import distributed
from grpo_jax import evaluation
from grpo_jax import losses
from grpo_jax import models
from grpo_jax import rewards as rewards_lib
from grpo_jax import training
from grpo_jax.training import checkpointing
from grpo_jax.training import update as update_lib

# MODEL AND DATA
flags.DEFINE_string("work_dir", "runs/grpo_math", "Directory for checkpoints, logs and exported models.")
flags.DEFINE_string("model", "", "Hugging Face checkpoint directory (Qwen2/2.5, Qwen3, Llama 3). "
                    "Empty: the embedded tiny model, built in <work_dir>/base_model and warm-started by SFT.")
flags.DEFINE_string("init_checkpoint", "", "HF-format directory with the starting policy (skips SFT), "
                    "e.g. a previous run's sft_policy or final_policy.")
flags.DEFINE_integer("tiny_layers", 4, "Embedded default model: decoder layers.")
flags.DEFINE_integer("tiny_hidden_size", 128, "Embedded default model: hidden size (the MLP is 3x).")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute and parameter dtype.")
flags.DEFINE_bool("remat", False, "Rematerialise each layer in the backward pass (saves memory).")
flags.DEFINE_enum("remat_policy", "full", list(models.config.REMAT_POLICIES), "With --remat: what each layer keeps "
                  "for the backward pass: nothing (full), its matmul outputs without a batch dimension "
                  "(dots_no_batch), or all matmul outputs (dots).")
flags.DEFINE_bool("scan_layers", False, "Run the decoder layers as one lax.scan over stacked weights (compiles in "
                  "a third of the time on deep models; the same HF checkpoints load and save). Checkpoints of the "
                  "train state are layout-specific: resume with the same value.")
flags.DEFINE_enum("task", "synthetic", ["synthetic", "gsm8k", "math"], "The task.")
flags.DEFINE_string("train_file", "", "JSONL training problems (gsm8k: question/answer; math: problem/solution).")
flags.DEFINE_string("test_file", "", "JSONL held-out problems.")
flags.DEFINE_integer("num_train", 20000, "Synthetic task: training problems in the pool.")
flags.DEFINE_integer("num_test", 500, "Held-out problems to evaluate on (all of test_file if larger).")
flags.DEFINE_integer("synthetic_min_steps", 2, "Synthetic task: fewest operations per problem.")
flags.DEFINE_integer("synthetic_max_steps", 3, "Synthetic task: most operations per problem.")
flags.DEFINE_integer("synthetic_digits", 1, "Synthetic task: digits of + and - operands.")
flags.DEFINE_string("synthetic_ops", "+-*", "Synthetic task: operations.")
flags.DEFINE_enum("prompt_template", "auto", ["auto", "plain", "chat"],
                  "auto: chat template for real datasets when the tokenizer has one, else plain text.")
flags.DEFINE_integer("max_prompt_len", 16, "Prompt tokens (longer prompts are cut from the left).")
flags.DEFINE_integer("max_new_tokens", 40, "Completion budget in tokens.")
flags.DEFINE_string("reward", "correctness:1.0", "Reward spec 'name:weight,...' (correctness, format, "
                    "arithmetic_format, boxed_format, step_correctness), or a learned reward model: 'orm' (an orm "
                    "or orm_steps model) or 'prm' with --reward_model (see --supervision, --iterations), or "
                    "'exact_steps': the synthetic task's exact step labels as a perfect PRM.")

# STAGE 1: SFT
flags.DEFINE_integer("sft_examples", 2000, "SFT demonstrations: the first N training problems, with solutions; "
                     "GRPO draws its prompts from the other problems (it needs answers only). 0: all.")
flags.DEFINE_integer("sft_steps", 600, "SFT steps of the warm start (embedded default only; 0 skips).")
flags.DEFINE_integer("sft_batch_size", 32, "SFT sequences per step.")
flags.DEFINE_float("sft_learning_rate", 3e-3, "SFT peak learning rate (cosine decay).")

# STAGE 2: GRPO OR ANOTHER METHOD OF THE PARADIGM
flags.DEFINE_enum("algo", "grpo", list(methods_lib.METHODS), "Stage-2 method: grpo, ppo (with a critic), "
                  "online_rft, rft, dpo (offline from the start policy) or sft (human solutions).")
flags.DEFINE_integer("steps", 200, "Stage-2 steps (each: collect, then μ epochs of updates).")
flags.DEFINE_integer("batch_size", 32, "Prompts per step (B).")
flags.DEFINE_integer("group_size", None, "Samples per prompt (G); default 8, and 1 for --algo=ppo.")
flags.DEFINE_float("learning_rate", 3e-4, "Stage-2 peak learning rate (the policy's).")
flags.DEFINE_enum("lr_schedule", "cosine", ["constant", "cosine"], "After warm-up: constant, or cosine decay "
                  "to 10% over the run's optimiser steps.")
flags.DEFINE_integer("warmup_steps", 5, "Linear warm-up of the learning rate, in optimiser steps.")
flags.DEFINE_float("weight_decay", 0.0, "AdamW weight decay of the GRPO stage.")
flags.DEFINE_float("max_grad_norm", 1.0, "Global-norm gradient clipping (0: off).")
flags.DEFINE_float("beta", 0.04, "KL coefficient β (0 removes the KL term and the reference forward).")
flags.DEFINE_float("epsilon", 0.2, "Clip range ε (lower side).")
flags.DEFINE_float("epsilon_high", None, "Upper clip range (DAPO clip-higher, e.g. 0.28); default ε.")
flags.DEFINE_float("dual_clip", None, "Dual-clip constant c > 1 for negative advantages; default off.")
flags.DEFINE_enum("kl", None, ["k1", "k2", "k3"], "KL estimator: in GRPO's loss (default k3, the paper's; k1's "
                  "on-policy gradient is zero in expectation, so as a loss term it barely regularises), in PPO's "
                  "per-token reward (default k1, eq. 2's log-ratio).")
flags.DEFINE_enum("loss_aggregation", "seq-mean-token-mean", list(losses.aggregation.MODES),
                  "Loss aggregation: GRPO's seq-mean-token-mean, DAPO's token-mean, Dr. GRPO's seq-mean-token-sum-norm.")
flags.DEFINE_enum("advantage_scale", "group", ["group", "batch", "none"],
                  "Advantage normalisation: group std (GRPO), batch std, or none (Dr. GRPO).")
flags.DEFINE_float("advantage_eps", 1e-4, "Added to the std of the advantage normalisation.")
flags.DEFINE_enum("importance", "token", ["token", "sequence"], "Importance ratio level (sequence: GSPO).")
flags.DEFINE_integer("num_epochs", 1, "μ: passes over each step's samples.")
flags.DEFINE_integer("minibatch_size", 0, "Sequences per optimiser step (0: all B·G of the step).")
flags.DEFINE_integer("grad_accum_steps", 1, "Micro-batches per minibatch, accumulated exactly.")
flags.DEFINE_bool("dynamic_sampling", False, "DAPO dynamic sampling: drop groups whose rewards are all equal "
                  "and sample more prompts to refill the batch.")
flags.DEFINE_integer("dynamic_sampling_max_rounds", 4, "Most sampling rounds per step with dynamic sampling.")
flags.DEFINE_integer("overlong_buffer", 0, "DAPO overlong shaping: L_cache tokens before max_new_tokens (0: off).")
flags.DEFINE_bool("mask_truncated", False, "Leave completions that hit max_new_tokens out of the loss.")
flags.DEFINE_float("temperature", 0.7, "Sampling temperature of the rollouts; the policy trained is "
                   "softmax(logits / temperature), so old, reference and new log-probs all use it.")
flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass of the rollouts.")
flags.DEFINE_integer("top_k", 0, "Top-k of the rollouts (0: off).")
flags.DEFINE_bool("recompute_old_logprobs", False, "Recompute π_old with a forward pass instead of taking it "
                  "exactly as stop_gradient(π_θ) (GRPO with one epoch over one minibatch: the default) or from the "
                  "sampler's log-probs (at temperature 1).")
flags.DEFINE_integer("logprob_chunk", 128, "Sequence chunk of the memory-lean log-prob computation.")

# EVALUATION, LOGGING, CHECKPOINTS
flags.DEFINE_integer("eval_every", 100, "Evaluate every N GRPO steps (0: only before and after).")
flags.DEFINE_integer("eval_batch_size", 250, "Prompts per evaluation batch.")
flags.DEFINE_integer("eval_samples", 0, "k > 0: also sample k completions per problem for maj@k and pass@k.")
flags.DEFINE_float("eval_temperature", 0.7, "Temperature of the maj@k / pass@k samples.")
flags.DEFINE_integer("save_every", 50, "Checkpoint every N GRPO steps.")
flags.DEFINE_integer("keep_checkpoints", 2, "Checkpoints to keep.")
flags.DEFINE_bool("resume", False, "Continue from the latest checkpoint in work_dir.")
flags.DEFINE_integer("stop_after", 0, "Stop (as if interrupted) after this GRPO step, after saving; 0: off.")
flags.DEFINE_bool("tensorboard", True, "Write TensorBoard event files.")
flags.DEFINE_integer("seed", 0, "Random seed of data order, sampling and initialisation.")

FLAGS = flags.FLAGS


def _validators():
  positive = ["tiny_layers", "sft_batch_size", "num_train", "num_test", "max_prompt_len", "max_new_tokens", "batch_size", "num_epochs",
              "grad_accum_steps", "eval_batch_size", "keep_checkpoints", "dynamic_sampling_max_rounds"]
  for name in positive:
    flags.register_validator(name, lambda v: v is not None and v >= 1, message=f"--{name} must be >= 1")
  for name in ["steps", "sft_steps", "sft_examples", "eval_every", "save_every", "minibatch_size", "overlong_buffer",
               "eval_samples", "stop_after", "top_k"]:
    flags.register_validator(name, lambda v: v >= 0, message=f"--{name} must be >= 0")
  flags.register_multi_flags_validator(
      ["group_size", "algo"], lambda f: f["group_size"] is None or f["group_size"] >= (1 if f["algo"] == "ppo" else 2),
      message="--group_size must be >= 2 (GRPO compares samples within a group, RFT and DPO pick among them; "
              "PPO accepts 1)")
  flags.register_validator("epsilon", lambda v: v > 0, message="--epsilon must be > 0")
  flags.register_validator("epsilon_high", lambda v: v is None or v > 0, message="--epsilon_high must be > 0")
  flags.register_validator("dual_clip", lambda v: v is None or v > 1, message="--dual_clip must be > 1")
  flags.register_validator("beta", lambda v: v >= 0, message="--beta must be >= 0")
  flags.register_validator("temperature", lambda v: v > 0, message="--temperature must be > 0")
  flags.register_validator("eval_temperature", lambda v: v > 0, message="--eval_temperature must be > 0")
  flags.register_validator("top_p", lambda v: 0 < v <= 1, message="--top_p must be in (0, 1]")
  for name in ["learning_rate", "sft_learning_rate"]:
    flags.register_validator(name, lambda v: v > 0, message=f"--{name} must be > 0")
  flags.register_validator("max_grad_norm", lambda v: v >= 0, message="--max_grad_norm must be >= 0")
  flags.register_validator("advantage_eps", lambda v: v >= 0, message="--advantage_eps must be >= 0")
  flags.register_multi_flags_validator(
      ["overlong_buffer", "max_new_tokens"], lambda f: f["overlong_buffer"] <= f["max_new_tokens"],
      message="--overlong_buffer must be <= --max_new_tokens")


  flags.register_multi_flags_validator(
      ["batch_size", "group_size", "minibatch_size", "grad_accum_steps", "algo"],
      lambda f: ((f["minibatch_size"] or f["batch_size"] * _group_size(f)) % f["grad_accum_steps"] == 0
                 and (f["batch_size"] * _group_size(f)) % (f["minibatch_size"] or 1) == 0),
      message="--minibatch_size (0: batch_size*group_size) must divide batch_size*group_size and be divisible "
              "by --grad_accum_steps")
  flags.register_multi_flags_validator(
      ["sft_steps", "sft_batch_size", "grad_accum_steps"],
      lambda f: f["sft_steps"] == 0 or f["sft_batch_size"] % f["grad_accum_steps"] == 0,
      message="--sft_batch_size must be divisible by --grad_accum_steps")
  heads = models.tiny_config().num_attention_heads
  flags.register_validator(
      "tiny_hidden_size", lambda v: v is not None and v >= 1 and v % (2 * heads) == 0,
      message=f"--tiny_hidden_size must be a positive multiple of {2 * heads} (the embedded model's {heads} attention "
              f"heads each need an even head size for RoPE)")
  learned_reward.register_validators()


def _group_size(values) -> int:
  return values["group_size"] or (1 if values["algo"] == "ppo" else 8)


_validators()


class RunError(Exception):
  """A problem with the run's inputs, reported as one line."""


# TASK


class Task:
  """Training pool, held-out set, prompt format and rewards of the chosen task."""

  def __init__(self, tokenizer, sft_lineage: bool):
    if FLAGS.task == "synthetic":
      config = data.SyntheticConfig(min_steps=FLAGS.synthetic_min_steps, max_steps=FLAGS.synthetic_max_steps,
                                    max_digits=FLAGS.synthetic_digits, ops=FLAGS.synthetic_ops)
      self.train, self.test = data.make_splits(FLAGS.num_train, FLAGS.num_test, seed=FLAGS.seed, config=config)
    else:
      for name in ("train_file", "test_file"):
        if not getattr(FLAGS, name):
          raise RunError(f"--task={FLAGS.task} needs --{name} (a JSONL file)")
      self.train = data.load_task(FLAGS.task, "train", path=FLAGS.train_file)
      self.test = data.load_task(FLAGS.task, "test", path=FLAGS.test_file)[:FLAGS.num_test]
      if not self.train or not self.test:
        raise RunError(f"no problems in {FLAGS.train_file if not self.train else FLAGS.test_file}")
    template = FLAGS.prompt_template
    if template == "auto":
      template = "chat" if FLAGS.task != "synthetic" and getattr(tokenizer, "chat_template", None) else "plain"
    self.template = template
    self.tokenizer = tokenizer
    # SFT needs worked solutions, RL only answers: split the pool so GRPO trains on problems SFT never saw.
    # Without the SFT stage (an HF model, --init_checkpoint) every problem is a GRPO prompt.
    split = FLAGS.sft_examples if sft_lineage and 0 < FLAGS.sft_examples < len(self.train) else 0
    self.sft_pool = self.train[:split] if split else self.train
    self.rl_pool = self.train[split:]
    # A learned or step reward (--reward=orm|prm|exact_steps) scores in the rollouts; the rule reward is then
    # correctness, for logs.
    scored_elsewhere = FLAGS.reward in ("orm", "prm", "exact_steps")
    self.reward_fn = rewards_lib.make_reward_fn("correctness" if scored_elsewhere else FLAGS.reward)
    self.is_formatted = (rewards_lib.has_final_answer_format if FLAGS.task != "math"
                         else lambda c: rewards_lib.extract_boxed(c) is not None)

  def prompt(self, example: data.Example) -> str:
    if FLAGS.task == "synthetic" and self.template == "plain":
      return data.format_prompt(example)
    instruction = ("Solve step by step and put the final answer in \\boxed{}." if FLAGS.task == "math"
                   else "Solve step by step and end with a line '#### <answer>'.")
    if self.template == "chat":
      messages = [{"role": "user", "content": f"{example.question}\n{instruction}"}]
      return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return f"Question: {example.question}\n{instruction}\nAnswer:\n"

  def train_example(self, position: int) -> data.Example:
    """The example at a position of the endless, per-epoch shuffled training order."""
    epoch, index = divmod(position, len(self.rl_pool))
    order = np.random.default_rng([FLAGS.seed, epoch]).permutation(len(self.rl_pool))
    return self.rl_pool[order[index]]


# EVALUATION


def evaluate(params, config, task: Task, key, placement: methods_lib.Placement | None = None) -> dict:
  """Greedy pass@1 (accuracy), format rate and length; with --eval_samples, maj@k and pass@k."""
  prompts = [task.prompt(e) for e in task.test]
  common = dict(batch_size=min(FLAGS.eval_batch_size, len(prompts)), max_prompt_len=FLAGS.max_prompt_len,
                max_new_tokens=FLAGS.max_new_tokens, **(placement.sample_kwargs() if placement else {}))
  texts, lengths = evaluation.generate(params, config, task.tokenizer, prompts, key, greedy=True, **common)
  greedy = evaluation.summarize(texts, task.test, ks=(1,), is_formatted=task.is_formatted)
  metrics = {"accuracy": greedy["pass@1"], "format_rate": greedy["format_rate"],
             "mean_length": float(np.mean(lengths))}
  k = FLAGS.eval_samples
  if k:
    texts, _ = evaluation.generate(params, config, task.tokenizer, prompts, jax.random.fold_in(key, 1),
                                   num_samples=k, temperature=FLAGS.eval_temperature, **common)
    sampled = evaluation.summarize(texts, task.test, ks=sorted({1, k}), is_formatted=task.is_formatted)
    metrics.update({name: v for name, v in sampled.items() if "@" in name})
  return metrics


# STAGE 1: SFT


def supervised_warm_start(params, config, task: Task, logger, placement: methods_lib.Placement | None = None
                          ) -> object:
  """Fine-tunes on the task's reference solutions (the SFT of DeepSeekMath's paradigm, GC = 1)."""
  tok = task.tokenizer
  eos = tok.eos_token_id
  examples = [e for e in task.sft_pool if e.solution]
  if not examples:
    raise RunError("SFT needs reference solutions, and the training set has none; pass --sft_steps=0")
  optimizer = training.make_optimizer(FLAGS.sft_learning_rate, warmup_steps=min(50, FLAGS.sft_steps // 10),
                                      total_steps=FLAGS.sft_steps, schedule="cosine", max_grad_norm=1.0)
  objective = update_lib.bind(training.sft_objective, config=config, chunk_size=FLAGS.logprob_chunk)
  state, train_step = (placement or methods_lib.Placement()).train(params, optimizer, objective,
                                                                   FLAGS.grad_accum_steps)
  rng = np.random.default_rng([FLAGS.seed, 12345])
  logger.start(FLAGS.sft_steps)
  for step in range(1, FLAGS.sft_steps + 1):
    chunk = [examples[i] for i in rng.integers(0, len(examples), FLAGS.sft_batch_size)]
    prompts = [tok.encode(task.prompt(e), add_special_tokens=False) for e in chunk]
    targets = [tok.encode(e.solution, add_special_tokens=False) + [eos] for e in chunk]
    batch = training.supervised_batch(prompts, targets, FLAGS.max_prompt_len, FLAGS.max_new_tokens,
                                      tok.pad_token_id or 0)
    state, metrics = train_step(state, batch)
    if step % 25 == 0 or step == FLAGS.sft_steps:
      values = logger.log(step, metrics, prefix="sft/")
      _check_finite(values, f"SFT step {step}")
      logger.progress(step, f"sft loss {values['sft/loss']:.4f}")
  logger.newline()
  return state.params


def _combine(name: str, values: list[float]) -> float:
  """One metric over a step's minibatches (separate optimiser steps): min/max for extremes, else the mean."""
  if name.endswith("_min"):
    return min(values)
  if name.endswith("_max"):
    return max(values)
  return float(np.mean(values))


def _note(line: str) -> None:
  """A one-line note on stderr, on a line of its own."""
  training.end_progress_line()
  print(line, file=sys.stderr)


def _check_finite(values: dict, where: str):
  bad = [k for k, v in values.items() if not np.isfinite(v)]
  if bad:
    raise FloatingPointError(f"{where}: non-finite {', '.join(bad)}; stopping without saving a checkpoint")


# STAGE 2: THE METHOD (GRPO by default)


def run_rl(method: methods_lib.Method, policy, task: Task, logger, ckpt: training.Checkpointer, sft_accuracy):
  """Stage 2: `--steps` steps of collect (the method's data source) then μ epochs of minibatch updates.

  Returns (final policy params, the start policy's accuracy, whether --stop_after stopped it).
  """
  rows = method.rows_per_step()
  minibatch = FLAGS.minibatch_size or rows
  if rows % minibatch or minibatch % FLAGS.grad_accum_steps:
    raise RunError(f"--minibatch_size={minibatch} must divide the step's {rows} rows (batch_size*group_size) and "
                   f"be divisible by --grad_accum_steps={FLAGS.grad_accum_steps}")
  if minibatch % (method.rows_per_item * FLAGS.grad_accum_steps):
    raise RunError(f"--algo={method.name}: micro-batches of {minibatch // FLAGS.grad_accum_steps} rows split its "
                   f"groups of {method.rows_per_item} rows")
  updates_per_step = FLAGS.num_epochs * rows // minibatch
  total_updates = FLAGS.steps * updates_per_step
  warmup = min(FLAGS.warmup_steps, total_updates // 2)  # short runs (smoke tests) still warm up and decay
  optimizer = method.optimizer(total_updates, warmup)
  key = jax.random.PRNGKey(FLAGS.seed)
  state, train_step = method.rollouts.placement.train(method.init_params(policy, jax.random.fold_in(key, 1)),
                                                      optimizer, method.objective(), FLAGS.grad_accum_steps)
  updates = method.reward_updates  # iterative RL's reward-model retraining, or None
  per_iteration = FLAGS.steps_per_iteration if updates else 0

  def checkpoint_tree(state):
    tree = {"train": state}
    if updates:  # the reference resets each iteration, the reward model and its replay history train
      tree.update(reference=method.reference, **updates.checkpoint_state())
    return tree

  position, start = 0, 0
  if FLAGS.resume and ckpt.latest_step() is not None:
    tree, meta = ckpt.restore_intact(
        checkpoint_tree(state), check=lambda meta, step: resume_lib.check_flags(meta.get("flags"), step, _note))
    dropped = logger.rewind(meta.get("metrics_offset"))  # records of steps after the checkpoint: re-run below
    state = tree["train"]
    if updates:
      method.reference = tree["reference"]
      updates.restore(tree)
    start, position = int(meta["step"]), int(meta["data_position"])
    key = jnp.asarray(meta["key"], jnp.uint32)
    sft_accuracy = meta.get("sft_accuracy", sft_accuracy)
    print(f"resumed from step {start} in {ckpt.directory}" + (
        f" ({dropped} metrics.jsonl records of later steps dropped)" if dropped else ""), file=sys.stderr)
  # Offline data comes from the start policy (the reference), so a resumed run rebuilds the same dataset.
  prepared = method.prepare(policy, jax.random.fold_in(jax.random.PRNGKey(FLAGS.seed), 2))
  if prepared:
    logger.log(start, prepared, prefix="data/")
    print("offline data: " + ", ".join(f"{k} {v:.4g}" for k, v in prepared.items()), file=sys.stderr)
  logger.start(FLAGS.steps)

  for step in range(start + 1, FLAGS.steps + 1):
    step_key = jax.random.fold_in(key, step)
    if per_iteration and step > 1 and (step - 1) % per_iteration == 0:
      # Algorithm 1: each iteration starts with π_ref ← π_θ (a copy: the train state is donated).
      method.reference = jax.tree.map(jnp.copy, method.policy(state.params))
    # COLLECT: π_old is the current policy (online methods) or a fixed dataset (offline ones)
    batch, stats, position = method.collect(state.params, position, step_key)
    # UPDATE: μ epochs over shuffled minibatches (groups of rows_per_item rows stay together)
    t0 = time.time()
    step_metrics = []
    items, per_item = rows // method.rows_per_item, method.rows_per_item
    for epoch in range(FLAGS.num_epochs):
      order = jax.random.permutation(jax.random.fold_in(step_key, 10_000 + epoch), items)
      order = (order[:, None] * per_item + jnp.arange(per_item)[None, :]).reshape(-1)
      for i in range(0, rows, minibatch):
        idx = order[i:i + minibatch]
        state, metrics = train_step(state, jax.tree.map(lambda x, idx=idx: x[idx], batch))
        step_metrics.append(metrics)
    metrics = {k: _combine(k, [float(m[k]) for m in step_metrics]) for k in step_metrics[0]}
    update_time = time.time() - t0
    _check_finite(metrics, f"{method.name} step {step}")
    stats.update(metrics, time_update=update_time, optimizer_steps=float(updates_per_step))
    step_time = stats.get("time_sampling", 0.0) + stats.get("time_scoring", 0.0) + update_time
    if "generated_tokens" in stats:
      stats["tokens_per_s"] = stats.pop("generated_tokens") / max(step_time, 1e-9)
    values = logger.log(step, stats, prefix="train/")
    logger.progress(step, _progress_line(values))
    if per_iteration and step % per_iteration == 0:  # the iteration's end: retrain the reward model
      logger.newline()
      iteration = step // per_iteration
      rm_metrics = updates.update(method.policy(state.params), iteration, jax.random.fold_in(step_key, 20_000))
      values = logger.log(step, {"iteration": float(iteration), **rm_metrics}, prefix="rm/")
      policy_eval = logger.log(step, evaluate(method.policy(state.params), method.config, task,
                                              jax.random.PRNGKey(FLAGS.seed + 1), method.rollouts.placement),
                               prefix="iteration/")
      print(f"iteration {iteration}: held-out accuracy {policy_eval['iteration/accuracy']:.3f}; reward model on "
            f"fresh policy samples: accuracy {values['rm/before_outcome/accuracy']:.3f} -> "
            f"{values['rm/after_outcome/accuracy']:.3f}", file=sys.stderr)
    # EVALUATE AND SAVE
    if FLAGS.eval_every and step % FLAGS.eval_every == 0 and step != FLAGS.steps:
      logger.newline()
      values = logger.log(step, evaluate(method.policy(state.params), method.config, task,
                                         jax.random.PRNGKey(FLAGS.seed + 1), method.rollouts.placement),
                          prefix="eval/")
      print(f"step {step}: held-out accuracy {values['eval/accuracy']:.3f}", file=sys.stderr)
    if (FLAGS.save_every and step % FLAGS.save_every == 0) or step == FLAGS.steps or step == FLAGS.stop_after:
      ckpt.save(step, checkpoint_tree(state), {"step": step, "data_position": position,
                                               "key": np.asarray(key).tolist(), "sft_accuracy": sft_accuracy,
                                               "algo": method.name, "flags": resume_lib.run_flags(),
                                               "metrics_offset": logger.offset()})
    if step == FLAGS.stop_after:
      logger.newline()
      print(f"stopping after step {step} (--stop_after); continue with --resume", file=sys.stderr)
      return method.policy(state.params), sft_accuracy, True
  logger.newline()
  return method.policy(state.params), sft_accuracy, False


def _progress_line(values: dict) -> str:
  parts = [("reward", "train/reward_mean", ".3f"), ("acc", "train/accuracy", ".3f"), ("loss", "train/loss", ".4f"),
           ("kl", "train/kl", ".4f"), ("kl", "train/kl_reward", ".3f"), ("vf", "train/value_loss", ".4f"),
           ("len", "train/response_length", ".1f"), ("rm_auc", "train/reward_group_auc", ".2f")]
  return " ".join(f"{name} {values[k]:{fmt}}" for name, k, fmt in parts
                  if isinstance(values.get(k), (int, float)) and math.isfinite(values[k]))


# MAIN


def _tiny_overrides() -> dict:
  return dict(num_hidden_layers=FLAGS.tiny_layers, hidden_size=FLAGS.tiny_hidden_size,
              intermediate_size=3 * FLAGS.tiny_hidden_size)


SFT_MARKER = "grpo_jax_sft.json"  # written into a run's sft_policy: it was fine-tuned on the first --sft_examples


def _load_policy(work_dir: pathlib.Path, placement: methods_lib.Placement | None = None,
                 marker_name: str = SFT_MARKER):
  """(params, config, tokenizer, needs_sft, path) of the starting policy, placed by `placement`'s rules;
  `marker_name` is the runner's SFT marker, which the work dir's own sft_policy must hold."""
  runtime = dict(dtype=FLAGS.dtype, param_dtype=FLAGS.dtype, remat=FLAGS.remat, remat_policy=FLAGS.remat_policy,
                 scan_layers=FLAGS.scan_layers)
  sft_dir = work_dir / "sft_policy"
  if FLAGS.init_checkpoint:
    path, needs_sft = pathlib.Path(FLAGS.init_checkpoint), False
  elif FLAGS.model:
    path, needs_sft = pathlib.Path(FLAGS.model), False
  elif sft_dir.exists():  # exported whole with its marker (`export`), by an earlier run in this work_dir
    if not (sft_dir / marker_name).is_file():
      raise RunError(f"{sft_dir} has no {marker_name}: not an SFT policy this runner exported whole; remove it "
                     f"to redo stage 1, or pass it as --init_checkpoint")
    path, needs_sft = sft_dir, False
  elif FLAGS.sft_steps == 0:
    path, needs_sft = work_dir / "base_model", False
  else:
    path, needs_sft = work_dir / "base_model", True
  if path == work_dir / "base_model":
    if distributed.is_main_process():  # one writer; the others wait for the files
      models.build_default_checkpoint(path, seed=FLAGS.seed, **_tiny_overrides())
    distributed.barrier("base_model")
  params, config = (placement or methods_lib.Placement()).load_hf(path, **runtime)
  return params, config, models.load_tokenizer(path), needs_sft, path




def _sft_lineage(source: pathlib.Path, marker_name: str = SFT_MARKER) -> bool:
  """Whether the start policy is a stage-1 SFT policy (its `marker_name` file says so); then RL draws prompts
  from the problems SFT did not see."""
  marker = pathlib.Path(source) / marker_name
  if not marker.is_file():
    return False
  try:
    recorded = json.loads(marker.read_text())
  except ValueError as err:
    raise RunError(f"{marker}: not valid JSON ({err})") from None
  if recorded.get("task") == FLAGS.task and recorded.get("sft_examples") != FLAGS.sft_examples:
    raise RunError(f"{source} was fine-tuned on the first {recorded.get('sft_examples')} problems; pass "
                   f"--sft_examples={recorded.get('sft_examples')} so the RL prompts exclude them")
  return recorded.get("task") == FLAGS.task


def export(params, config, source: pathlib.Path, target: pathlib.Path, extra_files: dict | None = None) -> None:
  """Writes params in HF format with the source checkpoint's tokenizer files, as they were, plus
  `extra_files` (name -> text, e.g. the SFT marker); the directory appears whole or not at all.

  Every process calls it (global arrays are gathered); process 0 writes.
  """
  params = distributed.all_gather(params)
  if not distributed.is_main_process():
    distributed.barrier(f"export {target.name}")
    return
  with training.atomic_directory(target) as tmp:
    models.save_hf(params, config, tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                 "vocab.json", "merges.txt", "generation_config.json", "chat_template.jinja"):
      if (source / name).is_file():
        shutil.copyfile(source / name, tmp / name)
    for name, text in (extra_files or {}).items():
      (tmp / name).write_text(text)
  distributed.barrier(f"export {target.name}")


def sft_marker(task: str, sft_examples: int, seed: int) -> str:
  """The marker file's text: which problems stage 1 fine-tuned on."""
  return json.dumps({"sft_examples": sft_examples, "seed": seed, "task": task})


def run() -> dict:
  work_dir = pathlib.Path(FLAGS.work_dir)
  ckpt_dir = work_dir / "checkpoints"
  if not FLAGS.resume and ckpt_dir.is_dir() and any(ckpt_dir.iterdir()):
    raise RunError(f"{ckpt_dir} already holds checkpoints; pass --resume to continue, or choose another --work_dir")
  if FLAGS.resume and not (ckpt_dir.is_dir() and any(ckpt_dir.iterdir())):
    raise RunError(f"--resume: no checkpoint in {ckpt_dir}")
  if FLAGS.group_size is None:
    FLAGS.group_size = 1 if FLAGS.algo == "ppo" else 8
  if FLAGS.iterations > 1:
    FLAGS.steps = FLAGS.iterations * FLAGS.steps_per_iteration
  if FLAGS.supervision == "process" and FLAGS.algo != "grpo":
    raise RunError("--supervision=process is GRPO's (GRPO+PS); use --algo=grpo")
  if FLAGS.advantage_estimator != "group" and (FLAGS.algo != "grpo" or FLAGS.supervision == "process"):
    raise RunError(f"--advantage_estimator={FLAGS.advantage_estimator} replaces GRPO's outcome advantages: it needs "
                   f"--algo=grpo and --supervision=outcome")
  if FLAGS.iterations > 1 and FLAGS.algo not in ("grpo", "ppo"):
    raise RunError("--iterations > 1 (iterative RL) needs an online RL method: --algo=grpo or ppo")
  placement = methods_lib.Placement.from_flags()
  _check_divisible(placement.data_parallel)
  if jax.process_count() > 1 and FLAGS.iterations > 1:
    raise RunError("--iterations > 1 (reward-model retraining) runs in one process only for now")
  if FLAGS.resume:  # refuse other flags before anything (flags.txt included) is written
    resume_lib.check_before_writing(ckpt_dir, _note)
  main_process = distributed.is_main_process()
  t_start = time.time()
  work_dir.mkdir(parents=True, exist_ok=True)
  if main_process:
    (work_dir / "flags.txt").write_text(FLAGS.flags_into_string())
  params, config, tokenizer, needs_sft, source = _load_policy(work_dir, placement)
  task = Task(tokenizer, sft_lineage=needs_sft or _sft_lineage(source))
  logger = training.MetricsLogger(work_dir, FLAGS.steps, tensorboard=FLAGS.tensorboard)
  eval_key = jax.random.PRNGKey(FLAGS.seed + 1)
  print(f"policy from {source} ({config.model_type}, {sum(x.size for x in jax.tree.leaves(params)):,} params); "
        f"task {FLAGS.task}: {len(task.train)} train / {len(task.test)} held-out problems", file=sys.stderr)

  if needs_sft and FLAGS.sft_steps:
    print(f"stage 1: SFT warm start, {FLAGS.sft_steps} steps", file=sys.stderr)
    params = supervised_warm_start(params, config, task, logger, placement)
    export(params, config, source, work_dir / "sft_policy",
           {SFT_MARKER: sft_marker(FLAGS.task, FLAGS.sft_examples, FLAGS.seed)})
  start_accuracy = None  # on --resume it comes from the checkpoint
  if not FLAGS.resume:
    start_eval = logger.log(0, evaluate(params, config, task, eval_key, placement), prefix="eval/")
    start_accuracy = start_eval["eval/accuracy"]
    print(f"start policy: held-out accuracy {start_accuracy:.3f}", file=sys.stderr)

  print(f"stage 2: {FLAGS.algo}, {FLAGS.steps} steps of {FLAGS.batch_size} prompts x {FLAGS.group_size} samples",
        file=sys.stderr)
  reference = jax.tree.map(jnp.copy, params)  # frozen π_ref: the start policy
  reward_model = learned_reward.make(tokenizer, config, placement)
  rollouts = methods_lib.Rollouts(config, task, reward_model, placement)
  method = methods_lib.METHODS[FLAGS.algo](config, task, rollouts, reference)
  if FLAGS.iterations > 1:
    method.reward_updates = learned_reward.RewardModelUpdates(reward_model, task, rollouts)
  ckpt = training.Checkpointer(work_dir / "checkpoints", max_to_keep=FLAGS.keep_checkpoints)
  try:
    policy, start_accuracy, stopped = run_rl(method, params, task, logger, ckpt, start_accuracy)
  finally:
    ckpt.close()
  if stopped:
    return {}
  final_eval = evaluate(policy, config, task, eval_key, placement)
  logger.log(FLAGS.steps, final_eval, prefix="eval/")
  export(policy, config, source, work_dir / "final_policy")
  logger.close()
  peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
  summary = {"algo": FLAGS.algo, "start_accuracy": start_accuracy, "final_accuracy": final_eval["accuracy"],
             "num_eval_problems": len(task.test), "wall_time_s": time.time() - t_start, "peak_rss_mib": peak_mib,
             **{f"final_{k}": v for k, v in final_eval.items()}}
  if main_process:
    training.atomic_write_text(work_dir / "summary.json", json.dumps(summary, indent=2))
  rows = [("held-out problems", f"{len(task.test)}"),
          ("greedy accuracy, start (SFT)", "n/a" if start_accuracy is None else f"{100 * start_accuracy:.1f}%"),
          (f"greedy accuracy, after {FLAGS.algo}", f"{100 * final_eval['accuracy']:.1f}%"),
          (f"format rate, after {FLAGS.algo}", f"{100 * final_eval['format_rate']:.1f}%"),
          ("wall time (this run)", f"{summary['wall_time_s'] / 60:.1f} min"),
          ("peak host memory (RSS)", f"{peak_mib:,.0f} MiB")]
  print_table("summary", rows)
  print(f"final policy (HF format): {work_dir / 'final_policy'}")
  return summary


def print_table(title: str, rows: list[tuple[str, str]]) -> None:
  """A run's closing table: a title, a rule, then `name  value` lines."""
  width = max(len(r[0]) for r in rows)
  print("\n".join(["", title, "-" * (width + 10)] + [f"{a:<{width}}  {b}" for a, b in rows]))


def _check_divisible(data_parallel: int) -> None:
  """Rows split evenly over the mesh's data axes (data x fsdp)."""
  if data_parallel == 1:
    return
  rows = FLAGS.batch_size * FLAGS.group_size
  minibatch = FLAGS.minibatch_size or rows
  sizes = {"--batch_size": FLAGS.batch_size, "--eval_batch_size": FLAGS.eval_batch_size,
           "rows per micro-batch (minibatch / grad_accum_steps)": minibatch // FLAGS.grad_accum_steps,
           "SFT rows per micro-batch (sft_batch_size / grad_accum_steps)":
               FLAGS.sft_batch_size // FLAGS.grad_accum_steps}
  for name, size in sizes.items():
    if size % data_parallel:
      raise RunError(f"{name} = {size} must be a multiple of the mesh's data-parallel size {data_parallel}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  try:  # before any other JAX call
    distributed.initialize(FLAGS.coordinator_address or None, FLAGS.num_processes, FLAGS.process_id)
  except ValueError as err:
    sys.exit(f"grpo_math: error: {err}")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO; -v 0 brings it back
  try:
    run()
  except (RunError, models.CheckpointError, data.DatasetError, checkpointing.CheckpointError,
          FloatingPointError, ValueError, OSError) as err:
    training.end_progress_line()
    sys.exit(f"grpo_math: error: {err}")
  except BaseException:
    training.end_progress_line()
    raise


if __name__ == "__main__":
  app.run(main)
