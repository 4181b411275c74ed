"""Rejection-sampling fine-tuning, DeepSeekMath §5.2.1 and Table 10: GC(q, o, t) = 1 if o is correct, else 0.

  rft_table10  each step: B prompts x G samples of the frozen SFT policy, every row, the wrong ones at GC = 0
               (Table 10's RFT: it differs from Online RFT in the sampling policy alone)
  online_rft   each step: B prompts x G samples of the current policy, the same coefficient and mean
  rft          pooled: the SFT policy sampled once on --offline_prompts, the distinct correct completions kept
               (deduplicated, as Yuan et al. 2023's RFT), each step B·G of them, all at GC = 1
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.methods import base
from experiments.methods import offline
from experiments.methods import program as program_lib
from experiments.methods import rollouts as rollouts_lib
from grpo_jax import losses
from grpo_jax import training
from grpo_jax.training import objectives
from grpo_jax.training import update as update_lib

@jax.jit
def step_batch(samples, correct) -> training.Batch:
  """A paradigm step's `Batch`, as one program: the advantages hold the coefficient GC = I(o correct) on every
  token (DeepSeekMath §5.2.1), no π_old or π_ref."""
  mask = jnp.asarray(samples.mask)
  gc = losses.rft_coefficient(jnp.asarray(correct), mask)
  zeros = jnp.zeros(samples.tokens.shape, jnp.float32)
  return training.batch_from_samples(samples, mask, zeros, zeros, gc)


class _Paradigm(base.Method):
  def step_programs(self, shapes):
    """The step's batch (`step_batch`) over its rows at the widest completion width."""
    n, p, t = self.rows_per_step(), self.config.task.max_prompt_len, self.config.rollout.max_new_tokens
    return super().step_programs(shapes) | {"batch": program_lib.Program(
        step_batch, (program_lib.samples(shapes, n, p, t), shapes.rows(jnp.float32, n)),
        f"the training batch of the {n} rows (GC on every token)", per_step=1, resident_args=())}

  def objective(self):
    # The likelihood of --likelihood_temperature (default 1, the model's own): these methods imitate, they do not
    # reweight; at --temperature every method of a comparison trains the same likelihood.
    return update_lib.bind(objectives.paradigm_objective, config=self.model_config,
                           aggregation=self.config.algorithm.loss_aggregation,
                           chunk_size=self.config.model.logprob_chunk,
                           temperature=self.config.algorithm.likelihood_temperature)


class OnlineRFT(_Paradigm):
  """Each step samples B×G completions from the current policy and fine-tunes on the correct ones."""
  name = "online_rft"

  def collect(self, params, position: int, key):
    t0 = time.time()
    b, g = self.config.rollout.batch_size, self.config.rollout.group_size
    examples = [self.task.train_example(position + i) for i in range(b)]
    scored = self.rollouts.sample(self.sampling_params(params), examples, key, g)
    sample_time = time.time() - t0 - scored.score_time
    batch = step_batch(self.rollouts.trim(scored.samples, scored.host.lengths), scored.correct)
    stats = self.rollouts.stats(scored)
    stats.update(time_sampling=sample_time, time_scoring=scored.score_time, prompts_per_step=float(b),
                 positive_rows=float(np.sum(scored.correct > 0)))
    return batch, stats, position + b

  def sampling_params(self, params):
    """The policy the step's samples come from: the current one."""
    return params


class Table10RFT(OnlineRFT):
  """RFT as DeepSeekMath's Table 10 has it: each step samples B prompts x G completions from the frozen SFT policy
  (the start policy, kept as π_ref), GC = 1 on the correct ones and 0 on the rest, the loss averaged over all B·G
  rows, nothing deduplicated. With Online RFT it is one method with two data sources."""
  name = "rft_table10"

  def sampling_params(self, params):
    del params
    return self.reference


class RFT(_Paradigm):
  """Samples the SFT policy once (`--offline_prompts` × G), keeps the distinct correct completions,
  and fine-tunes on them; each step takes B×G of them in shuffled epochs."""
  name = "rft"
  samples_each_step, samples_offline = False, True

  def prepare(self, start_policy, key):
    scored, prompt_of_row, stats = offline.sample_offline(self.rollouts, start_policy, self.task, key)
    s = scored.samples
    seen, rows = set(), []
    for row in np.flatnonzero(scored.correct > 0):
      signature = (int(prompt_of_row[row]), s.tokens[row][s.mask[row]].tobytes())
      if signature not in seen:
        seen.add(signature)
        rows.append(row)
    if not rows:
      raise ValueError("RFT: the start policy got no sampled problem right; nothing to fine-tune on")
    self.data = rollouts_lib.take_rows(s, np.asarray(rows))
    self.prompt_of_row = np.asarray(prompt_of_row)[np.asarray(rows)]
    stats["rft_examples"] = float(len(rows))
    return stats

  def collect(self, params, position: int, key):
    del params, key
    n = self.rows_per_step()
    rows = np.asarray([offline.epoch_order(len(self.data.tokens), position + i, self.config.run.seed)
                       for i in range(n)])
    samples = rollouts_lib.take_rows(self.data, rows)
    batch = step_batch(samples, np.ones(n, np.float32))
    return batch, {"response_length": float(np.mean(samples.lengths)),
                   "prompts_per_step": float(len(set(self.prompt_of_row[rows].tolist()))),
                   "positive_rows": float(n)}, position + n
