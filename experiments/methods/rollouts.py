"""Sampling and scoring shared by the online methods: B prompts, G completions each, rewards."""

import time
from typing import NamedTuple

import jax
import numpy as np

from grpo_jax import evaluation
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import losses
from grpo_jax import partitioning
from grpo_jax import reward_models
from grpo_jax import rewards as rewards_lib
from grpo_jax import rollout_engine
from grpo_jax import sampling
from grpo_jax import training
from experiments.methods import program as program_lib
from experiments.runner import config as config_lib
from experiments.runner import placement as placement_lib


class Scored(NamedTuple):
  """One round of rollouts: rows are prompt-major (row i·G + j is sample j of prompt i).

  `samples` is the sampler's output where it ran (device arrays, split over the mesh's data axes), `host` the
  same as whole NumPy arrays on every process: the one host crossing of a step, for decoding text and rule
  rewards. Training batches are built from `samples`, never from `host`.
  """
  samples: sampling.SampleOutput
  rewards: np.ndarray  # [B·G] float32, the training reward (with overlong shaping when on)
  correct: np.ndarray  # [B·G] float32, 1 where the final answer is right
  score_time: float
  host: sampling.SampleOutput


def take_rows(samples: sampling.SampleOutput, rows) -> sampling.SampleOutput:
  """The rows `rows` of every field (host arrays stay host arrays, device arrays device arrays)."""
  return sampling.SampleOutput(*[x[np.asarray(rows)] for x in samples])


