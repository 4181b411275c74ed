"""On-policy distillation: the student (the policy) samples, a frozen teacher scores the same tokens, and the
per-token reverse KL to the teacher is the signal (`losses.distill_loss`; GKD's on-policy setting, Thinking
Machines' "On-Policy Distillation"). No reward enters the loss: the rule reward is only reported.

The teacher is an HF checkpoint (`--teacher_checkpoint`) with the policy's tokenizer, held on the device(s) beside
the policy as π_ref is (placed by the same rules, never trained); its forward over a step's rows is one more
scoring forward, grouped by prompt like π_ref's. Teacher and student log-probs are both at the rollout
temperature, so the student is drawn to the teacher's logits up to a constant, whatever the temperature.
"""

import functools
import time

import jax
import jax.numpy as jnp

from experiments.methods import grpo
from experiments.methods import program as program_lib
from experiments.methods import rollouts as rollouts_lib
from experiments.runner import config as config_lib
from experiments.runner import policy as policy_lib
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import models
from grpo_jax import sampling
from grpo_jax import training
from grpo_jax.training import update as update_lib


class Distill(grpo.GRPO):
  """GRPO's rollouts, prompt sharing and on-policy shortcut; the teacher's log-probs in the batch's `ref_logp`."""

  name = "distill"

  def __init__(self, config, model_config, task, rollouts, reference):
    del reference  # no π_ref: the teacher takes its place
    super().__init__(config, model_config, task, rollouts, None)
    path = config.algorithm.teacher_checkpoint
    # the policy's runtime options and attention implementation; the weights: `teacher`
    self.teacher_config = models.read_config(path, **policy_lib.runtime(config.model)).replace(
        attention=model_config.attention)
    if self.teacher_config.vocab_size != model_config.vocab_size:
      raise config_lib.RunError(f"--teacher_checkpoint={path}: vocabulary of {self.teacher_config.vocab_size} "
                                f"tokens, the policy's has {model_config.vocab_size}; a teacher must share the "
                                f"policy's tokenizer")
    self._teacher = None
    self.teacher_logprobs = rollouts.placement.logprobs(self.teacher_config, chunk_size=config.model.logprob_chunk,
                                                        temperature=config.rollout.temperature, **self.forward_layout())

  @property
  def teacher(self):
    """The teacher's params, on the device(s) by the placement's rules; loaded at the first step's scoring."""
    if self._teacher is None:
      self._teacher, _ = self.rollouts.placement.load_hf(self.config.algorithm.teacher_checkpoint,
                                                         **policy_lib.runtime(self.config.model))
    return self._teacher

  def use_reference(self, reference) -> None:
    """Not kept: distillation has no π_ref (the teacher takes its place), so the trainer's copy is freed."""
    del reference

  def reads_old_logprobs(self) -> bool:
    return not self.on_policy()

  def scoring_forwards(self) -> tuple[str, ...]:
    """π_old where the update is not on-policy and the sampler's log-probs are not it; no π_ref (the teacher's
    forward, `teacher_logprobs`, takes its place)."""
    return ("π_old",) if self.reads_old_logprobs() and self.rollouts.old_forward() else ()

  def step_programs(self, shapes):
    """π_old where `scoring_forwards` names it, then the teacher's forward over the same rows, grouped like it, then
    the step's batch."""
    out = super().step_programs(shapes)
    batch = out.pop("batch")  # after the teacher's forward, as `collect` runs them
    n, width = self.scoring_shape()
    teacher, group = shapes.frozen_model(self.teacher_config), self.forward_layout().get("group_size", 1)
    chunk = self.rollouts.placement.forward_chunk(self.teacher_config, n, width, group=group, cached=group > 1,
                                                  logits_chunk=self.config.model.logprob_chunk)
    out["teacher_logprobs"] = program_lib.Program(
        self.teacher_logprobs.program((n, width), teacher),
        (teacher, shapes.rows(jnp.int32, n, width), shapes.rows(jnp.bool_, n, width)),
        f"the teacher's forward of the {n} rows, {chunk or n} at a time"
        + (f", each prompt once per group of {group}" if group > 1 else ""), per_step=1)
    out["batch"] = batch
    return out

  def _step_batch(self):
    return jax.jit(functools.partial(step_batch, mask_truncated=self.config.rollout.mask_truncated))

  def _batch_program(self, shapes) -> program_lib.Program:
    n, p, t = self.rows_per_step(), self.config.task.max_prompt_len, self.config.rollout.max_new_tokens
    logp = shapes.rows(jnp.float32, n, t)
    return program_lib.Program(self.step_batch, (program_lib.samples(shapes, n, p, t),
                                                 logp if self.reads_old_logprobs() else None, logp),
                               f"the training batch of the {n} rows (loss mask, the teacher's log-probs)",
                               per_step=1, resident_args=())

  def objective(self):
    algo = self.config.algorithm
    loss_kwargs = dict(epsilon=algo.epsilon, epsilon_high=algo.epsilon_high, aggregation=algo.loss_aggregation,
                       max_len=self.config.rollout.max_new_tokens)
    grouped = dict(group_size=self.config.rollout.group_size, prompt_len=self.config.task.max_prompt_len
                   ) if self.grouped() else {}
    return update_lib.bind(training.distill_objective, config=self.model_config, loss_kwargs=loss_kwargs,
                           chunk_size=self.config.model.logprob_chunk, temperature=self.config.rollout.temperature,
                           on_policy=self.on_policy(), **grouped)

  def collect(self, params, position: int, key):
    rollout = self.config.rollout
    b, g = rollout.batch_size, rollout.group_size
    t0 = time.time()
    examples = [self.task.train_example(position + i) for i in range(b)]
    scored = self.rollouts.sample(params, examples, key, g)
    samples = self.rollouts.trim(scored.samples, scored.host.lengths)
    sample_time = time.time() - t0 - scored.score_time

    # SCORE: the teacher's log-probs of the student's tokens (and π_old when the update is not on-policy)
    t1 = time.time()
    old_logp = (self.rollouts.old_logprobs(params, samples, self.group_logprobs) if self.reads_old_logprobs()
                else None)  # None: not read (the objective uses sg(π_θ))
    sequences = logprobs_lib.sequences_from_samples(samples)
    teacher_logp = self.rollouts.completion(self.teacher_logprobs(self.teacher, *sequences), samples)
    batch = self.step_batch(samples, old_logp, teacher_logp)  # not awaited (as GRPO's)
    stats = self.rollouts.stats(rollouts_lib.Scored(samples, scored.rewards, scored.correct, scored.score_time,
                                                    scored.host), g)
    stats.update(completion_width=float(samples.tokens.shape[1]), time_sampling=sample_time,
                 time_scoring=scored.score_time + time.time() - t1)
    return batch, stats, position + b

  def summary_rows(self, start: dict, final: dict) -> list[tuple[str, str]]:
    return [(f"format rate, after {self.name}", f"{100 * final['format_rate']:.1f}%"),
            ("teacher", self.config.algorithm.teacher_checkpoint)]


def step_batch(samples: sampling.SampleOutput, old_logp, teacher_logp, *, mask_truncated: bool) -> training.Batch:
  """A distillation step's training batch, as one program: the sampler's mask (less the truncated completions with
  `mask_truncated`), π_old (None: not read, zeros), the teacher's log-probs in `ref_logp`, no advantages."""
  loss_mask = jnp.asarray(samples.mask)
  if mask_truncated:
    loss_mask &= ~jnp.asarray(samples.truncated)[:, None]
  zeros = jnp.zeros(samples.tokens.shape, jnp.float32)
  return training.batch_from_samples(samples, loss_mask, zeros if old_logp is None else old_logp, teacher_logp,
                                     zeros[:, 0])
