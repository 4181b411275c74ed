r"""The one training loop: `run(config) -> summary`, for every method of `experiments.methods`.

  from experiments.runner import config, loop
  summary = loop.run(config.Config().replace(steps=50, algo="online_rft", work_dir="runs/rft"))

Stage 1 (the embedded model only) fine-tunes the start policy on the method's demonstrations. Stage 2 runs
`steps` steps of

  COLLECT   the method's rows on the device(s): samples of the current policy (online methods) or a fixed
            dataset (offline ones), rewards, π_old / π_ref log-probs, advantages; text crosses to the host once
  UPDATE    μ epochs of minibatch optimiser steps (the method says how rows form minibatches)
  LOG       the step's metrics, brought to the host in one transfer
  ITERATE   iterative RL (DeepSeekMath Algorithm 1): π_ref ← π_θ at each iteration start, the reward model
            retrained at its end
  EVALUATE  every `eval_every` steps; CHECKPOINT every `save_every` (exact resume: train state, data position,
            RNG key, metrics offset, the config)

and stops with FloatingPointError, before saving, on a non-finite metric. Exports `final_policy` (HF format) and
writes `summary.json`. The work dir is locked while the run uses it (`work_dir_lock`); after a step during which
SIGTERM or SIGINT arrived, that step (of stage 1 or 2) is saved and `preemption.Interrupted` raised.
"""

import json
import math
import pathlib
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import methods as methods_lib
from experiments.methods import learned_reward
from experiments.runner import config as config_lib
from experiments.runner import git_commit
from experiments.runner import placement as placement_lib
from experiments.runner import policy as policy_lib
from experiments.runner import preemption
from experiments.runner import profiling
from experiments.runner import resume as resume_lib
from experiments.runner import task as task_lib
from experiments.runner import warm_start
from experiments.runner import work_dir_lock
from grpo_jax import distributed
from grpo_jax import training
from grpo_jax.models import lora

RunError = config_lib.RunError


def note(line: str) -> None:
  """A one-line note on stderr, on a line of its own."""
  training.end_progress_line()
  print(line, file=sys.stderr)


# The rollout-trainer mismatch (`training.update.rollout_correction`) compares the sampler's log-probs with the
# update forward's π_θ: on a step's first minibatch that is the policy that sampled, so it is taken from that one.
MISMATCH_PREFIX = "mismatch_"
# The progress line shows the mismatch from this k3 KL(π_sampler ‖ π_trainer) per token, or when any ratio
# π_trainer / π_sampler of the step lies outside [0.5, 2].
MISMATCH_SHOWN_KL = 1e-3


def combine(name: str, values: list[float]) -> float:
  """One metric over a step's minibatches (separate optimiser steps): min/max for extremes, else the mean; the
  mismatch metrics are the first minibatch's."""
  if name.startswith(MISMATCH_PREFIX):
    return values[0]
  if name.endswith("_min"):
    return min(values)
  if name.endswith("_max"):
    return max(values)
  return float(np.mean(values))


def print_table(title: str, rows: list[tuple[str, str]]) -> None:
  """A run's closing table: a title, a rule, then `name  value` lines."""
  width = max(len(r[0]) for r in rows)
  print("\n".join(["", title, "-" * (width + 10)] + [f"{a:<{width}}  {b}" for a, b in rows]))