def completion_width(lengths: np.ndarray, max_width: int, multiple: int, doubling: bool = False) -> int:
  """The completion columns a step's training batch keeps: the longest of `lengths` rounded up to a multiple of
  `multiple` (`doubling`: to the smallest multiple·2^k, k >= 0, that holds it), at most `max_width` (all of them
  when `multiple` is 0).

  Each width compiles the scoring and update programs once. Multiples give up to max_width / multiple widths over
  a run; doublings at most log2(max_width / multiple) + 2, for at most twice the columns the longest needs.

  Past every row's end there is only padding (mask False), which the losses, log-probs and advantages ignore, so
  the step's values are those of the full width up to float rounding (sums over fewer padded slots group
  differently), and its forwards and backward do less work: the embedded default's longest completion is 31-35 of
  40 tokens. `lengths` is the sampler's host copy, the same on every process, so every process picks the same width.
  """
  if not multiple:
    return max_width
  longest = max(int(np.max(lengths, initial=0)), 1)
  if doubling:
    width = multiple
    while width < longest:
      width *= 2
    return min(max_width, width)
  return min(max_width, -(-longest // multiple) * multiple)


def trim_completions(samples: sampling.SampleOutput, width: int) -> sampling.SampleOutput:
  """The first `width` completion columns of `samples` (tokens, log-probs, mask); prompts, lengths as they are."""
  if width == samples.tokens.shape[1]:
    return samples
  return samples._replace(tokens=samples.tokens[:, :width], logprobs=samples.logprobs[:, :width],
                          mask=samples.mask[:, :width])


class Rollouts:
  """Samples completions of the task's prompts from a policy and scores them with the task's reward."""

  def __init__(self, config: config_lib.Config, model_config, task, reward_model=None,
               placement: placement_lib.Placement | None = None):
    self.config, self.model_config, self.task = config, model_config, task
    # A `learned_reward.LearnedReward` or `ExactStepReward`, or None for the task's rule reward.
    self.reward_model = reward_model
    self.placement = placement or placement_lib.Placement()
    self.prompts_truncated = 0  # prompts cut from the left to --max_prompt_len, since the start
    # Log-probs of the sampling distribution π ∝ exp(logits / T), on the device(s); params are arguments, never
    # compile-time constants.
    self.logprobs = self.placement.logprobs(model_config, chunk_size=config.model.logprob_chunk,
                                            temperature=config.rollout.temperature)

  def sample(self, params, examples, key, num_samples: int) -> Scored:
    task, tok, rollout = self.task, self.task.tokenizer, self.config.rollout
    tokens, mask, cut = training.encode_prompts(tok, [task.prompt(e) for e in examples],
                                                self.config.task.max_prompt_len)
    self.prompts_truncated += cut
    samples = self.generate(params, tokens, mask, key, num_samples)
    samples, host = self.placement.sampled(samples)  # every process scores every sample (host code is cheap)
    t0 = time.time()
    texts = evaluation.decode(tok, host)
    repeated = [e for e in examples for _ in range(num_samples)]
    correct = np.asarray(rewards_lib.score(texts, repeated, "correctness"), np.float32)
    if self.reward_model is not None:
      rewards = self.reward_model.outcome(host, texts, repeated)
    else:
      rewards = np.asarray(rewards_lib.score(texts, repeated, task.reward_fn), np.float32)
    if rollout.overlong_buffer:
      rewards = rewards + np.asarray(losses.overlong_penalty(host.lengths, rollout.max_new_tokens,
                                                            rollout.overlong_buffer))
    return Scored(samples, rewards, correct, time.time() - t0, host)

  def generate(self, params, tokens, mask, key, num_samples: int) -> sampling.SampleOutput:
    """`num_samples` completions of each prompt (host arrays [B, P]) with the run's sampler (`--sampler`)."""
    engine = self.config.rollout.sampler == "engine"
    kwargs = self.sampler_options(len(tokens), num_samples) | self.placement.sample_kwargs(len(tokens),
                                                                                            any_count=engine)
    if not engine or jax.process_count() > 1:  # each process provides its own rows of the prompts
      tokens, mask = self.placement.rows((tokens, mask))
    fn = rollout_engine.generate if engine else sampling.sample
    return fn(params, self.model_config, tokens, mask, key, num_samples=num_samples,
              temperature=self.config.rollout.temperature, **kwargs)

  def sampler_program(self, params):
    """The sampler's program for a step's B prompts x G samples as `generate` calls it, with abstract arguments
    placed as it places them (`methods.program.Program`; `params`: the policy's, arrays or shape structs), for
    compiling it ahead (`trainer.ahead`): the engine's (`rollout_engine.generate_program`) or the static
    sampler's (`sampling.sample_program`, or `sampling.placed_sample_program` on a mesh)."""
    rollout = self.config.rollout
    b, g, p = rollout.batch_size, rollout.group_size, self.config.task.max_prompt_len
    engine = rollout.sampler == "engine"
    placed = self.placement.sample_kwargs(b, any_count=engine)
    options = self.sampler_options()
    prompts = lambda b: (jax.ShapeDtypeStruct((b, p), np.int32), jax.ShapeDtypeStruct((b, p), np.bool_))
    scalars = (jax.ShapeDtypeStruct((2,), np.uint32), jax.ShapeDtypeStruct((), np.float32))
    if not engine:
      if not placed:
        fn, static = sampling.sample_program(self.model_config, num_samples=g, **options)
        args = program_lib.abstract((params, *prompts(b), *scalars)) + (None,)  # no per-row caps
        return program_lib.Program(fn, args, f"rollouts: {b} prompts x {g} samples", per_step=1, kwargs=static)
      fn, shardings = sampling.placed_sample_program(self.model_config, (b, p), num_samples=g, **placed, **options)
      args = program_lib.abstract((params, *prompts(b), *scalars), shardings)
      return program_lib.Program(fn, args, f"rollouts: {b} prompts x {g} samples", per_step=1)
    if placed:
      b += -b % partitioning.data_parallel_size(placed["mesh"], placed["rules"])  # `generate` pads to the shards
    fn, shardings, static = rollout_engine.generate_program(
        self.model_config, (b, p), mesh=placed.get("mesh"), rules=placed.get("rules"), num_samples=g, **options)
    shapes = (params, *prompts(b), *scalars, jax.ShapeDtypeStruct((b * g,), np.int32))
    args = program_lib.abstract(shapes, shardings)
    return program_lib.Program(fn, args, f"rollouts: {b} prompts x {g} samples", per_step=1, kwargs=static)

  def sampler_options(self, num_prompts: int | None = None, num_samples: int | None = None) -> dict:
    """The sampler's compile-time options of the rollouts (`sampling.sample` / `rollout_engine.generate` keywords
    and their `jit_*`; the temperature is a traced argument) for `num_prompts` x `num_samples` (default
    batch_size x group_size): the engine's `num_slots` (`Placement.engine_slots`), or the static sampler's
    `prompt_chunk`, the prompts that fit the placement's memory budget at a time (`Placement.sampler_chunk`). The
    sampler's log-probs are those of the policy trained, softmax(logits / temperature), as the trainer's are, so the
    two compare (`losses.mismatch_metrics`); at temperature 1 they are the values the sampler gives without it."""
    rollout = self.config.rollout
    shapes = (self.model_config, num_prompts or rollout.batch_size, self.config.task.max_prompt_len,
              num_samples or rollout.group_size, rollout.max_new_tokens)
    options = dict(max_new_tokens=rollout.max_new_tokens, top_k=rollout.top_k, top_p=rollout.top_p,
                   logprobs_at_temperature=True)
    if rollout.sampler == "engine":
      return options | dict(num_slots=self.placement.engine_slots(*shapes, num_slots=rollout.num_slots))
    return options | dict(prompt_chunk=self.placement.sampler_chunk(*shapes))

  def old_logprobs(self, params, samples: sampling.SampleOutput, logprobs=None):
    """π_old of the sampled tokens `[N, T]`: the sampler's own log-probs at T = 1, else recomputed with
    `logprobs` (default `self.logprobs`; GRPO passes its shared-prompt one). A rollout correction compares the
    sampler's log-probs with the trainer's π_old, so it recomputes π_old."""
    if not self.old_forward():
      return jax.numpy.asarray(samples.logprobs)
    return self.completion((logprobs or self.logprobs)(params, *logprobs_lib.sequences_from_samples(samples)),
                           samples)

  def old_forward(self) -> bool:
    """Whether `old_logprobs` runs a forward: unless the sampler's own log-probs are π_old's (temperature 1, no
    `--recompute_old_logprobs`, no rollout correction, which compares the two)."""
    algo = self.config.algorithm
    return not (self.config.rollout.temperature == 1.0 and not algo.recompute_old_logprobs
                and algo.rollout_correction == "none")

  def trim(self, samples: sampling.SampleOutput, lengths: np.ndarray) -> sampling.SampleOutput:
    """`samples` with the completion columns that a training batch reads (`completion_width`); all of them with
    length buckets (`--token_layout=buckets`), whose programs take one width for every length."""
    rollout = self.config.rollout
    if rollout.token_layout == "buckets":
      return samples
    return trim_completions(samples, completion_width(lengths, samples.tokens.shape[1],
                                                      rollout.completion_pad_multiple,
                                                      rollout.completion_widths == "doubling"))

  @staticmethod
  def completion(full, samples: sampling.SampleOutput):
    """The completion columns `[N, T]` of a `[N, P + T]` array."""
    return full[:, full.shape[1] - samples.tokens.shape[1]:]

  def stats(self, scored: Scored, group_size: int = 1) -> dict:
    """Batch statistics; with a learned reward and G > 1 also "reward_group_auc", the reward's AUC against
    correctness within the groups (`reward_models.group_auc`): its fall below the reward model's held-out
    value while "reward_mean" rises is reward hacking, measured."""
    s = scored.host
    stats = {"reward_mean": float(scored.rewards.mean()), "reward_std": float(scored.rewards.std()),
             "accuracy": float(scored.correct.mean()), "response_length": float(s.lengths.mean()),
             "truncated_frac": float(s.truncated.mean()), "prompts_truncated": float(self.prompts_truncated),
             "generated_tokens": float(s.lengths.sum())}
    if self.reward_model is not None and group_size > 1:
      groups = np.arange(len(scored.rewards)) // group_size
      stats["reward_group_auc"], _ = reward_models.group_auc(scored.rewards, scored.correct, groups)
    return stats
