"""DPO as a paradigm baseline (DeepSeekMath §5.2.1, Table 10; arXiv 2305.18290): (correct, wrong)
pairs from the SFT policy's samples of the same prompt, the frozen reference is the SFT policy."""

import jax
import jax.numpy as jnp
import numpy as np

from experiments.methods import base
from experiments.methods import offline
from experiments.methods import program as program_lib
from experiments.methods import rollouts as rollouts_lib
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import training
from grpo_jax.training import objectives
from grpo_jax.training import update as update_lib

def make_pairs(correct: np.ndarray, prompt_of_row: np.ndarray, max_pairs: int) -> np.ndarray:
  """`[K, 2]` row indices (chosen, rejected): up to `max_pairs` per prompt, a correct and a wrong
  sample of the same prompt each, no row used twice, in row order."""
  pairs = []
  for prompt in np.unique(prompt_of_row):
    rows = np.flatnonzero(prompt_of_row == prompt)
    good, bad = rows[correct[rows] > 0], rows[correct[rows] <= 0]
    pairs.extend(zip(good[:max_pairs], bad[:max_pairs]))
  return np.asarray(pairs, np.int64).reshape(-1, 2)


class DPO(base.Method):
  name = "dpo"
  rows_per_item = 2
  samples_each_step, samples_offline = False, True  # the pairs come from the start policy, sampled once

  def __init__(self, config, model_config, task, rollouts, reference):
    super().__init__(config, model_config, task, rollouts, reference)
    # π_ref of each step's pairs
    self.ref = rollouts.placement.logprobs(model_config, chunk_size=config.model.logprob_chunk)

  def scoring_forwards(self) -> tuple[str, ...]:
    return ("π_ref",)

  def scoring_logprobs(self):
    return self.ref

  def step_programs(self, shapes):
    """π_ref's forward over the step's pairs (`Method.step_programs`), then the step's batch (`step_batch`)."""
    n, width = self.scoring_shape()
    p = self.config.task.max_prompt_len
    return super().step_programs(shapes) | {"batch": program_lib.Program(
        step_batch, (program_lib.samples(shapes, n, p, width - p), shapes.rows(jnp.float32, n, width)),
        f"the training batch of the {n} rows (chosen, rejected, ...)", per_step=1, resident_args=())}

  def objective(self):
    return update_lib.bind(objectives.dpo_objective, config=self.model_config, beta=self.config.algorithm.dpo_beta,
                           nll_coef=self.config.algorithm.dpo_nll_coef, chunk_size=self.config.model.logprob_chunk)

  def prepare(self, start_policy, key):
    scored, prompt_of_row, stats = offline.sample_offline(self.rollouts, start_policy, self.task, key)
    self.pairs = make_pairs(scored.correct, prompt_of_row, self.config.algorithm.dpo_pairs_per_prompt)
    if not len(self.pairs):
      raise ValueError("DPO: no prompt has both a correct and a wrong sample from the start policy")
    self.data = scored.samples
    stats["dpo_pairs"] = float(len(self.pairs))
    return stats

  def collect(self, params, position: int, key):
    del params, key
    n = self.rows_per_step() // 2
    picks = [offline.epoch_order(len(self.pairs), position + i, self.config.run.seed) for i in range(n)]
    rows = self.pairs[np.asarray(picks)].reshape(-1)  # interleaved: chosen, rejected, chosen, ...
    samples = rollouts_lib.take_rows(self.data, rows)
    tokens, attention = logprobs_lib.sequences_from_samples(samples)
    ref_logp = self.ref(self.reference, tokens, attention)
    batch = step_batch(samples, ref_logp)
    return batch, {"response_length": float(np.mean(samples.lengths))}, position + n


@jax.jit
def step_batch(samples, ref_logp) -> training.Batch:
  """A DPO step's `Batch` of pairs, as one program: every completion token in the loss, π_ref's log-probs
  `[N, P + T]` on them (0 elsewhere), no advantages."""
  zeros = jnp.zeros(samples.tokens.shape, jnp.float32)
  batch = training.batch_from_samples(samples, jnp.asarray(samples.mask), zeros, zeros, zeros[:, 0])
  return batch._replace(ref_logp=jnp.where(batch.loss_mask, ref_logp, 0.0))