def check_divisible(config: config_lib.Config, data_parallel: int) -> None:
  """Rows split evenly over the mesh's data axes (data x fsdp)."""
  if data_parallel == 1:
    return
  algo = config.algorithm
  minibatch = algo.minibatch_size or config.rows_per_step
  # The engine fills its slots from any number of prompts in one process (several provide their own rows).
  prompts = {} if config.rollout.sampler == "engine" and jax.process_count() == 1 else {
      "--batch_size": config.rollout.batch_size, "--eval_batch_size": config.eval.eval_batch_size}
  sizes = {**prompts,
           "rows per micro-batch (minibatch / grad_accum_steps)": minibatch // algo.grad_accum_steps,
           "SFT rows per micro-batch (sft_batch_size / grad_accum_steps)":
               config.sft.sft_batch_size // algo.grad_accum_steps}
  for name, size in sizes.items():
    if size % data_parallel:
      raise RunError(f"{name} = {size} must be a multiple of the mesh's data-parallel size {data_parallel}")


def _check_placement(config: config_lib.Config, placement: placement_lib.Placement) -> None:
  """What runs on one device only is refused, with one line, on a mesh or several processes."""
  if placement.mesh is None:
    return
  if config.algorithm.algo == "flow_grpo":
    raise RunError("--algo=flow_grpo runs on one device: its agent loop samples turn by turn outside the mesh; "
                   "leave --mesh empty and run one process")
  if config.reward_model.iterations > 1 and jax.process_count() > 1:
    raise RunError("--iterations > 1 (reward-model retraining) runs in one process only for now")
  check_divisible(config, placement.data_parallel)


# STAGE 2: THE METHOD'S STEPS


def update_plan(method: methods_lib.Method):
  """`(minibatch rows, optimiser steps per step, optimiser)` of stage 2: the schedule spans the run's updates."""
  cfg = method.cfg
  algo = cfg.algorithm
  rows = method.rows_per_step()
  minibatch = algo.minibatch_size or rows  # divides the rows, and by grad_accum_steps (`config.check`)
  # Length buckets cut a minibatch by length, not into --grad_accum_steps whole-group parts (`bucketed_update`)
  if method.bucketed_update() is None and minibatch % (method.rows_per_item * algo.grad_accum_steps):
    raise RunError(f"--algo={method.name}: micro-batches of {minibatch // algo.grad_accum_steps} rows split its "
                   f"groups of {method.rows_per_item} rows")
  updates_per_step = algo.num_epochs * rows // minibatch
  total_updates = cfg.optim.steps * updates_per_step
  warmup = min(cfg.optim.warmup_steps, total_updates // 2)  # short runs (smoke tests) still warm up and decay
  return minibatch, updates_per_step, method.optimizer(total_updates, warmup)


def train(method: methods_lib.Method, policy, logger, ckpt: training.Checkpointer, start_accuracy,
          lora_base: dict | None = None, signals: preemption.StopSignals | None = None):
  """Stage 2: `steps` steps of collect, then μ epochs of minibatch updates.

  After a step during which `signals` noted SIGTERM or SIGINT (on any process), that step is saved and
  `preemption.Interrupted` raised.

  With LoRA (`lora_base`: the base checkpoint's path and digest, recorded in every checkpoint and checked on resume)
  the train state holds only the trained leaves (`lora.split`: the adapters, a value head); the frozen base is
  joined to them where the policy is used, and is not checkpointed.

  `policy` (the start params) is handed over to the train state: its buffers are deleted once the state exists
  (`Placement.train`); π_ref (`method.reference`) must not share them, except for LoRA's frozen base.

  Returns (final policy params, the start policy's accuracy, whether `stop_after` stopped it).
  """
  cfg = method.cfg
  algo, run_cfg = cfg.algorithm, cfg.run
  minibatch, updates_per_step, optimizer = update_plan(method)
  steps = cfg.optim.steps
  key = jax.random.PRNGKey(run_cfg.seed)
  # Offline data comes from the start policy (the reference), so a resumed run rebuilds the same dataset; built
  # before the train state takes the start policy's buffers (logged once a resume has rewound the metrics).
  prepared = method.prepare(policy, jax.random.fold_in(key, 2))
  trained, frozen = method.init_params(policy, jax.random.fold_in(key, 1)), None
  if lora_base is not None:  # LoRA: only the adapters (and a value head) are trained, optimised and checkpointed
    trained, frozen = lora.split(trained)
  full = (lambda params: params) if frozen is None else (lambda params: lora.join(params, frozen))
  trained_part = (lambda params: params) if frozen is None else (lambda params: lora.split(params)[0])
  # The start params are handed over: the state takes their buffers (`Placement.train` deletes them; with LoRA the
  # start adapters), so stage 2 holds π_θ, its moments and π_ref, and no other copy of the start policy.
  state, train_step = method.rollouts.placement.train(trained, optimizer, method.objective(), algo.grad_accum_steps,
                                                      frozen=frozen, bucketed=method.bucketed_update())
  policy = trained = None
  updates = method.reward_updates  # iterative RL's reward-model retraining, or None
  per_iteration = cfg.reward_model.steps_per_iteration if updates else 0
  if updates and frozen is not None:
    # π_ref takes π_θ's adapters at each iteration; zero adapters until then keep the checkpoint's structure
    zero = jax.tree.map(jnp.zeros_like, lora.adapters(method.policy(full(state.params))))
    method.reference = lora.join(zero, method.reference)
  recorded = resume_lib.record(cfg)

  def checkpoint_tree(state):
    tree = {"train": state}
    if updates:  # the reference resets each iteration, the reward model and its replay history train
      tree.update(reference=trained_part(method.reference), **updates.checkpoint_state())
    return tree

  def evaluate(params):
    return method.evaluate(method.policy(full(params)), jax.random.PRNGKey(run_cfg.seed + 1))

  position, start, prompts_truncated = 0, 0, None
  if run_cfg.resume and ckpt.latest_step() is not None:
    tree, meta = ckpt.restore_intact(
        checkpoint_tree(state), check=lambda meta, step: resume_lib.check_flags(meta.get("flags"), recorded, step,
                                                                                note))
    dropped = logger.rewind(meta.get("metrics_offset"))  # records of steps after the checkpoint: re-run below
    if meta.get("lora_base") != lora_base:
      raise RunError(f"--resume: the checkpoint's trained weights go with the base {meta.get('lora_base')}, this "
                     f"run's base is {lora_base}")
    state = tree["train"]
    if updates:
      method.reference = tree["reference"] if frozen is None else lora.join(tree["reference"],
                                                                            lora.split(method.reference)[1])
      updates.restore(tree)
    start, position = int(meta["step"]), int(meta["data_position"])
    prompts_truncated = meta.get("prompts_truncated")  # None in checkpoints saved before it was recorded
    key = jnp.asarray(meta["key"], jnp.uint32)
    start_accuracy = meta.get("sft_accuracy", start_accuracy)
    print(f"resumed from step {start} in {ckpt.directory}" + (
        f" ({dropped} metrics.jsonl records of later steps dropped)" if dropped else ""), file=sys.stderr)
  if prompts_truncated is not None:  # the count since the start, the rebuilt offline data's prompts included
    method.rollouts.prompts_truncated = int(prompts_truncated)
  if prepared:
    logger.log(start, prepared, prefix="data/")
    print("offline data: " + ", ".join(f"{k} {v:.4g}" for k, v in prepared.items()), file=sys.stderr)
  logger.start(steps)

  def report(text):
    logger.newline()
    print(text, file=sys.stderr)

  with profiling.StepTracer(run_cfg.profile_steps, pathlib.Path(run_cfg.work_dir) / "profile", report) as tracer:
    for step in range(start + 1, steps + 1):
      step_key = jax.random.fold_in(key, step)
      tracer.before(step)
      if per_iteration and step > 1 and (step - 1) % per_iteration == 0:
        # Algorithm 1: each iteration starts with π_ref ← π_θ (a copy: the train state is donated).
        method.reference = method.policy(full(jax.tree.map(jnp.copy, state.params)))
      # COLLECT: π_old is the current policy (online methods) or a fixed dataset (offline ones)
      batch, stats, position = method.collect(full(state.params), position, step_key)
      # UPDATE: μ epochs over the method's minibatches
      t0 = time.time()
      step_metrics = []
      for epoch in range(algo.num_epochs):
        for part in method.minibatches(batch, step_key, epoch, minibatch):
          state, metrics = train_step(state, part)
          step_metrics.append(metrics)
      step_metrics = jax.device_get(step_metrics)  # LOG: one transfer for all of the step's metrics
      metrics = {k: combine(k, [float(m[k]) for m in step_metrics]) for k in step_metrics[0]}
      update_time = time.time() - t0
      warm_start.check_finite(metrics, f"{method.name} step {step}")
      stats.update(metrics, time_update=update_time, optimizer_steps=float(updates_per_step))
      step_time = stats.get("time_sampling", 0.0) + stats.get("time_scoring", 0.0) + update_time
      if "generated_tokens" in stats:
        stats["tokens_per_s"] = stats.pop("generated_tokens") / max(step_time, 1e-9)
      values = logger.log(step, stats, prefix="train/")
      logger.progress(step, _progress_line(values))
      tracer.after(step)
      if per_iteration and step % per_iteration == 0:  # ITERATE: the iteration's end, retrain the reward model
        logger.newline()
        iteration = step // per_iteration
        rm_metrics = updates.update(method.policy(full(state.params)), iteration,
                                    jax.random.fold_in(step_key, 20_000))
        values = logger.log(step, {"iteration": float(iteration), **rm_metrics}, prefix="rm/")
        policy_eval = logger.log(step, evaluate(state.params), prefix="iteration/")
        print(f"iteration {iteration}: held-out accuracy {policy_eval['iteration/accuracy']:.3f}; reward model on "
              f"fresh policy samples: accuracy {values['rm/before_outcome/accuracy']:.3f} -> "
              f"{values['rm/after_outcome/accuracy']:.3f}", file=sys.stderr)
      # EVALUATE AND SAVE
      if cfg.eval.eval_every and step % cfg.eval.eval_every == 0 and step != steps:
        logger.newline()
        values = logger.log(step, evaluate(state.params), prefix="eval/")
        print(f"step {step}: held-out accuracy {values['eval/accuracy']:.3f}", file=sys.stderr)
      interrupted = signals is not None and signals.stop_requested()  # every process: the same answer
      if (run_cfg.save_every and step % run_cfg.save_every == 0) or step == steps or step == run_cfg.stop_after \
          or interrupted:
        ckpt.save(step, checkpoint_tree(state), {"step": step, "data_position": position,
                                                 "key": np.asarray(key).tolist(), "sft_accuracy": start_accuracy,
                                                 "algo": method.name, "flags": recorded,
                                                 "metrics_offset": logger.offset(), "lora_base": lora_base,
                                                 "prompts_truncated": int(method.rollouts.prompts_truncated)})
      if interrupted:
        logger.newline()
        raise preemption.Interrupted(signals.signum, step, "stage-2", ckpt.directory)
      if step == run_cfg.stop_after:
        logger.newline()
        print(f"stopping after step {step} (--stop_after); continue with --resume", file=sys.stderr)
        return method.policy(full(state.params)), start_accuracy, True
  logger.newline()
  return method.policy(full(state.params)), start_accuracy, False


def _progress_line(values: dict) -> str:
  parts = [("reward", "train/reward_mean", ".3f"), ("acc", "train/accuracy", ".3f"), ("loss", "train/loss", ".4f"),
           ("kl", "train/kl", ".4f"), ("kl", "train/kl_reward", ".3f"), ("vf", "train/value_loss", ".4f"),
           ("len", "train/response_length", ".1f"), ("turns", "train/mean_turns", ".2f"),
           ("tool err", "train/tool_error_rate", ".3f"), ("rm_auc", "train/reward_group_auc", ".2f")]
  line = " ".join(f"{name} {values[k]:{fmt}}" for name, k, fmt in parts
                  if isinstance(values.get(k), (int, float)) and math.isfinite(values[k]))
  kl, outside = values.get("train/mismatch_kl"), values.get("train/mismatch_ratio_outside")
  if isinstance(kl, float) and isinstance(outside, float) and (kl >= MISMATCH_SHOWN_KL or outside > 0):
    line += f" mismatch kl {kl:.1e} out {100 * outside:.2f}%"
  return line


# THE RUN


def run(config: config_lib.Config) -> dict:
  """Runs stage 1 (when the start policy needs it) and stage 2 of `config`; returns the summary (also written to
  `<work_dir>/summary.json`), or {} when `stop_after` stopped the run. Problems with the inputs raise RunError,
  ConfigError, `CheckpointError`s or OSError with one line; nothing is overwritten. A work dir in use by another
  run raises `work_dir_lock.WorkDirBusy` (a RunError); SIGTERM or SIGINT, `preemption.Interrupted` once the step
  in flight is saved."""
  cfg, run_cfg = config, config.run
  method_cls = methods_lib.METHODS[cfg.algorithm.algo]
  work_dir = pathlib.Path(run_cfg.work_dir)
  ckpt_dir, sft_ckpt_dir = work_dir / "checkpoints", work_dir / warm_start.CHECKPOINTS
  work_dir_lock.check_free(work_dir)  # a live run is named first, whatever else its directory holds
  policy_lib.check_inputs(cfg)  # the checkpoints' config.json, --lora_rank against the width
  task_lib.check_files(cfg.task)
  for directory in (ckpt_dir, sft_ckpt_dir):
    if not run_cfg.resume and _holds_checkpoints(directory):
      raise RunError(f"{directory} already holds checkpoints; pass --resume to continue, or choose another "
                     f"--work_dir")
  if run_cfg.resume and not (_holds_checkpoints(ckpt_dir) or _holds_checkpoints(sft_ckpt_dir)
                             or (work_dir / "sft_policy").is_dir()):
    raise RunError(f"--resume: no checkpoint in {ckpt_dir}")
  placement = placement_lib.Placement.from_config(cfg.mesh)
  _check_placement(cfg, placement)
  attention, warning = policy_lib.attention_that_runs(cfg.model)
  if warning:  # the kernel asked for is not on this backend: what runs instead, in config.json too
    note(warning)
    cfg = cfg.replace(attention=attention)
  # One run per work dir; SIGTERM / SIGINT stop after the step in flight, with its checkpoint (`preemption`).
  with work_dir_lock.WorkDirLock(work_dir), preemption.StopSignals() as signals:
    return _stages(cfg, method_cls, placement, signals)


def _holds_checkpoints(directory: pathlib.Path) -> bool:
  return directory.is_dir() and any(directory.iterdir())


def _stages(cfg: config_lib.Config, method_cls, placement: placement_lib.Placement,
            signals: preemption.StopSignals) -> dict:
  """`run` in its locked work dir: stage 1, stage 2, the final evaluation and exports."""
  run_cfg = cfg.run
  work_dir = pathlib.Path(run_cfg.work_dir)
  ckpt_dir, sft_ckpt_dir = work_dir / "checkpoints", work_dir / warm_start.CHECKPOINTS
  if run_cfg.resume:  # refuse other settings before anything (flags.txt included) is written
    resume_lib.check_before_writing(ckpt_dir if _holds_checkpoints(ckpt_dir) else sft_ckpt_dir,
                                    resume_lib.record(cfg), note)
  resumed_stage2 = run_cfg.resume and _holds_checkpoints(ckpt_dir)
  main_process = distributed.is_main_process()
  if run_cfg.wandb_project and main_process:
    training.wandb_run.check_installed()  # before the model loads
  t_start = time.time()
  work_dir.mkdir(parents=True, exist_ok=True)
  if run_cfg.wandb_project and run_cfg.resume and main_process:
    training.wandb_run.stored_run_id(work_dir)  # a damaged id file is named before anything is written
  if main_process:
    (work_dir / "config.json").write_text(json.dumps(resume_lib.record(cfg), indent=2))
  params, model_config, tokenizer, needs_sft, source = policy_lib.load(cfg, placement, method_cls.sft_marker)
  task = task_lib.Task(cfg.task, tokenizer, sft_lineage=needs_sft or policy_lib.sft_lineage(
      source, cfg.task, method_cls.sft_marker), seed=run_cfg.seed)
  wandb = training.wandb_run.start(work_dir, run_cfg.wandb_project, resume_lib.record(cfg), resume=run_cfg.resume,
                                   mode=run_cfg.wandb_mode, entity=run_cfg.wandb_entity, name=run_cfg.wandb_run_name
                                   ) if run_cfg.wandb_project and main_process else None
  logger = training.MetricsLogger(work_dir, cfg.optim.steps, tensorboard=run_cfg.tensorboard, wandb_run=wandb)
  reward_model = learned_reward.make(cfg, tokenizer, model_config, placement)
  lora_targets = config_lib.lora_targets(cfg.model.lora_targets)
  policy_config = lora.lora_config(model_config, rank=cfg.model.lora_rank, alpha=cfg.model.lora_alpha,
                                   targets=lora_targets) if cfg.model.lora_rank else model_config
  rollouts = methods_lib.Rollouts(cfg, policy_config, task, reward_model, placement)
  method = method_cls(cfg, policy_config, task, rollouts, None)
  print(f"policy from {source} ({model_config.model_type}, {sum(x.size for x in jax.tree.leaves(params)):,} "
        f"params); task {cfg.task.task}: {len(task.train)} train / {len(task.test)} held-out problems",
        file=sys.stderr)

  t_sft = time.time()
  if needs_sft:
    demos = method.demonstrations()
    print(f"stage 1: SFT warm start, {cfg.sft.sft_steps} steps on {len(demos.pairs)} demonstrations",
          file=sys.stderr)
    params = warm_start.warm_start(params, model_config, demos, cfg, logger, tokenizer.pad_token_id or 0, placement,
                                   signals)
    policy_lib.export(params, model_config, source, work_dir / "sft_policy",
                      {method.sft_marker: policy_lib.sft_marker(cfg.task.task, cfg.task.sft_examples, run_cfg.seed)})
    warm_start.remove_checkpoints(sft_ckpt_dir)  # stage 1 is done: a resumed run starts from sft_policy
    if signals.stop_requested():
      raise preemption.Interrupted(signals.signum, cfg.sft.sft_steps, "SFT", work_dir / "sft_policy")
  elif signals.stop_requested():
    raise preemption.Interrupted(signals.signum, 0, "stage-2")
  lora_base = None
  if cfg.model.lora_rank:  # stage 2 trains adapters on this base (stage 1, if any, fine-tuned it whole)
    params = placement.put_params(lora.add_adapters(params, policy_config, jax.random.PRNGKey(run_cfg.seed + 3)))
    lora_base = policy_lib.base_record(work_dir / "sft_policy" if needs_sft else source)
  start_eval = {}
  if not resumed_stage2:
    start_eval = logger.log(0, method.evaluate(params, jax.random.PRNGKey(run_cfg.seed + 1)), prefix="eval/")
    start_eval = {k[len("eval/"):]: v for k, v in start_eval.items()}
    print(f"start policy: held-out accuracy {start_eval['accuracy']:.3f}", file=sys.stderr)
  start_accuracy = start_eval.get("accuracy")  # on --resume it comes from the checkpoint

  t_rl = time.time()
  print(f"stage 2: {method.name}, {cfg.optim.steps} steps of {cfg.rollout.batch_size} prompts x "
        f"{cfg.rollout.group_size} samples", file=sys.stderr)
  # frozen π_ref: the start policy, a copy (`train` hands `params` to the train state, which deletes them); with
  # LoRA the base itself (the adapters off: no copy of the weights; the base is frozen, never handed over)
  method.reference = lora.disabled(params) if lora_base else jax.tree.map(jnp.copy, params)
  if cfg.reward_model.iterations > 1:
    method.reward_updates = learned_reward.RewardModelUpdates(reward_model, task, rollouts)
  ckpt = training.Checkpointer(ckpt_dir, max_to_keep=run_cfg.keep_checkpoints)
  try:
    policy, start_accuracy, stopped = train(method, params, logger, ckpt, start_accuracy, lora_base, signals)
  finally:
    ckpt.close()
  if stopped:
    logger.close()
    return {}
  method.reference, params = None, None  # π_ref and the start policy: their memory free for the final eval and export
  t_final = time.time()
  final_eval = method.evaluate(policy, jax.random.PRNGKey(run_cfg.seed + 1))
  logger.log(cfg.optim.steps, final_eval, prefix="eval/")
  validation = {}
  if task.validation:  # --num_validation: the held-out training problems, for choosing hyperparameters
    method.task = task.validation_view()
    try:
      validation = method.evaluate(policy, jax.random.PRNGKey(run_cfg.seed + 1))
    finally:
      method.task = task
    validation = {"val_accuracy": validation["accuracy"], "num_validation_problems": len(task.validation)}
    logger.log(cfg.optim.steps, {"val_accuracy": validation["val_accuracy"]}, prefix="eval/")
  if cfg.model.lora_export_peft:
    policy_lib.export_adapters(policy, policy_config, lora_base["path"], work_dir / "final_adapter")
  policy_lib.export(*lora.merge(policy, policy_config), source, work_dir / "final_policy")  # merged: a plain model
  logger.close()
  peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
  summary = {"algo": method.name, "start_accuracy": start_accuracy, "final_accuracy": final_eval["accuracy"],
             "num_eval_problems": len(task.test), "wall_time_s": time.time() - t_start,
             "sft_time_s": t_rl - t_sft, "rl_time_s": t_final - t_rl, "peak_rss_mib": peak_mib,
             **{f"start_{k}": v for k, v in start_eval.items()},
             **{f"final_{k}": v for k, v in final_eval.items()},
             **{("final_" if k == "val_accuracy" else "") + k: v for k, v in validation.items()},
             "code_version": git_commit.head_commit(), "config": resume_lib.record(cfg)}
  if main_process:
    training.atomic_write_text(work_dir / "summary.json", json.dumps(summary, indent=2))
  rows = [("held-out problems", f"{len(task.test)}"),
          ("greedy accuracy, start", "n/a" if start_accuracy is None else f"{100 * start_accuracy:.1f}%"),
          (f"greedy accuracy, after {method.name}", f"{100 * final_eval['accuracy']:.1f}%"),
          *method.summary_rows(start_eval, final_eval),
          ("wall time (this run)", f"{summary['wall_time_s'] / 60:.1f} min"),
          ("peak host memory (RSS)", f"{peak_mib:,.0f} MiB")]
  print_table("summary", rows)
  print(f"final policy (HF format): {work_dir / 'final_policy'}")
  return summary
