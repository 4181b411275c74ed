"""SFT as a paradigm baseline (DeepSeekMath Table 10): human-written solutions, GC = 1 on every token.

The data source is the task's reference solutions of the RL prompt pool (problems the stage-1
warm start did not see), so the comparison with the RL methods is at equal prompts.
"""

import jax.numpy as jnp
import numpy as np

from experiments.methods import rft
from grpo_jax import training

class SFT(rft._Paradigm):
  name = "sft"
  samples_each_step = False  # the task's worked solutions, not samples

  def abstract_batch(self, rows):
    return super().abstract_batch(rows)._replace(sampler_logp=None)  # `training.supervised_batch`: no sampler

  def step_programs(self, shapes):
    """None: the batch is the task's tokenized solutions, laid out on the host (`training.supervised_batch`)."""
    del shapes
    return {}

  def prepare(self, start_policy, key):
    del start_policy, key
    if not any(e.solution for e in self.task.rl_pool[:100]):
      raise ValueError("--algo=sft needs reference solutions, and the training set has none")
    return {}

  def collect(self, params, position: int, key):
    del params, key
    tok = self.task.tokenizer
    n = self.rows_per_step()
    examples, scanned = [], 0
    while len(examples) < n:  # skip problems without a worked solution
      e = self.task.train_example(position + scanned)
      scanned += 1
      if e.solution:
        examples.append(e)
    prompts = [tok.encode(self.task.prompt(e), add_special_tokens=False) for e in examples]
    targets = [tok.encode(e.solution, add_special_tokens=False) + [tok.eos_token_id] for e in examples]
    batch = training.supervised_batch(prompts, targets, self.config.task.max_prompt_len,
                                      self.config.rollout.max_new_tokens, tok.pad_token_id or 0)
    batch = batch._replace(advantages=batch.loss_mask.astype(jnp.float32))  # GC = 1
    lengths = np.asarray(batch.loss_mask).sum(-1)
    return batch, {"response_length": float(lengths.mean()), "prompts_per_step": float(n),
                   "positive_rows": float(n)}, position + scanned


