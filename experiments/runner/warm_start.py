"""Stage 1: supervised fine-tuning of the start policy on demonstrations (the SFT of DeepSeekMath's paradigm,
GC = 1): worked solutions for the single-turn methods, teacher trajectories' actions for Flow-GRPO.

Stage 1 saves a checkpoint when a signal stops it (`preemption`), and every `--sft_save_every` steps:
`<work_dir>/sft_checkpoints/<step>` (the newest only), the train state with the step, the flags and the metrics
offset. `--resume` continues from it, drawing the same batches as an uninterrupted run; once stage 1 is done and
`sft_policy` exported, the directory is removed.
"""

import pathlib
import shutil
import sys
from typing import NamedTuple, Sequence

import numpy as np

from experiments.runner import config as config_lib
from experiments.runner import placement as placement_lib
from experiments.runner import preemption
from experiments.runner import resume as resume_lib
from grpo_jax import distributed
from grpo_jax import training
from grpo_jax.training import update as update_lib


CHECKPOINTS = "sft_checkpoints"  # under the work dir


def remove_checkpoints(directory: pathlib.Path) -> None:
  """Removes stage 1's checkpoints (process 0; every process waits for it)."""
  if distributed.is_main_process():
    shutil.rmtree(directory, ignore_errors=True)
  distributed.barrier("remove sft_checkpoints")


class Demonstrations(NamedTuple):
  """What stage 1 imitates: (prompt ids, target ids ending with the end token) pairs, and the longest prompt and
  target a batch keeps (longer prompts are cut from the left, longer targets from the right)."""
  pairs: Sequence[tuple[list[int], list[int]]]
  prompt_len: int
  target_len: int
  stream: int  # the data order's RNG stream, default_rng([seed, stream]): one per method family


def check_finite(values: dict, where: str) -> None:
  """Raises FloatingPointError naming the non-finite metrics (the run stops before it saves)."""
  bad = [k for k, v in values.items() if not np.isfinite(v)]
  if bad:
    raise FloatingPointError(f"{where}: non-finite {', '.join(bad)}; stopping without saving a checkpoint")


def batch_widths(demos: Demonstrations) -> tuple[int, int]:
  """`(prompt columns, target columns)` of every stage-1 batch: the pool's longest prompt and target, within the
  limits. One width for the whole stage (one compile), and no column that is padding in every row of the pool:
  the embedded default's 16 + 40 limits hold prompts of at most 10 tokens and targets of at most 35."""
  return (min(demos.prompt_len, max(1, *(len(p) for p, _ in demos.pairs))),
          min(demos.target_len, max(len(t) for _, t in demos.pairs)))


def warm_start(params, model_config, demos: Demonstrations, config: config_lib.Config, logger, pad_id: int,
               placement: placement_lib.Placement, signals: preemption.StopSignals | None = None):
  """`sft_steps` AdamW steps (cosine from `sft_learning_rate`) of the teacher-forced NLL of the targets, batches
  of `sft_batch_size` pairs drawn with replacement; returns the fine-tuned params.

  With `--resume`, continues from `<work_dir>/sft_checkpoints`. Saves every `--sft_save_every` steps there (not
  the last: `sft_policy` is its export); after a step (not the last) during which `signals` noted SIGTERM or
  SIGINT, saves it there and raises `preemption.Interrupted`.
  """
  sft = config.sft
  if not demos.pairs:
    raise config_lib.RunError("SFT needs demonstrations, and the training set gives none; pass --sft_steps=0")
  optimizer = training.make_optimizer(sft.sft_learning_rate, warmup_steps=min(50, sft.sft_steps // 10),
                                      total_steps=sft.sft_steps, schedule="cosine", max_grad_norm=1.0)
  objective = update_lib.bind(training.sft_objective, config=model_config, chunk_size=config.model.logprob_chunk)
  state, train_step = placement.train(params, optimizer, objective, config.algorithm.grad_accum_steps)
  prompt_len, target_len = batch_widths(demos)
  rng = np.random.default_rng([config.run.seed, demos.stream])
  directory = pathlib.Path(config.run.work_dir) / CHECKPOINTS
  start, recorded = 0, resume_lib.record(config)
  if config.run.resume and directory.is_dir() and any(directory.iterdir()):
    ckpt = training.Checkpointer(directory, max_to_keep=1)
    try:
      state, meta = ckpt.restore_intact(state, check=lambda meta, step: resume_lib.check_flags(
          meta.get("flags"), recorded, step, lambda line: print(line, file=sys.stderr)))
    finally:
      ckpt.close()
    start = int(meta["step"])
    logger.rewind(meta.get("metrics_offset"))
    print(f"stage 1 resumed from step {start} in {directory}", file=sys.stderr)
  logger.start(sft.sft_steps)
  for step in range(1, sft.sft_steps + 1):
    indices = rng.integers(0, len(demos.pairs), sft.sft_batch_size)  # drawn for every step: the same stream
    if step <= start:
      continue
    chunk = [demos.pairs[i] for i in indices]
    batch = training.supervised_batch([p for p, _ in chunk], [t for _, t in chunk], prompt_len, target_len, pad_id)
    state, metrics = train_step(state, batch)
    if step % 25 == 0 or step == sft.sft_steps:
      values = logger.log(step, metrics, prefix="sft/")
      check_finite(values, f"SFT step {step}")
      logger.progress(step, f"sft loss {values['sft/loss']:.4f}")
    if step == sft.sft_steps:  # the last step: sft_policy is its export
      continue
    stop = signals is not None and signals.stop_requested()
    if stop or (sft.sft_save_every and step % sft.sft_save_every == 0):
      ckpt = training.Checkpointer(directory, max_to_keep=1)
      try:
        ckpt.save(step, state, {"step": step, "flags": recorded, "metrics_offset": logger.offset()})
      finally:
        ckpt.close()
    if stop:
      logger.newline()
      raise preemption.Interrupted(signals.signum, step, "SFT", directory)
  logger.newline()
  return state.params
