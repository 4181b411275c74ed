"""Reward-model training data from a policy: sample completions, label them, build `RewardData`."""

from collections.abc import Sequence

import jax
import numpy as np

from grpo_jax import sampling
from grpo_jax.data.example import Example
from grpo_jax.evaluation.generate import decode
from grpo_jax.models.config import ModelConfig
from grpo_jax.reward_models import data as data_lib
from grpo_jax.reward_models import model
from grpo_jax.reward_models import monte_carlo
from grpo_jax.training import batch as batch_lib

STEP_LABELS = ("exact", "mc_hard", "mc_soft")


def label_samples(samples: sampling.SampleOutput, texts: Sequence[str], examples: Sequence[Example], tokenizer, *,
                  kind: str, step_labels: str = "exact", max_steps: int = 8, policy=None, config=None,
                  mc_rollouts: int = 4, mc_max_new_tokens: int = 40, mc_batch_size: int = 64,
                  temperature: float = 1.0, key: jax.Array | None = None) -> data_lib.RewardData:
  """Labels sampled completions (e.g. a GRPO step's rollouts) as reward-model rows.

  Args:
    samples, texts, examples: as `build_reward_data`.
    tokenizer: the policy's tokenizer.
    kind: "orm", "orm_steps" (outcome labels) or "prm".
    step_labels: PRM labels: "exact" (`check_steps`, synthetic task) or Math-Shepherd Monte
      Carlo "mc_hard" / "mc_soft" (needs `policy`, `config`, `key`).
    max_steps: K of a PRM or "orm_steps".
    policy, config: the policy that continues each prefix for Monte Carlo labels.
    mc_rollouts: k continuations per prefix.
    mc_max_new_tokens: continuation budget.
    mc_batch_size: prefixes per sampler call.
    temperature: Monte Carlo sampling temperature.
    key: PRNG key of the rollouts.
  """
  if kind in model.OUTCOME_KINDS:
    return data_lib.build_reward_data(samples, texts, examples, tokenizer, kind=kind, max_steps=max_steps)
  if step_labels == "exact":
    rows = data_lib.exact_step_labels(texts, examples)
  elif step_labels in ("mc_hard", "mc_soft"):
    if policy is None or config is None or key is None:
      raise ValueError("Monte Carlo step labels need the policy params, its config and a key")
    samples = jax.tree.map(np.asarray, samples)
    rollout = monte_carlo.policy_rollout(
        policy, config, tokenizer, num_rollouts=mc_rollouts,
        max_prefix_len=samples.prompt_tokens.shape[1] + samples.tokens.shape[1],
        max_new_tokens=mc_max_new_tokens, batch_size=mc_batch_size, temperature=temperature)
    rows = data_lib.monte_carlo_step_labels(samples, texts, examples, tokenizer, rollout=rollout, key=key,
                                            soft=step_labels == "mc_soft")
  else:
    raise ValueError(f"unknown step labels {step_labels!r}; expected one of {STEP_LABELS}")
  return data_lib.build_reward_data(samples, texts, examples, tokenizer, kind="prm", max_steps=max_steps,
                                    step_label_rows=rows)


def sample_reward_data(policy, config: ModelConfig, tokenizer, examples: Sequence[Example], prompts: Sequence[str],
                       key: jax.Array, *, kind: str, samples_per_prompt: int, max_prompt_len: int,
                       max_new_tokens: int, batch_size: int = 64, temperature: float = 1.0, top_k: int = 0,
                       top_p: float = 1.0, step_labels: str = "exact", max_steps: int = 8, mc_rollouts: int = 4,
                       mc_batch_size: int = 128) -> tuple[data_lib.RewardData, list[str]]:
  """Samples `samples_per_prompt` completions per prompt from the policy and labels them.

  Prompts go to the sampler in fixed-shape batches of `batch_size` (the last padded with copies);
  the other arguments are those of `sampling.sample` and `label_samples`.

  Returns:
    (RewardData with len(prompts) · samples_per_prompt rows, prompt-major; the completion texts).
  """
  if len(examples) != len(prompts) or not prompts:
    raise ValueError(f"sample_reward_data: {len(prompts)} prompts for {len(examples)} examples")
  g = samples_per_prompt
  parts, all_texts = [], []
  for start in range(0, len(prompts), batch_size):
    chunk = list(prompts[start:start + batch_size])
    real = len(chunk)
    chunk += [chunk[0]] * (batch_size - real)
    tokens, mask, _ = batch_lib.encode_prompts(tokenizer, chunk, max_prompt_len)
    batch_key = jax.random.fold_in(key, start)
    out = sampling.sample(policy, config, tokens, mask, batch_key, num_samples=g, max_new_tokens=max_new_tokens,
                          temperature=temperature, top_k=top_k, top_p=top_p)
    out = jax.tree.map(lambda x: np.asarray(x)[:real * g], out)
    texts = decode(tokenizer, out)
    repeated = [e for e in examples[start:start + real] for _ in range(g)]
    parts.append(label_samples(out, texts, repeated, tokenizer, kind=kind, step_labels=step_labels,
                               max_steps=max_steps, policy=policy, config=config, mc_rollouts=mc_rollouts,
                               mc_max_new_tokens=max_new_tokens, mc_batch_size=mc_batch_size,
                               temperature=temperature, key=jax.random.fold_in(batch_key, 1)))
    all_texts.extend(texts)
  return data_lib.concat(parts), all_texts
