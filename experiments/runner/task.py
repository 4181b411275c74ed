"""The task: training pool, held-out set, prompt format and rule reward, from a `TaskConfig`."""

import copy
import functools
import glob
import os

import numpy as np

from experiments.runner import config as config_lib
from grpo_jax import data
from grpo_jax import rewards as rewards_lib
from grpo_jax.data import synthetic_paths
from grpo_jax.rewards import math_verify_reward


def check_files(config: config_lib.TaskConfig) -> None:
  """Raises RunError naming `--train_file` / `--test_file` when a dataset task lacks one or it matches no path, so
  a run can refuse before it writes anything (`Task` reads them)."""
  if config.task in config_lib.SYNTHETIC_TASKS:
    return
  for name in ("train_file", "test_file"):
    path = getattr(config, name)
    if not path:
      raise config_lib.RunError(f"--task={config.task} needs --{name} (a JSONL or parquet file, or a `datasets` "
                                "save_to_disk folder)")
    if not glob.glob(os.path.expanduser(path)):
      raise config_lib.RunError(f"--{name}: {path} does not exist")


class Task:
  """Training pool, held-out set, prompt format and rewards of the chosen task.

  `sft_lineage`: the start policy is a stage-1 SFT policy, so RL draws its prompts from the problems SFT did not
  see (the first `sft_examples` are SFT's). `seed` orders the training pool and draws the synthetic problems.
  """

  def __init__(self, config: config_lib.TaskConfig, tokenizer, sft_lineage: bool, seed: int):
    self.config, self.seed = config, seed
    if config.task == "synthetic":
      synthetic = data.SyntheticConfig(min_steps=config.synthetic_min_steps, max_steps=config.synthetic_max_steps,
                                       max_digits=config.synthetic_digits, ops=config.synthetic_ops)
      self.train, self.test = data.make_splits(config.num_train, config.num_test, seed=seed, config=synthetic)
    elif config.task == "synthetic_paths":
      paths = synthetic_paths.PathsConfig(min_steps=config.paths_min_steps, max_steps=config.paths_max_steps)
      self.train, self.test = synthetic_paths.make_splits(config.num_train, config.num_test, seed=seed, config=paths)
    else:
      for name in ("train_file", "test_file"):
        if not getattr(config, name):
          raise config_lib.RunError(f"--task={config.task} needs --{name} (a JSONL or parquet file, or a "
                                    "`datasets` save_to_disk folder)")
      self.train = data.load_task(config.task, "train", path=config.train_file)
      self.test = data.load_task(config.task, "test", path=config.test_file)[:config.num_test]
      if not self.train or not self.test:
        raise config_lib.RunError(f"no problems in {config.train_file if not self.train else config.test_file}")
    template = config.prompt_template
    if template == "auto":
      template = "chat" if config.task not in config_lib.SYNTHETIC_TASKS and getattr(tokenizer, "chat_template", None) else "plain"
    self.template = template
    self.tokenizer = tokenizer
    # SFT needs worked solutions, RL only answers: split the pool so RL trains on problems SFT never saw.
    # Without the SFT stage (an HF model, --init_checkpoint) every problem is an RL prompt.
    split = config.sft_examples if sft_lineage and 0 < config.sft_examples < len(self.train) else 0
    self.sft_pool = self.train[:split] if split else self.train
    self.rl_pool = self.train[split:]
    # --num_validation: problems of the RL pool drawn at random (by the seed), never trained on, for choosing
    # hyperparameters without the test set. Not the pool's tail: the synthetic generator's last distinct problems are
    # harder than the rest (a policy at 42.8% on the pool's first 500 and 45.6% on test scored 31.4% on its last 500).
    self.validation = []
    if config.num_validation:
      if config.num_validation >= len(self.rl_pool):
        raise config_lib.RunError(f"--num_validation={config.num_validation} leaves no RL problems of "
                                  f"{len(self.rl_pool)}")
      held = set(np.random.default_rng([seed, 56]).permutation(len(self.rl_pool))[:config.num_validation].tolist())
      self.validation = [e for i, e in enumerate(self.rl_pool) if i in held]
      self.rl_pool = [e for i, e in enumerate(self.rl_pool) if i not in held]
    # A learned or step reward (orm|prm|exact_steps) scores in the rollouts; the rule reward is then
    # correctness, for logs.
    spec = "correctness" if config.reward in ("orm", "prm", "exact_steps") else config.reward
    # --reward=math_verify: this task's own verifier, with its flags (workers start at the first check; `close`)
    self.verifier = None
    if any(name == rewards_lib.VERIFIED for name, _ in rewards_lib.parse_reward_spec(spec)):
      self.verifier = math_verify_reward.MathVerifier(config.math_verify_time_limit, config.math_verify_workers)
    self.reward_fn = rewards_lib.make_reward_fn(spec, self.verifier)
    self.is_formatted = (rewards_lib.has_final_answer_format if config.task != "math"
                         else lambda c: rewards_lib.extract_boxed(c) is not None)

  def close(self) -> None:
    """Stops the task's math_verify workers, if any (a later check would start new ones)."""
    if self.verifier is not None:
      self.verifier.close()

  def check_batch(self, batch_size: int) -> None:
    """Raises RunError when a file task's RL pool holds fewer problems than a step's `batch_size` prompts (a step
    would hold a problem twice; a synthetic task's --num_train is checked before anything loads)."""
    if self.config.task not in config_lib.SYNTHETIC_TASKS and batch_size > len(self.rl_pool):
      held = [f"{len(self.train) - len(self.rl_pool) - len(self.validation)} for SFT"] * (len(self.sft_pool) < len(
          self.train)) + [f"{len(self.validation)} for --num_validation"] * bool(self.validation)
      raise config_lib.RunError(f"--batch_size={batch_size} exceeds the {len(self.rl_pool)} RL problems of "
                                f"--train_file={self.config.train_file}"
                                + (f" ({', '.join(held)} held out of {len(self.train)})" if held else ""))

  def prompt(self, example: data.Example) -> str:
    if self.config.task in config_lib.SYNTHETIC_TASKS and self.template == "plain":
      return data.format_prompt(example)
    instruction = ("Solve step by step and put the final answer in \\boxed{}." if self.config.task == "math"
                   else "Solve step by step and end with a line '#### <answer>'.")
    if self.template == "chat":
      messages = [{"role": "user", "content": f"{example.question}\n{instruction}"}]
      return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return f"Question: {example.question}\n{instruction}\nAnswer:\n"

  def validation_view(self) -> "Task":
    """The same task with the validation problems as its held-out set (what an evaluation reads)."""
    view = copy.copy(self)
    view.test, view.validation = self.validation, []
    return view

  def train_example(self, position: int) -> data.Example:
    """The example at a position of the endless, per-epoch shuffled training order."""
    epoch, index = divmod(position, len(self.rl_pool))
    return self.rl_pool[epoch_permutation(len(self.rl_pool), self.seed, epoch)[index]]


@functools.lru_cache(maxsize=4)
def epoch_permutation(size: int, seed: int, epoch: int) -> np.ndarray:
  """The order of the pool's `size` examples in `epoch`, computed once per (size, seed, epoch) rather than once
  per example read (B reads a step, each an O(size) shuffle). Four are kept: the RL order's epoch, the next one
  at an epoch's end, and iterative RL's reward-model prompts, drawn from a far-off epoch."""
  order = np.random.default_rng([seed, epoch]).permutation(size)
  order.flags.writeable = False  # shared by every caller
  return order
