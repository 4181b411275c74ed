r"""Maj@K and Pass@K of a policy for every K = 1, 2, 4, ..., --eval_samples, from one set of samples.

  python -m experiments.studies.sample_eval --init_checkpoint=runs/grpo_math/final_policy \
      --eval_samples=64 --work_dir=runs/eval_k

DeepSeekMath's Fig 7 (arXiv 2402.03300) plots Maj@K and Pass@K against K before and after RL. The runner's
evaluation (`experiments.grpo_math --eval_samples=K`) reports K and 1 only; this entry point samples K
completions per held-out problem once, at --eval_temperature, and reports the unbiased pass@k (Chen et al.
2021) and maj@k (the majority answer of the first k samples) for each power of two up to K, plus greedy
accuracy. Task, held-out set, prompt and sampling flags are those of experiments.grpo_math, and the keys are
the runner's (PRNGKey(seed + 1), then fold_in 1 for the samples), so its K and 1 agree with a runner's
evaluation of the same policy and seed. Writes `summary.json` (`accuracy`, `maj@k`, `pass@k`, ...) and
`flags.txt` in --work_dir.
"""

import json
import pathlib
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

from experiments import grpo_math
from grpo_jax import data
from grpo_jax import evaluation
from grpo_jax import models

FLAGS = flags.FLAGS


def ks_up_to(k: int) -> list[int]:
  """1, 2, 4, ... up to k, and k itself."""
  return sorted({1, k} | {2 ** i for i in range(k.bit_length()) if 2 ** i <= k})


def run() -> dict:
  t_start = time.time()
  if not FLAGS.init_checkpoint:
    raise grpo_math.RunError("--init_checkpoint is required: the HF directory of the policy to evaluate")
  if FLAGS.eval_samples < 1:
    raise grpo_math.RunError("--eval_samples must be >= 1: the K of maj@K and pass@K")
  path = pathlib.Path(FLAGS.init_checkpoint)
  params, config = models.load_hf(path, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype)
  task = grpo_math.Task(models.load_tokenizer(path), sft_lineage=False)
  work_dir = pathlib.Path(FLAGS.work_dir)
  work_dir.mkdir(parents=True, exist_ok=True)
  (work_dir / "flags.txt").write_text(FLAGS.flags_into_string())
  prompts = [task.prompt(e) for e in task.test]
  common = dict(batch_size=min(FLAGS.eval_batch_size, len(prompts)), max_prompt_len=FLAGS.max_prompt_len,
                max_new_tokens=FLAGS.max_new_tokens)
  key = jax.random.PRNGKey(FLAGS.seed + 1)
  texts, lengths = evaluation.generate(params, config, task.tokenizer, prompts, key, greedy=True, **common)
  greedy = evaluation.summarize(texts, task.test, ks=(1,), is_formatted=task.is_formatted)
  k = FLAGS.eval_samples
  print(f"sampling {k} completions for each of {len(prompts)} held-out problems from {path} "
        f"(T = {FLAGS.eval_temperature})", file=sys.stderr)
  texts, _ = evaluation.generate(params, config, task.tokenizer, prompts, jax.random.fold_in(key, 1),
                                 num_samples=k, temperature=FLAGS.eval_temperature, **common)
  ks = ks_up_to(k)
  sampled = evaluation.summarize(texts, task.test, ks=ks, is_formatted=task.is_formatted)
  summary = {"policy": str(path), "accuracy": greedy["pass@1"], "format_rate": greedy["format_rate"],
             "mean_length": float(np.mean(lengths)), "num_eval_problems": len(task.test), "eval_samples": k,
             "eval_temperature": FLAGS.eval_temperature, "ks": ks,
             **{name: v for name, v in sampled.items() if "@" in name},
             "wall_time_s": time.time() - t_start}
  (work_dir / "summary.json").write_text(json.dumps(summary, indent=2))
  rows = [("held-out problems", f"{len(task.test)}"), ("greedy accuracy", f"{100 * summary['accuracy']:.1f}%")]
  rows += [(f"maj@{j} / pass@{j}", f"{100 * summary[f'maj@{j}']:.1f}% / {100 * summary[f'pass@{j}']:.1f}%")
           for j in ks]
  grpo_math.print_table(f"sampled evaluation of {path}", rows)
  return summary


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  try:
    run()
  except (grpo_math.RunError, models.CheckpointError, data.DatasetError, ValueError, OSError) as err:
    sys.exit(f"sample_eval: error: {err}")


if __name__ == "__main__":
  app.run(main)
