"""Offline data from the start (SFT) policy, as RFT and DPO use it: G samples for each of a fixed
set of training prompts, drawn once before training."""

import functools
import time

import jax
import numpy as np

from experiments.methods import rollouts as rollouts_lib
from grpo_jax import sampling



def sample_offline(rollouts: rollouts_lib.Rollouts, params, task, key) -> tuple[rollouts_lib.Scored, list, dict]:
  """`(scored, prompt_index_of_row, stats)`: G samples for each of the first `offline_prompts` prompts, as host
  arrays (the dataset is drawn once and indexed on the host)."""
  config = rollouts.config
  b, g = config.rollout.batch_size, config.rollout.group_size
  num_prompts = min(config.algorithm.offline_prompts, len(task.rl_pool))
  t0 = time.time()
  parts = []
  for start in range(0, num_prompts, b):
    count = min(b, num_prompts - start)
    examples = [task.train_example(start + i) for i in range(count)]
    examples += examples[-1:] * (b - count)  # fixed shapes: one compile; the repeats are dropped below
    scored = rollouts.sample(params, examples, jax.random.fold_in(key, start), g)
    parts.append((scored, count))
  samples = sampling.SampleOutput(*[np.concatenate([np.asarray(getattr(s.host, f))[:n * g] for s, n in parts])
                                    for f in sampling.SampleOutput._fields])
  rewards = np.concatenate([s.rewards[:n * g] for s, n in parts])
  correct = np.concatenate([s.correct[:n * g] for s, n in parts])
  prompt_of_row = np.repeat(np.arange(num_prompts), g)
  stats = {"offline_prompts": float(num_prompts), "offline_samples": float(len(rewards)),
           "offline_accuracy": float(correct.mean()), "time_offline_sampling": time.time() - t0}
  return rollouts_lib.Scored(samples, rewards, correct, 0.0, samples), prompt_of_row, stats


def epoch_order(size: int, position: int, seed: int) -> int:
  """The dataset row at a position of the endless, per-epoch shuffled order."""
  epoch, index = divmod(position, size)
  return int(_permutation(size, seed, epoch)[index])


@functools.lru_cache(maxsize=4)
def _permutation(size: int, seed: int, epoch: int) -> np.ndarray:
  return np.random.default_rng([seed, 7, epoch]).permutation(size)
