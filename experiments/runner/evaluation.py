"""Held-out evaluation of a single-turn policy: greedy accuracy, and maj@k / pass@k for k = 1, 2, 4, ..., K."""

import jax
import numpy as np

from experiments.runner import config as config_lib
from experiments.runner import placement as placement_lib
from experiments.runner import task as task_lib
from grpo_jax import evaluation


def ks_up_to(k: int) -> list[int]:
  """1, 2, 4, ... up to k, and k itself."""
  return sorted({1, k} | {2 ** i for i in range(k.bit_length()) if 2 ** i <= k})


def generate_options(config: config_lib.Config, num_prompts: int, placement: placement_lib.Placement) -> dict:
  """`evaluation.generate`'s shape and placement keywords for `num_prompts` held-out prompts (its sampler's prompt
  batch is `batch_size` x `max_prompt_len`)."""
  engine = config.rollout.sampler == "engine"
  common = dict(batch_size=min(config.eval.eval_batch_size, num_prompts), max_prompt_len=config.task.max_prompt_len,
                max_new_tokens=config.rollout.max_new_tokens, engine=engine)
  return common | placement.sample_kwargs(common["batch_size"], any_count=engine)


def evaluate(params, model_config, task: task_lib.Task, config: config_lib.Config, key,
             placement: placement_lib.Placement) -> dict:
  """Greedy pass@1 ("accuracy"), format rate and mean length on the held-out set; with `eval_samples` = K > 0
  also maj@k and the unbiased pass@k (DeepSeekMath Fig 7) for every power of two k <= K and K, from one set of
  K samples per problem at `eval_temperature`."""
  prompts = [task.prompt(e) for e in task.test]
  common = generate_options(config, len(prompts), placement)
  # The prompts of a batch that fit the placement's budget at a time, with their `samples` completions each.
  shapes = lambda samples: (model_config, common["batch_size"], config.task.max_prompt_len, samples,
                            config.rollout.max_new_tokens)
  if common["engine"]:
    chunk = lambda samples: dict(num_slots=placement.engine_slots(*shapes(samples), config.rollout.num_slots))
  else:
    chunk = lambda samples: dict(prompt_chunk=placement.sampler_chunk(*shapes(samples)))
  texts, lengths = evaluation.generate(params, model_config, task.tokenizer, prompts, key, greedy=True,
                                       **chunk(1), **common)
  greedy = evaluation.summarize(texts, task.test, ks=(1,), is_formatted=task.is_formatted)
  metrics = {"accuracy": greedy["pass@1"], "format_rate": greedy["format_rate"],
             "mean_length": float(np.mean(lengths))}
  k = config.eval.eval_samples
  if k:
    texts, _ = evaluation.generate(params, model_config, task.tokenizer, prompts, jax.random.fold_in(key, 1),
                                   num_samples=k, temperature=config.eval.eval_temperature,
                                   **chunk(k), **common)
    sampled = evaluation.summarize(texts, task.test, ks=ks_up_to(k), is_formatted=task.is_formatted)
    metrics.update({name: v for name, v in sampled.items() if "@" in name})
  return metrics
