"""Stage 1: supervised fine-tuning of the start policy on demonstrations (the SFT of DeepSeekMath's paradigm,
GC = 1): worked solutions for the single-turn methods, teacher trajectories' actions for Flow-GRPO."""

from typing import NamedTuple, Sequence

import numpy as np

from experiments.runner import config as config_lib
from experiments.runner import placement as placement_lib
from grpo_jax import training
from grpo_jax.training import update as update_lib


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
               placement: placement_lib.Placement):
  """`sft_steps` AdamW steps (cosine from `sft_learning_rate`) of the teacher-forced NLL of the targets, batches
  of `sft_batch_size` pairs drawn with replacement; returns the fine-tuned params."""
  sft = config.sft
  if not demos.pairs:
    raise config_lib.RunError("SFT needs demonstrations, and the training set gives none; pass --sft_steps=0")
  optimizer = training.make_optimizer(sft.sft_learning_rate, warmup_steps=min(50, sft.sft_steps // 10),
                                      total_steps=sft.sft_steps, schedule="cosine", max_grad_norm=1.0)
  objective = update_lib.bind(training.sft_objective, config=model_config, chunk_size=config.model.logprob_chunk)
  state, train_step = placement.train(params, optimizer, objective, config.algorithm.grad_accum_steps)
  prompt_len, target_len = batch_widths(demos)
  rng = np.random.default_rng([config.run.seed, demos.stream])
  logger.start(sft.sft_steps)
  for step in range(1, sft.sft_steps + 1):
    chunk = [demos.pairs[i] for i in rng.integers(0, len(demos.pairs), sft.sft_batch_size)]
    batch = training.supervised_batch([p for p, _ in chunk], [t for _, t in chunk], prompt_len, target_len, pad_id)
    state, metrics = train_step(state, batch)
    if step % 25 == 0 or step == sft.sft_steps:
      values = logger.log(step, metrics, prefix="sft/")
      check_finite(values, f"SFT step {step}")
      logger.progress(step, f"sft loss {values['sft/loss']:.4f}")
  logger.newline()
  return state.params
