"""GRPO (DeepSeekMath eq. 3): G samples per prompt from π_old, group-normalised outcome rewards,
the clipped surrogate with the k3 KL to the frozen reference in the loss; DAPO/Dr. GRPO/GSPO knobs, and
the critic-free advantage estimators that replace the group normalisation (`advantage_estimator`):
RLOO's leave-one-out baseline, and REINFORCE++ (KL in the per-token reward, batch-whitened returns)."""

import functools
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from experiments.methods import base
from experiments.methods import program as program_lib
from experiments.methods import rollouts as rollouts_lib
from grpo_jax import evaluation
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import losses
from grpo_jax import sampling
from grpo_jax import training
from grpo_jax.training import update as update_lib


class GRPO(base.Method):
  name = "grpo"

  def __init__(self, config, model_config, task, rollouts, reference):
    super().__init__(config, model_config, task, rollouts, reference)
    # π_ref (and a recomputed π_old) of the sampler's rows, each prompt once per group when `grouped()`
    self.group_logprobs = rollouts.placement.logprobs(model_config, chunk_size=config.model.logprob_chunk,
                                                      temperature=config.rollout.temperature, **self.forward_layout())
    self.step_batch = self._step_batch()  # the training batch of a step's rows, one program

  def grouped(self) -> bool:
    """Whether forwards share each prompt across its group (`shared_prompt_forward`, and always with length
    buckets): every micro-batch must then hold whole groups, so minibatches shuffle groups (`rows_per_item` = G)."""
    algo, g = self.config.algorithm, self.config.rollout.group_size
    if self.config.rollout.token_layout == "buckets":
      return True
    micro = (algo.minibatch_size or self.rows_per_step()) // algo.grad_accum_steps
    return algo.shared_prompt_forward and micro % g == 0

  def forward_layout(self) -> dict:
    """The π_ref / π_old / teacher forwards' layout (`Placement.logprobs` keywords): each prompt once per group
    when `grouped()`, in length buckets with `--token_layout=buckets` (`scoring_buckets`)."""
    if not self.grouped():
      return {}
    layout = dict(group_size=self.config.rollout.group_size, prompt_len=self.config.task.max_prompt_len)
    buckets = self.scoring_buckets()
    return layout if buckets is None else layout | dict(buckets=buckets)

  def bucketed_update(self) -> update_lib.BucketedRows | None:
    """The update's length-bucketed layout (`Method.bucketed_rows`); None when padded."""
    return self.bucketed_rows()

  @property
  def rows_per_item(self) -> int:
    return self.config.rollout.group_size if self.grouped() else 1

  def on_policy(self) -> bool:
    """Whether π_old is exactly the policy being updated: one epoch over one minibatch (the params that
    sampled are the params the single optimiser step differentiates), so the objective uses
    stop_gradient(π_θ) and no π_old forward runs. `recompute_old_logprobs` keeps the explicit forward."""
    algo = self.config.algorithm
    return (algo.num_epochs == 1 and algo.minibatch_size in (0, self.rows_per_step())
            and not algo.recompute_old_logprobs)

  def reads_old_logprobs(self) -> bool:
    """Whether the step's batch carries π_old: not when the update is on-policy (the objective uses
    stop_gradient(π_θ)), unless REINFORCE++'s reward reads it."""
    return not self.on_policy() or self.config.algorithm.advantage_estimator == "reinforce_pp"

  def scoring_logprobs(self):
    return self.group_logprobs  # each prompt once per group where `grouped()`, in length buckets if asked

  def scoring_forwards(self) -> tuple[str, ...]:
    """π_old where the batch reads it and the sampler's log-probs are not it (`Rollouts.old_forward`); π_ref with
    a KL term (β > 0)."""
    old = ("π_old",) if self.reads_old_logprobs() and self.rollouts.old_forward() else ()
    return old + (("π_ref",) if self.config.algorithm.beta > 0 else ())

  def step_programs(self, shapes):
    """The forwards of `scoring_forwards` (`Method.step_programs`), then the step's batch (`_batch_program`)."""
    return super().step_programs(shapes) | {"batch": self._batch_program(shapes)}

  def _batch_program(self, shapes) -> program_lib.Program:
    """`step_batch` over the B·G rows at the widest completion width, as `collect` calls it."""
    n, p, t = self.rows_per_step(), self.config.task.max_prompt_len, self.config.rollout.max_new_tokens
    logp = shapes.rows(jnp.float32, n, t)
    process = None
    if self.config.reward_model.supervision == "process":  # the PRM's step rewards, step ends and step mask
      k = self.config.reward_model.prm_max_steps
      process = (shapes.rows(jnp.float32, n, k), shapes.rows(jnp.int32, n, k), shapes.rows(jnp.bool_, n, k))
    args = (program_lib.samples(shapes, n, p, t), shapes.rows(jnp.float32, n), shapes.scalar(jnp.int32),
            logp if self.reads_old_logprobs() else None, logp if "π_ref" in self.scoring_forwards() else None,
            process)
    return program_lib.Program(self.step_batch, args, f"the training batch of the {n} rows (loss mask, "
                               f"advantages)", per_step=1, resident_args=())

  def objective(self):
    algo = self.config.algorithm
    kl_in_loss = algo.advantage_estimator != "reinforce_pp"  # REINFORCE++ puts the KL in the reward
    loss_kwargs = dict(epsilon=algo.epsilon, epsilon_high=algo.epsilon_high,
                       beta=algo.beta if kl_in_loss else 0.0, kl=algo.kl or "k3",
                       aggregation=algo.loss_aggregation, importance=algo.importance,
                       dual_clip=algo.dual_clip, max_len=self.config.rollout.max_new_tokens)
    loss_kwargs.update(policy_loss=algo.loss, sapo_tau_pos=algo.sapo_tau_pos, sapo_tau_neg=algo.sapo_tau_neg,
                       entropy_coef=algo.entropy_coef, top_entropy_quantile=algo.top_entropy_quantile)
    # The policy trained is the sampling distribution π ∝ exp(logits / T): old, reference and new log-probs
    # all use T.
    grouped = dict(group_size=self.config.rollout.group_size, prompt_len=self.config.task.max_prompt_len
                   ) if self.grouped() else {}
    return update_lib.bind(training.grpo_objective, config=self.model_config, loss_kwargs=loss_kwargs,
                           use_reference=algo.beta > 0 and kl_in_loss, chunk_size=self.config.model.logprob_chunk,
                           temperature=self.config.rollout.temperature, on_policy=self.on_policy(),
                           correction_kwargs=base.correction_kwargs(algo), **grouped)

  def collect(self, params, position: int, key):
    """SAMPLE B prompts' groups (`_draw`: with DAPO's dynamic sampling, rounds until B groups vary), then SCORE:
    π_old and π_ref where `scoring_forwards` names them, then the training batch with its advantages in one
    program (`step_batch`)."""
    rollout, g = self.config.rollout, self.config.rollout.group_size
    t0 = time.time()
    drawn = self._draw(params, position, key)
    scored = drawn.scored
    samples, rewards = scored.samples, scored.rewards
    sample_time = time.time() - t0 - scored.score_time

    # SCORE: π_old and π_ref where `scoring_forwards` names them, then the training batch in one program
    t1 = time.time()
    old_logp = (self.rollouts.old_logprobs(params, samples, self.group_logprobs) if self.reads_old_logprobs()
                else None)  # None: not read (the objective uses sg(π_θ))
    ref_logp = None
    if "π_ref" in self.scoring_forwards():
      sequences = logprobs_lib.sequences_from_samples(samples)
      ref_logp = self.rollouts.completion(self.group_logprobs(self.reference, *sequences), samples)
    batch, positive_rows = self.step_batch(samples, rewards, np.int32(drawn.trained_groups * g), old_logp, ref_logp,
                                           self._process_steps(drawn))  # not awaited: the update's metrics are
    # the step's sync, and `time_update` counts the device time of the forwards left by then
    stats = self.rollouts.stats(scored, g)
    b = rollout.batch_size
    stats.update(zero_variance_groups=float(np.mean(np.ptp(rewards.reshape(b, g), axis=1) == 0)),
                 sampling_rounds=float(drawn.rounds), completion_width=float(samples.tokens.shape[1]),
                 prompts_per_step=float(drawn.trained_groups),  # and the rows with a positive advantage on some token
                 positive_rows=positive_rows,  # a device scalar: the trainer reads it with the update's metrics
                 time_sampling=sample_time,
                 time_scoring=scored.score_time + time.time() - t1)
    return batch, stats, drawn.position

  def _draw(self, params, position: int, key) -> "Drawn":
    """B groups of G samples from the next prompts. With DAPO's dynamic sampling, rounds of B prompts until B groups
    have rewards that vary; a short batch is filled with zero-variance groups, left out of the loss (the first
    `trained_groups` train), so shapes stay fixed."""
    rollout = self.config.rollout
    b, g = rollout.batch_size, rollout.group_size
    rounds, round_examples, kept, spare = [], [], [], []
    score_time = 0.0
    for r in range(rollout.dynamic_sampling_max_rounds if rollout.dynamic_sampling else 1):
      examples = [self.task.train_example(position + i) for i in range(b)]
      scored = self.rollouts.sample(params, examples, jax.random.fold_in(key, r), g)
      position += b
      score_time += scored.score_time
      rounds.append(scored)
      round_examples.append(examples)
      varied = np.ptp(scored.rewards.reshape(b, g), axis=1) > 0
      for i in range(b):
        (kept if varied[i] or not rollout.dynamic_sampling else spare).append((r, i))
      if len(kept) >= b:
        break
    chosen = kept[:b]
    rows = [(r, i * g + j) for r, i in chosen + spare[:b - len(chosen)] for j in range(g)]
    flat_rows = np.asarray([r * b * g + row for r, row in rows])
    if len(rounds) == 1 and np.array_equal(flat_rows, np.arange(b * g)):
      samples, host = rounds[0].samples, rounds[0].host
    else:  # rows of several rounds, gathered where they are
      samples, host = (sampling.SampleOutput(*[
          rows_of(field, flat_rows) for field in zip(*[getattr(s, name) for s in rounds])])
          for name in ("samples", "host"))
    samples = self.rollouts.trim(samples, host.lengths)  # the columns up to the longest completion
    rewards = np.concatenate([s.rewards for s in rounds])[flat_rows]
    correct = np.concatenate([s.correct for s in rounds])[flat_rows]
    return Drawn(rollouts_lib.Scored(samples, rewards, correct, score_time, host),
                 [round_examples[r][row // g] for r, row in rows], len(chosen), len(rounds), position)

  def _process_steps(self, drawn: "Drawn"):
    """GRPO+PS's PRM step rewards, step ends and step mask of the drawn rows ([B·G, K] each, host-side scoring of
    the decoded steps), or None with outcome supervision."""
    if self.config.reward_model.supervision != "process":
      return None
    host = drawn.scored.host
    step_rewards, ends, step_mask = self.rollouts.reward_model.steps(
        host, evaluation.decode(self.task.tokenizer, host), drawn.examples)
    return step_rewards, np.asarray(ends), np.asarray(step_mask)

  def _step_batch(self):
    """`step_batch` with this run's settings, jitted: one program a step (and one more per new width)."""
    config, algo = self.config, self.config.algorithm
    return jax.jit(functools.partial(
        step_batch, group_size=config.rollout.group_size, mask_truncated=config.rollout.mask_truncated,
        estimator=algo.advantage_estimator, scale=algo.advantage_scale, eps=algo.advantage_eps, beta=algo.beta,
        kl=algo.kl or "k1", center_tokens=config.reward_model.process_center_tokens))


def step_batch(samples: sampling.SampleOutput, rewards, trained_rows, old_logp, ref_logp, process_steps=None, *,
               group_size: int, mask_truncated: bool, estimator: str, scale: str, eps: float, beta: float, kl: str,
               center_tokens: bool):
  """A GRPO step's training batch from the sampler's rows, as one program: `(training.Batch, positive rows)`.

  The loss mask is the sampler's, less the rows past `trained_rows` (a short dynamic-sampling batch's filler groups)
  and, with `mask_truncated`, the truncated completions. Â [N] (broadcast over tokens) or [N, T] is the estimator's:
  GRPO+PS's process advantages from `process_steps` (PRM step rewards normalised over the group's steps), RLOO's,
  REINFORCE++'s (the `kl` estimate, scaled by β, in the per-token reward, batch-whitened returns), or the
  group-normalised outcome rewards (DeepSeekMath eq. 3, `scale`). `old_logp` / `ref_logp` None: not read (zeros).
  The positive rows are those with Â > 0 on some token.
  """
  n, t = samples.tokens.shape
  g, b = group_size, samples.tokens.shape[0] // group_size
  loss_mask = jnp.asarray(samples.mask) & (jnp.arange(n) < trained_rows)[:, None]
  if mask_truncated:
    loss_mask &= ~jnp.asarray(samples.truncated)[:, None]
  zeros = jnp.zeros((n, t), jnp.float32)
  old_logp = zeros if old_logp is None else old_logp
  ref_logp = zeros if ref_logp is None else ref_logp
  rewards = jnp.asarray(rewards)
  if process_steps is not None:
    step_rewards, ends, step_mask = process_steps
    k = step_rewards.shape[1]
    advantages = losses.process_advantages(
        step_rewards.reshape(b, g, k), ends.reshape(b, g, k), step_mask.reshape(b, g, k),
        jnp.asarray(samples.mask).reshape(b, g, t), scale="none" if scale == "none" else "group",
        center_tokens=center_tokens, eps=eps).reshape(n, t)
  elif estimator == "rloo":
    advantages = losses.rloo_advantages(rewards.reshape(b, g)).reshape(-1)
  elif estimator == "reinforce_pp":
    token_rewards = losses.kl_penalized_rewards(rewards, old_logp, ref_logp, loss_mask, beta, kl=kl)
    advantages = losses.reinforce_pp_advantages(token_rewards, loss_mask)
  else:
    advantages = losses.group_advantages(rewards.reshape(b, g), scale=scale, eps=eps).reshape(-1)
  positive_rows = jnp.sum(jnp.any(advantages.reshape(n, -1) > 0, axis=1))
  return training.batch_from_samples(samples, loss_mask, old_logp, ref_logp, advantages), positive_rows


class Drawn(NamedTuple):
  """A step's sampled groups (`GRPO._draw`): their `Scored` rows, each row's example, how many groups train (the
  rest fill a short dynamic-sampling batch), the sampling rounds run, and the data position after them."""
  scored: rollouts_lib.Scored
  examples: list
  trained_groups: int
  rounds: int
  position: int


def rows_of(parts, rows: np.ndarray):
  """Rows of the concatenation of `parts` (one array per sampling round): NumPy for host arrays, a device
  gather for device arrays."""
  if all(isinstance(p, np.ndarray) for p in parts):
    return np.concatenate(parts)[rows]
  return jnp.concatenate([jnp.asarray(p) for p in parts])[rows]
