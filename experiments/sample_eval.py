r"""Maj@K and Pass@K of a policy for every K = 1, 2, 4, ..., --eval_samples, from one set of samples.

  python -m experiments.sample_eval --init_checkpoint=runs/grpo_math/final_policy \
      --eval_samples=64 --work_dir=runs/eval_k

DeepSeekMath's Fig 7 (arXiv 2402.03300) plots Maj@K and Pass@K against K before and after RL. The runner's
evaluation (`experiments.grpo_math --eval_samples=K`) reports the same metrics during training; this entry point
evaluates a saved policy: it samples K
completions per held-out problem once, at --eval_temperature, and reports the unbiased pass@k (Chen et al.
2021) and maj@k (the majority answer of the first k samples) for each power of two up to K, plus greedy
accuracy. Task, held-out set, prompt and sampling flags are those of experiments.grpo_math, and the keys are
the runner's (PRNGKey(seed + 1), then fold_in 1 for the samples), so its K and 1 agree with a runner's
evaluation of the same policy and seed. Writes `summary.json` (`accuracy`, `maj@k`, `pass@k`, ...) and
`flags.txt` in --work_dir.
"""

import dataclasses
import json
import pathlib
import sys
import time

from absl import app
import jax

from experiments import cli
from experiments.runner import config as config_lib
from experiments.runner import evaluation
from experiments.runner import git_commit
from experiments.runner import placement as placement_lib
from experiments.runner import report
from experiments.runner import task as task_lib
from experiments.runner import work_dir_lock
from grpo_jax import models



# The shared flags (`experiments/cli.py`) this entry point does not read: refused unless at their defaults
# (--notensorboard is accepted: it writes no event files either way).
UNREAD = ("model", "tiny_layers", "tiny_hidden_size", "remat", "remat_policy", "scan_layers", "logprob_chunk",
          "attention", "lora_rank", "lora_alpha", "lora_targets", "lora_export_peft", "sft_steps", "sft_batch_size",
          "sft_learning_rate", "sft_save_every", "batch_size", "group_size", "temperature", "top_p", "top_k",
          *(f.name for f in dataclasses.fields(config_lib.RolloutConfig)
            if f.name not in ("batch_size", "group_size", "temperature", "top_p", "top_k", "max_new_tokens")),
          *(f.name for f in dataclasses.fields(config_lib.AlgorithmConfig)),
          *(f.name for f in dataclasses.fields(config_lib.OptimConfig)),
          *(f.name for f in dataclasses.fields(config_lib.RewardModelConfig)),
          *(f.name for f in dataclasses.fields(config_lib.AgentConfig)), "eval_every", "save_every",
          "keep_checkpoints", "resume", "stop_after", "wandb_project", "wandb_mode", "wandb_entity",
          "wandb_run_name", "profile_steps", "compile_ahead", "mesh", "sharding_rules", "coordinator_address",
          "num_processes", "process_id", "forward_rows", "forward_memory_budget")
INSTEAD = {"model": "--init_checkpoint", "temperature": "--eval_temperature", "batch_size": "--eval_batch_size",
           "group_size": "--eval_samples"}


def run(config: config_lib.Config) -> dict:
  """Greedy accuracy and maj@k / pass@k of `init_checkpoint` on the held-out set; writes `summary.json`."""
  t_start = time.time()
  for name in UNREAD:
    config_lib.refuse_unread(config, (name,), "sample_eval", INSTEAD.get(name, ""))
  if not config.model.init_checkpoint:
    raise config_lib.RunError("--init_checkpoint is required: the HF directory of the policy to evaluate")
  k = config.eval.eval_samples
  if k < 1:
    raise config_lib.RunError("--eval_samples must be >= 1: the K of maj@K and pass@K")
  models.read_config(config.model.init_checkpoint)  # a missing or unreadable checkpoint: before the work dir exists
  work_dir = pathlib.Path(config.run.work_dir)
  with work_dir_lock.WorkDirLock(work_dir):  # one evaluation a work dir: a second one is one line, not a race
    return _evaluate(config, k, work_dir, t_start)


def _evaluate(config: config_lib.Config, k: int, work_dir: pathlib.Path, t_start: float) -> dict:
  path = pathlib.Path(config.model.init_checkpoint)
  params, model_config = models.load_hf(path, dtype=config.model.dtype, param_dtype=config.model.dtype,
                                        decode_projections=config.model.decode_projections)
  task = task_lib.Task(config.task, models.load_tokenizer(path), sft_lineage=False, seed=config.run.seed)
  print(f"sampling {k} completions for each of {len(task.test)} held-out problems from {path} "
        f"(T = {config.eval.eval_temperature})", file=sys.stderr)
  metrics = evaluation.evaluate(params, model_config, task, config, jax.random.PRNGKey(config.run.seed + 1),
                                placement_lib.Placement())
  ks = evaluation.ks_up_to(k)
  summary = {"policy": str(path), **metrics, "num_eval_problems": len(task.test), "eval_samples": k,
             "eval_temperature": config.eval.eval_temperature, "ks": ks, "wall_time_s": time.time() - t_start,
             "code_version": git_commit.head_commit()}
  partial = work_dir / "summary.json.partial"  # written whole, then renamed: never a half-written summary
  partial.write_text(json.dumps(summary, indent=2))
  partial.replace(work_dir / "summary.json")
  rows = [("held-out problems", f"{len(task.test)}"), ("greedy accuracy", f"{100 * summary['accuracy']:.1f}%")]
  rows += [(f"maj@{j} / pass@{j}", f"{100 * summary[f'maj@{j}']:.1f}% / {100 * summary[f'pass@{j}']:.1f}%")
           for j in ks]
  report.print_table(f"sampled evaluation of {path}", rows)
  return summary


if __name__ == "__main__":
  app.run(cli.main_for("sample_eval", run))
