r"""The one training loop: `run(config) -> summary`, for every method of `experiments.methods`.

  from experiments.runner import config
  from experiments.trainer import loop
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
from experiments.runner import logs
from experiments.runner import placement as placement_lib
from experiments.runner import policy as policy_lib
from experiments.runner import preemption
from experiments.runner import profiling
from experiments.runner import report
from experiments.runner import resume as resume_lib
from experiments.runner import stage_checkpoints
from experiments.runner import task as task_lib
from experiments.runner import warm_start
from experiments.runner import work_dir_lock
from experiments.trainer import ahead as ahead_lib
from experiments.trainer import plan
from grpo_jax import distributed
from grpo_jax import training
from grpo_jax.models import lora

RunError = config_lib.RunError


# STAGE 2: THE METHOD'S STEPS


def train(method: methods_lib.Method, policy, logger, ckpt: stage_checkpoints.StageCheckpoints, evaluate_start=None,
          lora_base: dict | None = None, updates: learned_reward.RewardModelUpdates | None = None):
  """Stage 2: `steps` steps of collect, then μ epochs of minibatch updates.

  `evaluate_start(policy) -> accuracy` evaluates the start policy (None: no evaluation, or a resumed run's, whose
  checkpoint holds the accuracy); it runs once the train state exists, while the first step's programs compile
  ahead in a thread (`--compile_ahead`, `trainer.ahead`).

  After a step during which `ckpt`'s signals noted SIGTERM or SIGINT (on any process), that step is saved and
  `preemption.Interrupted` raised.

  With LoRA (`lora_base`: the base checkpoint's path and digest, recorded in every checkpoint and checked on resume)
  the train state holds only the trained leaves (`lora.TrainedPart`: the adapters, a value head); the frozen base
  is joined to them where the policy is used, and is not checkpointed. `updates`: iterative RL's reward-model
  retraining (`--iterations > 1`), or None.

  `policy` (the start params) is handed over to the train state: its buffers are deleted once the state exists
  (`Placement.train`); π_ref (`method.use_reference`) must not share them, except for LoRA's frozen base.

  Returns (final policy params, the start policy's accuracy, whether `stop_after` stopped it).
  """
  run_cfg, steps = method.config.run, method.config.optim.steps
  minibatch, updates_per_step, optimizer = plan.update_plan(method)
  key = jax.random.PRNGKey(run_cfg.seed)
  # Offline data comes from the start policy (the reference), so a resumed run rebuilds the same dataset; built
  # before the train state takes the start policy's buffers (logged once a resume has rewound the metrics).
  prepared = method.prepare(policy, jax.random.fold_in(key, 2))
  part = lora.TrainedPart(enabled=lora_base is not None)  # LoRA: the adapters (and a value head) alone are trained
  state, train_step, frozen = _train_state(method, policy, part, optimizer, key, minibatch,
                                           iterative=updates is not None)
  policy = None
  stage = _Steps(method, logger, part, frozen, train_step, updates, minibatch, updates_per_step)
  position, start, start_accuracy = 0, 0, None
  if run_cfg.resume and ckpt.latest_step() is not None:
    state, start, position, key, start_accuracy = _restore(ckpt, stage.checkpoint_tree(state), method, part, updates,
                                                           lora_base, start_accuracy)
  elif evaluate_start is not None:
    if run_cfg.compile_ahead and steps > start:
      stage.ahead = ahead_lib.start(method, state, train_step, frozen)
    start_accuracy = evaluate_start(method.policy(stage.full(state.params)))
  if prepared:
    logger.log(start, prepared, prefix="data/")
    print("offline data: " + ", ".join(f"{k} {v:.4g}" for k, v in prepared.items()), file=sys.stderr)
  logger.start(steps)

  def trace_note(text):
    logger.newline()
    print(text, file=sys.stderr)

  with profiling.StepTracer(run_cfg.profile_steps, pathlib.Path(run_cfg.work_dir) / "profile", trace_note) as tracer:
    for step in range(start + 1, steps + 1):
      step_key = jax.random.fold_in(key, step)
      tracer.before(step)
      state, position = stage.step(state, step, position, step_key)
      tracer.after(step)
      interrupted = stage.iterate_and_evaluate(state, step, step_key, ckpt.stop_requested)
      if (run_cfg.save_every and step % run_cfg.save_every == 0) or step in (steps, run_cfg.stop_after) \
          or interrupted:
        ckpt.save(step, stage.checkpoint_tree(state), {
            "data_position": position, "key": np.asarray(key).tolist(), "sft_accuracy": start_accuracy,
            "algo": method.name, "lora_base": lora_base, **method.host_state()}, interrupted=interrupted)
      if step == run_cfg.stop_after:
        logger.newline()
        print(f"stopping after step {step} (--stop_after); continue with --resume", file=sys.stderr)
        return method.policy(stage.full(state.params)), start_accuracy, True
  logger.newline()
  return method.policy(stage.full(state.params)), start_accuracy, False


class _Steps:
  """What stage 2's steps hold fixed (the method, its update step and the frozen part of the policy, the logger,
  iterative RL's reward-model updates, the update plan) and what one step does with them."""

  def __init__(self, method: methods_lib.Method, logger, part: lora.TrainedPart, frozen, train_step,
               updates: learned_reward.RewardModelUpdates | None, minibatch: int, updates_per_step: int):
    self.method, self.logger, self.part, self.frozen, self.train_step = method, logger, part, frozen, train_step
    self.updates, self.minibatch, self.updates_per_step = updates, minibatch, updates_per_step
    self.per_iteration = method.config.reward_model.steps_per_iteration if updates else 0
    self.ahead = None  # the first step's programs compiling ahead (`trainer.ahead`), until that step starts

  def full(self, params):
    """The policy's whole params from the trained ones (with LoRA: joined to the frozen base)."""
    return self.part.join(params, self.frozen)

  def checkpoint_tree(self, state) -> dict:
    tree = {"train": state}
    if self.updates:  # the reference resets each iteration, the reward model and its replay history train
      tree.update(reference=self.part.trained(self.method.reference), **self.updates.checkpoint_state())
    return tree

  def evaluate(self, state) -> dict:
    return self.method.evaluate(self.method.policy(self.full(state.params)),
                                jax.random.PRNGKey(self.method.config.run.seed + 1))

  def step(self, state, step: int, position: int, step_key):
    """COLLECT, UPDATE and LOG of step `step`: `(state, data position)`."""
    method = self.method
    reset = self.method.config.reward_model.reset_reference
    if self.per_iteration and reset and step > 1 and (step - 1) % self.per_iteration == 0:
      # Algorithm 1: each iteration starts with π_ref ← π_θ (a copy: the train state is donated).
      method.use_reference(method.policy(self.full(jax.tree.map(jnp.copy, state.params))))
    if self.ahead is not None:  # the programs compiling ahead, finished (else the step would compile them too)
      self.ahead.wait()
      self.ahead = None
    # COLLECT: π_old is the current policy (online methods) or a fixed dataset (offline ones)
    batch, stats, position = method.collect(self.full(state.params), position, step_key)
    # UPDATE: μ epochs over the method's minibatches
    state, stats = _update(method, self.train_step, state, batch, stats, step, step_key, self.minibatch,
                           self.updates_per_step)
    values = self.logger.log(step, stats, prefix="train/")
    self.logger.progress(step, report.progress_line(values))
    return state, position

  def iterate_and_evaluate(self, state, step: int, step_key, stop_requested) -> bool:
    """ITERATE at an iteration's end (the reward model retrained: part of the step, whose checkpoint holds it), then
    EVALUATE every `eval_every` steps (the last step's is the final evaluation's). Returns whether the run stops
    after this step (`stop_requested()`: a signal noted on any process; every process asks at the same points).

    A signal noted by the end of the step skips its evaluation, so that the step in flight is saved within a
    preemption's grace period; one noted during the evaluation is answered right after it.
    """
    cfg = self.method.config
    if self.per_iteration and step % self.per_iteration == 0:
      _retrain_reward_model(self.updates, self.method, self.full(state.params), step // self.per_iteration, step,
                            step_key, self.logger, lambda: self.evaluate(state))
    evaluates = cfg.eval.eval_every and step % cfg.eval.eval_every == 0 and step != cfg.optim.steps
    if stop_requested():
      if evaluates:
        self.logger.newline()
        print(f"step {step}: evaluation skipped, the run is stopping", file=sys.stderr)
      return True
    if evaluates:
      self.logger.newline()
      values = self.logger.log(step, self.evaluate(state), prefix="eval/")
      print(f"step {step}: held-out accuracy {values['eval/accuracy']:.3f}", file=sys.stderr)
    return stop_requested()


def _train_state(method: methods_lib.Method, policy, part: lora.TrainedPart, optimizer, key, minibatch: int,
                 iterative: bool):
  """`(train state, its step, the frozen part or None)` from the start policy. Its params are handed over: the state
  takes their buffers (`Placement.train` deletes them; with LoRA the start adapters), so stage 2 holds π_θ, its
  moments and π_ref, and no other copy of the start policy. With LoRA and iterative RL, π_ref takes π_θ's adapters
  at each iteration; zero adapters until then keep the checkpoint's structure."""
  trained, frozen = part.split(method.init_params(policy, jax.random.fold_in(key, 1)))
  state, train_step = method.rollouts.placement.train(trained, optimizer, method.objective(),
                                                      method.update_micro_batches(minibatch), frozen=frozen,
                                                      bucketed=method.bucketed_update(),
                                                      skip_empty=method.skips_empty_micro_batches())
  if iterative and part.enabled:
    zero = jax.tree.map(jnp.zeros_like, lora.adapters(method.policy(part.join(state.params, frozen))))
    method.use_reference(part.join(zero, method.reference))
  return state, train_step, frozen


def _restore(ckpt: stage_checkpoints.StageCheckpoints, abstract, method: methods_lib.Method,
             part: lora.TrainedPart, updates, lora_base: dict | None, start_accuracy):
  """Stage 2 from its newest checkpoint: `(train state, step, data position, key, start accuracy)`; π_ref and the
  reward model put back where iterative RL keeps them, the method's host state (`Method.restore_host_state`)."""

  def same_base(meta):
    if meta.get("lora_base") != lora_base:
      raise RunError(f"--resume: the checkpoint's trained weights go with the base {meta.get('lora_base')}, this "
                     f"run's base is {lora_base}")

  tree, meta = ckpt.restore(abstract, check=same_base)  # records of steps after the checkpoint: re-run
  if updates:
    method.use_reference(part.join(tree["reference"], part.split(method.reference)[1]))
    updates.restore(tree)
  method.restore_host_state(meta)
  return (tree["train"], int(meta["step"]), int(meta["data_position"]), jnp.asarray(meta["key"], jnp.uint32),
          meta.get("sft_accuracy", start_accuracy))


def _update(method: methods_lib.Method, train_step, state, batch, stats: dict, step: int, step_key, minibatch: int,
            updates_per_step: int):
  """μ epochs of the method's minibatches of `batch`: `(state, stats)`, the step's metrics (over its minibatches:
  `report.combine`, brought to the host in one transfer, FloatingPointError if one is not finite) and times added
  to the collect's `stats`."""
  t0 = time.time()
  step_metrics = []
  for epoch in range(method.config.algorithm.num_epochs):
    for part in method.minibatches(batch, step_key, epoch, minibatch):
      state, metrics = train_step(state, part)
      step_metrics.append(metrics)
  on_device = {k: v for k, v in stats.items() if isinstance(v, jax.Array)}  # the collect's, left on the device
  step_metrics, on_device = jax.device_get((step_metrics, on_device))  # LOG: one transfer for all of it
  metrics = {k: report.combine(k, [float(m[k]) for m in step_metrics]) for k in step_metrics[0]}
  update_time = time.time() - t0
  stats.update({k: float(v) for k, v in on_device.items()})
  warm_start.check_finite(metrics, f"{method.name} step {step}")
  stats.update(metrics, time_update=update_time, optimizer_steps=float(updates_per_step))
  step_time = stats.get("time_sampling", 0.0) + stats.get("time_scoring", 0.0) + update_time
  if "generated_tokens" in stats:
    stats["tokens_per_s"] = stats.pop("generated_tokens") / max(step_time, 1e-9)
  return state, stats


def _retrain_reward_model(updates: learned_reward.RewardModelUpdates, method: methods_lib.Method, params,
                          iteration: int, step: int, step_key, logger, evaluate) -> None:
  """ITERATE, at an iteration's end (DeepSeekMath Algorithm 1): the reward model retrained on samples of π_θ
  (`params`), then logged with the policy's held-out metrics (`evaluate()`)."""
  logger.newline()
  rm_metrics = updates.update(method.policy(params), iteration, jax.random.fold_in(step_key, 20_000))
  values = logger.log(step, {"iteration": float(iteration), **rm_metrics}, prefix="rm/")
  policy_eval = logger.log(step, evaluate(), prefix="iteration/")
  held_out = ""
  if "rm/held_out_before_outcome/group_auc" in values:
    held_out = (f", AUC within problems on fresh held-out samples {values['rm/held_out_before_outcome/group_auc']:.3f}"
                f" -> {values['rm/held_out_after_outcome/group_auc']:.3f}")
  print(f"iteration {iteration}: held-out accuracy {policy_eval['iteration/accuracy']:.3f}; reward model on "
        f"fresh policy samples: accuracy {values['rm/before_outcome/accuracy']:.3f} -> "
        f"{values['rm/after_outcome/accuracy']:.3f}{held_out}", file=sys.stderr)


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
  resume_lib.check_start([ckpt_dir, sft_ckpt_dir], run_cfg.resume, resumable=(work_dir / "sft_policy").is_dir())
  placement = placement_lib.Placement.from_config(cfg.mesh)
  plan.check_placement(cfg, placement)
  attention, warning = policy_lib.attention_that_runs(cfg.model)
  if warning:  # the kernel asked for is not on this backend: what runs instead, in config.json too
    report.note(warning)
    cfg = cfg.replace(attention=attention)
  # One run per work dir; SIGTERM / SIGINT stop after the step in flight, with its checkpoint (`preemption`).
  with work_dir_lock.WorkDirLock(work_dir), preemption.StopSignals() as signals:
    return _stages(cfg, method_cls, placement, signals)


def _stages(cfg: config_lib.Config, method_cls, placement: placement_lib.Placement,
            signals: preemption.StopSignals) -> dict:
  """`run` in its locked work dir: stage 1, stage 2, the final evaluation and exports."""
  run_cfg = cfg.run
  work_dir = pathlib.Path(run_cfg.work_dir)
  ckpt_dir, sft_ckpt_dir = work_dir / "checkpoints", work_dir / warm_start.CHECKPOINTS
  if run_cfg.resume:  # refuse other settings before anything (flags.txt included) is written
    resume_lib.check_before_writing(ckpt_dir if resume_lib.holds_checkpoints(ckpt_dir) else sft_ckpt_dir,
                                    resume_lib.record(cfg), report.note)
  resumed_stage2 = run_cfg.resume and resume_lib.holds_checkpoints(ckpt_dir)
  logs.check(work_dir, run_cfg)  # before the model loads, and before anything is written
  times = {"start": time.time()}
  work_dir.mkdir(parents=True, exist_ok=True)
  if distributed.is_main_process():
    (work_dir / "config.json").write_text(json.dumps(resume_lib.record(cfg), indent=2))
  params, model_config, tokenizer, needs_sft, source = policy_lib.load(cfg, placement, method_cls.sft_marker)
  task = task_lib.Task(cfg.task, tokenizer, sft_lineage=needs_sft or policy_lib.sft_lineage(
      source, cfg.task, method_cls.sft_marker), seed=run_cfg.seed)
  if method_cls.samples_each_step:
    task.check_batch(cfg.rollout.batch_size)
  logger = logs.start(work_dir, run_cfg, resume_lib.record(cfg), cfg.optim.steps)
  reward_model = learned_reward.make(cfg, tokenizer, model_config, placement)
  lora_targets = config_lib.lora_targets(cfg.model.lora_targets)
  policy_config = lora.lora_config(model_config, rank=cfg.model.lora_rank, alpha=cfg.model.lora_alpha,
                                   targets=lora_targets) if cfg.model.lora_rank else model_config
  rollouts = methods_lib.Rollouts(cfg, policy_config, task, reward_model, placement)
  method = method_cls(cfg, policy_config, task, rollouts, None)
  print(f"policy from {source} ({model_config.model_type}, {sum(x.size for x in jax.tree.leaves(params)):,} "
        f"params); task {cfg.task.task}: {len(task.train)} train / {len(task.test)} held-out problems",
        file=sys.stderr)

  times["sft"] = time.time()
  if needs_sft:
    params = _stage1(cfg, method, params, model_config, source, logger, tokenizer.pad_token_id or 0, placement,
                     signals)
  elif signals.stop_requested():
    raise preemption.Interrupted(signals.signum, 0, "stage-2")
  lora_base = None
  if cfg.model.lora_rank:  # stage 2 trains adapters on this base (stage 1, if any, fine-tuned it whole)
    params = placement.put_params(lora.add_adapters(params, policy_config, jax.random.PRNGKey(run_cfg.seed + 3)))
    lora_base = policy_lib.base_record(work_dir / "sft_policy" if needs_sft else source)
  start_eval = {}

  def evaluate_start(policy) -> float:
    """The start policy's held-out metrics, logged at step 0 (stage 2 runs it once its train state exists, while
    the first step's programs compile ahead); returns its accuracy."""
    values = logger.log(0, method.evaluate(policy, jax.random.PRNGKey(run_cfg.seed + 1)), prefix="eval/")
    start_eval.update({k[len("eval/"):]: v for k, v in values.items()})
    print(f"start policy: held-out accuracy {start_eval['accuracy']:.3f}", file=sys.stderr)
    times["rl"] = time.time()
    return start_eval["accuracy"]

  times["rl"] = time.time()
  policy, start_accuracy = _stage2(method, params, logger, None if resumed_stage2 else evaluate_start, lora_base,
                                   reward_model, signals)
  if policy is None:  # --stop_after
    logger.close()
    task.close()
    return {}
  params = None  # the start policy: its memory free for the final evaluation and export
  times["final"] = time.time()
  final_eval, validation = _evaluate_and_export(method, policy, lora_base, source, logger)
  logger.close()
  task.close()  # its math_verify workers (an exception leaves them to the verifier's finalizer, at exit at the latest)
  return _summary(method, start_accuracy, start_eval, final_eval, validation, times)


def _stage1(cfg: config_lib.Config, method: methods_lib.Method, params, model_config, source, logger, pad_id: int,
            placement: placement_lib.Placement, signals: preemption.StopSignals):
  """STAGE 1: the SFT warm start on the method's demonstrations, exported as `sft_policy` (a resumed run starts
  from there: the stage's checkpoints are removed); returns the fine-tuned params."""
  work_dir = pathlib.Path(cfg.run.work_dir)
  demos = method.demonstrations()
  print(f"stage 1: SFT warm start, {cfg.sft.sft_steps} steps on {len(demos.pairs)} demonstrations",
        file=sys.stderr)
  params = warm_start.warm_start(params, model_config, demos, cfg, logger, pad_id, placement, signals)
  policy_lib.export(params, model_config, source, work_dir / "sft_policy",
                    {method.sft_marker: policy_lib.sft_marker(cfg.task.task, cfg.task.sft_examples, cfg.run.seed)})
  warm_start.remove_checkpoints(work_dir / warm_start.CHECKPOINTS)  # stage 1 is done
  if signals.stop_requested():
    raise preemption.Interrupted(signals.signum, cfg.sft.sft_steps, "SFT", work_dir / "sft_policy")
  return params


def _stage2(method: methods_lib.Method, params, logger, evaluate_start, lora_base: dict | None, reward_model,
            signals: preemption.StopSignals):
  """STAGE 2 around `train`: π_ref and iterative RL's reward-model updates passed in, the checkpoints opened;
  returns `(final policy, the start policy's accuracy)`, the policy None when `--stop_after` stopped the run.
  `evaluate_start(policy) -> accuracy`: the start evaluation (None: a resumed stage 2 has had it)."""
  cfg = method.config
  print(f"stage 2: {method.name}, {cfg.optim.steps} steps of {cfg.rollout.batch_size} prompts x "
        f"{cfg.rollout.group_size} samples", file=sys.stderr)
  # frozen π_ref: the start policy, a copy (`train` hands `params` to the train state, which deletes them); with
  # LoRA the base itself (the adapters off: no copy of the weights; the base is frozen, never handed over)
  method.use_reference(lora.disabled(params) if lora_base else jax.tree.map(jnp.copy, params))
  updates = learned_reward.RewardModelUpdates(reward_model, method.task, method.rollouts) \
      if cfg.reward_model.iterations > 1 else None
  recorded = resume_lib.record(cfg)
  check_flags = lambda then, step: resume_lib.check_flags(then, recorded, step, report.note)  # noqa: E731
  with stage_checkpoints.StageCheckpoints(pathlib.Path(cfg.run.work_dir) / "checkpoints", cfg.run.keep_checkpoints,
                                          logger, recorded, check_flags, "stage-2", signals) as ckpt:
    policy, start_accuracy, stopped = train(method, params, logger, ckpt, evaluate_start, lora_base, updates)
  method.use_reference(None)  # its memory free for the final evaluation and export
  return None if stopped else policy, start_accuracy


def _evaluate_and_export(method: methods_lib.Method, policy, lora_base: dict | None, source, logger):
  """The final policy's held-out (and, with --num_validation, validation) metrics, logged; the policy exported
  (merged: a plain model; with --lora_export_peft its adapters too). Returns `(final metrics, validation)`."""
  cfg, task = method.config, method.task
  work_dir = pathlib.Path(cfg.run.work_dir)
  final_eval = method.evaluate(policy, jax.random.PRNGKey(cfg.run.seed + 1))
  logger.log(cfg.optim.steps, final_eval, prefix="eval/")
  validation = {}
  if task.validation:  # --num_validation: the held-out training problems, for choosing hyperparameters
    validation = method.evaluate(policy, jax.random.PRNGKey(cfg.run.seed + 1), task.validation_view())
    validation = {"val_accuracy": validation["accuracy"], "num_validation_problems": len(task.validation)}
    logger.log(cfg.optim.steps, {"val_accuracy": validation["val_accuracy"]}, prefix="eval/")
  if cfg.model.lora_export_peft:
    policy_lib.export_adapters(policy, method.model_config, lora_base["path"], work_dir / "final_adapter")
  policy_lib.export(*lora.merge(policy, method.model_config), source, work_dir / "final_policy")  # merged: plain
  return final_eval, validation


def _summary(method: methods_lib.Method, start_accuracy, start_eval: dict, final_eval: dict, validation: dict,
             times: dict) -> dict:
  """The run's summary, written to `<work_dir>/summary.json` (main process) and shown as the closing table."""
  cfg, task = method.config, method.task
  work_dir = pathlib.Path(cfg.run.work_dir)
  peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
  summary = {"algo": method.name, "start_accuracy": start_accuracy, "final_accuracy": final_eval["accuracy"],
             "num_eval_problems": len(task.test), "wall_time_s": time.time() - times["start"],
             "sft_time_s": times["rl"] - times["sft"], "rl_time_s": times["final"] - times["rl"],
             "peak_rss_mib": peak_mib,
             **{f"start_{k}": v for k, v in start_eval.items()},
             **{f"final_{k}": v for k, v in final_eval.items()},
             **{("final_" if k == "val_accuracy" else "") + k: v for k, v in validation.items()},
             "code_version": git_commit.head_commit(), "config": resume_lib.record(cfg)}
  if distributed.is_main_process():
    training.atomic_write_text(work_dir / "summary.json", json.dumps(summary, indent=2))
  rows = [("held-out problems", f"{len(task.test)}"),
          ("greedy accuracy, start", "n/a" if start_accuracy is None else f"{100 * start_accuracy:.1f}%"),
          (f"greedy accuracy, after {method.name}", f"{100 * final_eval['accuracy']:.1f}%"),
          *method.summary_rows(start_eval, final_eval),
          ("wall time (this run)", f"{summary['wall_time_s'] / 60:.1f} min"),
          ("peak host memory (RSS)", f"{peak_mib:,.0f} MiB")]
  report.print_table("summary", rows)
  print(f"final policy (HF format): {work_dir / 'final_policy'}")
  return summary
