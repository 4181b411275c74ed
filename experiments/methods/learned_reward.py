"""Learned reward models in the runner (DeepSeekMath §4.1.2-4.1.4, arXiv 2402.03300).

  --reward=orm --reward_model=DIR                       GRPO+OS: σ(ORM score) is the outcome reward (a model
                                                          saved with the loglik score adds α · its backbone's
                                                          log-likelihood of the completion, as it trained)
  --reward=prm --reward_model=DIR --supervision=process  GRPO+PS: σ(PRM score) of every step, normalised
                                                          over the group, summed over the steps ending at
                                                          or after each token (`losses.process_advantages`)
  --reward=exact_steps --supervision=process             GRPO+PS on the synthetic task's exact step labels: a
                                                          perfect PRM, the upper bound of a learned one
  --iterations=I --steps_per_iteration=M                 iterative RL (Algorithm 1): the reference becomes
                                                          the policy at each iteration start; after M steps
                                                          the reward model trains on fresh samples of the
                                                          current policy plus --replay_fraction history
The reward model is frozen within an iteration; the policy's rule correctness is still logged.
"""

import pathlib
import time

import jax
import numpy as np

from grpo_jax import evaluation
from grpo_jax import logprobs as logprobs_lib
from grpo_jax import partitioning
from grpo_jax import row_chunks
from grpo_jax import reward_models as rm
from grpo_jax import models
from grpo_jax.models import logical_axes
from grpo_jax.models import presets
from grpo_jax.reward_models import positions
from grpo_jax import training
from grpo_jax.training import replay as replay_lib
from experiments.runner import config as config_lib
from experiments.runner import placement as placement_lib
from experiments.runner import report



def _in_row_chunks(score):
  """`score(params, config, *rows)` jitted (config static), its rows `rows_per_chunk` at a time (static; 0: all
  at once; `row_chunks.map_rows`); with `placed` = (mesh, frozen rules) traced inside `logical_axes.axis_rules`, as
  the policy's forwards are (the model's sharding constraints apply, and a Pallas attention kernel runs per shard)."""
  def fn(params, config, *arrays, rows_per_chunk=0, placed=None):
    run = lambda: row_chunks.map_rows(lambda *chunk: score(params, config, *chunk), arrays, rows_per_chunk)
    if placed is None:
      return run()
    with logical_axes.axis_rules(placed[0], dict(placed[1])):
      return run()
  fn.__name__ = score.__name__
  return jax.jit(fn, static_argnums=1, static_argnames=("rows_per_chunk", "placed"))


def scorer_options(placement: placement_lib.Placement, config, rows: int, length: int) -> dict:
  """The static keywords of OUTCOME_SCORES / STEP_SCORES for [rows, length] tokens on `placement`."""
  placed = None if placement.mesh is None else (placement.mesh, partitioning.freeze_rules(placement.rules))
  return dict(rows_per_chunk=placement.forward_chunk(config, rows, length), placed=placed)


# The reward model's programs (config static): each row's outcome score; the scores at its step ends (logits).
OUTCOME_SCORES = _in_row_chunks(rm.outcome_scores)
STEP_SCORES = _in_row_chunks(rm.step_scores)


def orm_logits(params, config, tokens, attention_mask, positions_, step_mask, starts):
  """`rm.outcome_logits` of an "orm" model (the "loglik" score's α · log-likelihood included)."""
  return rm.outcome_logits(params, config, tokens, attention_mask, positions_, step_mask, starts, kind="orm")


def orm_steps_logits(params, config, tokens, attention_mask, positions_, step_mask, starts):
  """`rm.outcome_logits` of an "orm_steps" model (the "loglik" score's α · log-likelihood included)."""
  return rm.outcome_logits(params, config, tokens, attention_mask, positions_, step_mask, starts, kind="orm_steps")


# A "loglik"-score outcome model's programs: its [N] outcome logits, by kind.
OUTCOME_LOGITS = {"orm": _in_row_chunks(orm_logits), "orm_steps": _in_row_chunks(orm_steps_logits)}


def learned(config: config_lib.Config) -> bool:
  """Whether the reward is a learned reward model (`reward` orm or prm)."""
  return config.task.reward in ("orm", "prm")


def model_config(config: config_lib.Config,
                 policy_config: models.ModelConfig) -> tuple[models.ModelConfig, str] | None:
  """`(config, kind)` of the learned reward model as `LearnedReward` runs it, without reading a weight; None with a
  rule reward. The backbone's config.json (a saved reward model's ties its embeddings) in the run's dtype, with the
  policy's layer layout (--scan_layers) and attention. Ahead of time (`scripts/aot_compile.py`) a name of
  `models.presets` that is not a directory stands for its shapes, tied, of kind orm with --reward=orm, else prm."""
  if not learned(config):
    return None
  path, dtype = config.reward_model.reward_model, config.model.dtype
  runtime = dict(dtype=dtype, param_dtype=dtype, scan_layers=config.model.scan_layers,
                 attention=policy_config.attention)
  if path in presets.PRESETS and not pathlib.Path(path).is_dir():
    return (presets.config(path, tie_word_embeddings=True, **runtime),  # as `rm.save_reward_model` writes it
            "orm" if config.task.reward == "orm" else "prm")
  return rm.read_reward_model(path, **runtime)


def training_rows(config: config_lib.Config, kind: str) -> rm.RewardData | None:
  """The rows the reward model at --reward_model trained on (`rm.load_training_rows`), checked against this run's
  reward-model rows (--max_prompt_len + --max_new_tokens tokens, 1 scored position for an "orm", --prm_max_steps
  otherwise); None, with a note, where it has none. A ValueError names a mismatch."""
  path = config.reward_model.reward_model
  loaded = rm.load_training_rows(path) if pathlib.Path(path).is_dir() else None
  if loaded is None:
    report.note(f"replay: {path} holds no {rm.ROWS_FILE} (its training rows; experiments.train_reward_model saves "
                f"them beside the model): the buffer starts empty")
    return None
  rows, prompt_len = loaded
  task = config.task
  length = task.max_prompt_len + config.rollout.max_new_tokens
  k = 1 if kind == "orm" else config.reward_model.prm_max_steps
  if (prompt_len, rows.tokens.shape[1], rows.positions.shape[1]) != (task.max_prompt_len, length, k):
    raise ValueError(
        f"{pathlib.Path(path) / rm.ROWS_FILE}: rows of {prompt_len} prompt + {rows.tokens.shape[1] - prompt_len} "
        f"completion tokens and {rows.positions.shape[1]} scored positions, this run's {task.max_prompt_len} + "
        f"{config.rollout.max_new_tokens} and {k}: set --max_prompt_len, --max_new_tokens and --prm_max_steps as the "
        f"reward model trained, or --replay_reward_model_rows=false")
  dtypes = dict(tokens=np.int32, attention_mask=bool, positions=np.int32, labels=np.float32, loss_mask=bool,
                group=np.int32, outcome=np.float32)  # RewardModelUpdates' buffer
  return rm.RewardData(**{name: np.asarray(x, dtypes[name]) for name, x in rows._asdict().items()})


def make(config: config_lib.Config, tokenizer, policy_config, placement=None):
  """The reward scorer of `reward`: a LearnedReward, an ExactStepReward, or None for a rule reward."""
  if learned(config):
    return LearnedReward(config, tokenizer, policy_config, placement)
  if config.task.reward == "exact_steps":
    return ExactStepReward(tokenizer, config.reward_model.prm_max_steps)
  return None


def _min_step(rewards: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """`[N]` the lowest step reward of each completion (Math-Shepherd's verdict); 0 without steps."""
  return np.where(mask.any(-1), np.min(np.where(mask, rewards, np.inf), axis=-1), 0.0).astype(np.float32)


class LearnedReward:
  """A frozen (within an iteration) ORM or PRM scoring the policy's samples."""

  def __init__(self, config: config_lib.Config, tokenizer, policy_config, placement=None):
    path, reward = config.reward_model.reward_model, config.task.reward
    reward_config, kind = model_config(config, policy_config)
    params, _, _ = rm.load_reward_model(path, dtype=reward_config.dtype, param_dtype=reward_config.param_dtype,
                                        scan_layers=reward_config.scan_layers)
    if kind != reward and not (reward == "orm" and kind in rm.OUTCOME_KINDS):
      raise ValueError(f"--reward={reward} but {path} holds a reward model of kind {kind}")
    if reward_config.vocab_size != policy_config.vocab_size:
      raise ValueError(f"{path}: vocabulary of {reward_config.vocab_size} tokens, the policy's has "
                       f"{policy_config.vocab_size}; a reward model must share the policy's tokenizer")
    self.max_steps = config.reward_model.prm_max_steps
    updates = config.reward_model
    self.training_rows = (training_rows(config, kind) if updates.iterations > 1 and updates.replay_reward_model_rows
                          else None)  # read before any training: a mismatch fails at once
    self.placement = placement or placement_lib.Placement()
    self.params = self.placement.put_params(params)
    self.config, self.kind, self.tokenizer = reward_config, kind, tokenizer
    rows, host = self.placement.rows, self.placement.host
    chunk = lambda config, tokens: scorer_options(self.placement, config, *tokens.shape)
    self._outcome = lambda params, config, *arrays: host(OUTCOME_SCORES(params, config, *rows(arrays),
                                                                        **chunk(config, arrays[0])))
    self._steps = lambda params, config, *arrays: host(STEP_SCORES(params, config, *rows(arrays),
                                                                    **chunk(config, arrays[0])))
    if rm.score_of(params) == "loglik":
      program = OUTCOME_LOGITS[kind]
      self._logits = lambda params, config, *arrays: host(program(params, config, *rows(arrays),
                                                                  **chunk(config, arrays[0])))

  def steps(self, samples, texts, examples=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PRM or orm_steps: `(σ(step scores) [N, K], completion-relative step ends [N, K], step mask [N, K])`;
    `examples` (the problems) is unused: a reward model sees only the text."""
    ends, mask = rm.sample_segment_ends(self.tokenizer, np.asarray(samples.tokens), np.asarray(samples.lengths),
                                        texts, self.max_steps)
    tokens, attention = map(np.asarray, logprobs_lib.sequences_from_samples(samples))
    prompt_len = samples.prompt_tokens.shape[1]
    scores = self._steps(self.params, self.config, tokens, attention, (ends + prompt_len).astype(np.int32), mask)
    return np.asarray(jax.nn.sigmoid(scores)) * mask, ends, mask

  def outcome(self, samples, texts, examples=None) -> np.ndarray:
    """`[N]` rewards in (0, 1): σ(ORM score); for orm_steps the noisy-AND Π_j σ(step score j) (1 without
    steps); for a PRM σ(min step score) (Math-Shepherd's verdict). A "loglik"-score model: σ(that logit +
    α · its backbone's log-likelihood of the completion) (`rm.outcome_logits`)."""
    if rm.score_of(self.params) == "loglik":
      return np.asarray(jax.nn.sigmoid(self.outcome_logits(samples, texts)), np.float32)
    if self.kind == "orm":
      tokens, attention = map(np.asarray, logprobs_lib.sequences_from_samples(samples))
      return np.asarray(jax.nn.sigmoid(self._outcome(self.params, self.config, tokens, attention)), np.float32)
    probabilities, _, mask = self.steps(samples, texts)
    if self.kind == "orm_steps":
      return np.prod(np.where(mask, probabilities, 1.0), axis=-1).astype(np.float32)
    return _min_step(probabilities, mask)


  def outcome_logits(self, samples, texts) -> np.ndarray:
    """`[N]` `rm.outcome_logits` of an outcome model ("orm": its last token; "orm_steps": its step ends)."""
    tokens, attention = map(np.asarray, logprobs_lib.sequences_from_samples(samples))
    prompt_len = samples.prompt_tokens.shape[1]
    if self.kind == "orm":
      ends = np.asarray(rm.last_token_index(attention))[:, None].astype(np.int32)
      mask = np.ones_like(ends, bool)
    else:
      ends, mask = rm.sample_segment_ends(self.tokenizer, np.asarray(samples.tokens), np.asarray(samples.lengths),
                                          texts, self.max_steps)
      ends = (ends + prompt_len).astype(np.int32)
    starts = np.full(tokens.shape[0], prompt_len, np.int32)
    return np.asarray(self._logits(self.params, self.config, tokens, attention, ends, mask, starts))


class ExactStepReward:
  """A perfect PRM on the synthetic task: every step's exact label (`reward_models.exact_step_labels`,
  propagated: after the first wrong step all are wrong) is its reward. GRPO+PS on it bounds what a
  learned PRM can give; `--reward=exact_steps`."""

  def __init__(self, tokenizer, max_steps: int):
    self.tokenizer, self.max_steps = tokenizer, max_steps

  def steps(self, samples, texts, examples) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(exact labels [N, K], completion-relative step ends [N, K], step mask [N, K])`."""
    ends, mask = rm.sample_segment_ends(self.tokenizer, np.asarray(samples.tokens), np.asarray(samples.lengths),
                                        texts, self.max_steps)
    labels, label_mask = positions.pad_segments(rm.exact_step_labels(texts, examples), self.max_steps, np.float32)
    if not np.array_equal(label_mask, mask):
      raise ValueError("exact step labels and the completions' segments disagree in number")
    return labels * mask, ends, mask

  def outcome(self, samples, texts, examples) -> np.ndarray:
    """`[N]` 1 where every step is right (the lowest label), else 0."""
    return _min_step(*self.steps(samples, texts, examples)[::2])


class RewardModelUpdates:
  """Iterative RL's reward-model side: its optimiser state and the replay buffer, both checkpointed. With
  `rm_update_lora_rank` the reward model carries adapters from the start (`rm.adapters`), trained across rounds."""

  def __init__(self, reward: LearnedReward, task, rollouts):
    self.reward, self.task, self.rollouts = reward, task, rollouts
    self.config = config = rollouts.config
    updates = config.reward_model
    optimizer = training.make_optimizer(updates.rm_update_learning_rate, warmup_steps=10,
                                        total_steps=max(updates.rm_update_steps * updates.iterations, 1),
                                        max_grad_norm=1.0)
    # With --rm_update_lora_rank the backbone trains through adapters (its base weights as loaded), from exactly the
    # loaded model; without, a "loglik"-score model keeps its backbone frozen: fine-tuning it on a few thousand
    # samples spoils the likelihood it scores with (docs/reward_models.md).
    if updates.rm_update_lora_rank:
      params, reward.config = rm.adapters.add(reward.params, reward.config,
                                              jax.random.fold_in(jax.random.key(config.run.seed), 7),
                                              rank=updates.rm_update_lora_rank, alpha=updates.rm_update_lora_alpha)
      reward.params = reward.placement.put_params(params)
      optimizer = rm.adapters.optimizer(optimizer)
    self.frozen = rm.score_of(reward.params) == "loglik" and not updates.rm_update_lora_rank
    self.prompt_len = config.task.max_prompt_len
    if self.frozen:
      optimizer = rm.frozen_backbone_optimizer(optimizer)
    self.train_step = rm.make_reward_train_step(reward.config, optimizer, kind=reward.kind, prompt_len=self.prompt_len,
                                                freeze_backbone=self.frozen)
    self.state = training.init_train_state(reward.params, optimizer)
    k = 1 if reward.kind == "orm" else updates.prm_max_steps
    length = config.task.max_prompt_len + config.rollout.max_new_tokens
    example = rm.RewardData(tokens=np.zeros((0, length), np.int32), attention_mask=np.zeros((0, length), bool),
                            positions=np.zeros((0, k), np.int32), labels=np.zeros((0, k), np.float32),
                            loss_mask=np.zeros((0, k), bool), group=np.zeros((0,), np.int32),
                            outcome=np.zeros((0,), np.float32))
    self.replay = replay_lib.init_replay(example._asdict(), updates.replay_capacity, seed=config.run.seed)
    if reward.training_rows is not None:  # Algorithm 1's historical data: the rows the reward model trained on
      self.replay = replay_lib.add(self.replay, reward.training_rows._asdict())
      report.note(f"replay: starts with {self.replay.size} of the reward model's {len(reward.training_rows.tokens)} "
                  f"training rows")
      reward.training_rows = None

  def checkpoint_state(self) -> dict:
    return {"reward_model": self.state, "replay": replay_lib.state_dict(self.replay)}

  def restore(self, saved: dict) -> None:
    self.state = saved["reward_model"]
    self.replay = replay_lib.from_state_dict(saved["replay"])
    self.reward.params = self.state.params

  def _labelled(self, policy, examples, key) -> rm.RewardData:
    """G samples of the current policy for each of `examples`, labelled."""
    config, g = self.config, self.config.rollout.group_size
    scored = self.rollouts.sample(policy, examples, key, g)
    texts = evaluation.decode(self.task.tokenizer, scored.host)
    repeated = [e for e in examples for _ in range(g)]
    labels = "exact" if config.task.task in config_lib.SYNTHETIC_TASKS else "mc_hard"
    return rm.label_samples(scored.host, texts, repeated, self.task.tokenizer, kind=self.reward.kind,
                            step_labels=labels, max_steps=config.reward_model.prm_max_steps, policy=policy,
                            config=self.rollouts.model_config, temperature=config.rollout.temperature,
                            mc_max_new_tokens=config.rollout.max_new_tokens, key=jax.random.fold_in(key, 1))

  def _evaluate(self, data: rm.RewardData) -> dict:
    return rm.evaluate(self.state.params, self.reward.config, data, kind=self.reward.kind, prompt_len=self.prompt_len)

  def update(self, policy, iteration: int, key) -> dict:
    """Samples the current policy, labels, mixes in history, trains; returns the iteration's metrics.

    "before_*" and "after_*": the reward model on the new training samples before (unseen: how stale it is) and
    after its training on them; with `rm_update_eval_prompts`, "held_out_before_*" and "held_out_after_*" the same
    on further fresh samples it never trains on (`rm.evaluate`'s keys, "outcome/group_auc" among them).
    """
    config, updates = self.config, self.config.reward_model
    t0 = time.time()
    examples = [self.task.train_example(10**9 + iteration * updates.rm_update_prompts + i)  # not the RL order
                for i in range(updates.rm_update_prompts)]
    new = self._labelled(policy, examples, key)
    held_out = None
    if updates.rm_update_eval_prompts:  # problems of their own (neither the RL order nor the training samples')
      held_out = self._labelled(policy, [self.task.train_example(2 * 10**9 + iteration * updates.rm_update_eval_prompts
                                                                 + i) for i in range(updates.rm_update_eval_prompts)],
                                jax.random.fold_in(key, 2))
    metrics = {f"before_{k}": v for k, v in self._evaluate(new).items()}  # on unseen samples
    if held_out is not None:
      metrics.update({f"held_out_before_{k}": v for k, v in self._evaluate(held_out).items()})
    mixed, self.replay = replay_lib.mix(self.replay, new._asdict(), fraction=updates.replay_fraction)
    mixed = rm.RewardData(**mixed)
    num_new = len(new.tokens)
    if updates.rm_update_steps:
      self.state, history = rm.fit(self.state, self.train_step, mixed, steps=updates.rm_update_steps,
                                   batch_size=updates.rm_update_batch_size, seed=config.run.seed + iteration,
                                   start=int(self.state.step))
      self.reward.params = self.state.params
      metrics.update({f"after_{k}": v for k, v in self._evaluate(new).items()}, loss=history[-1][1]["loss"])
      if held_out is not None:
        metrics.update({f"held_out_after_{k}": v for k, v in self._evaluate(held_out).items()})
    else:  # never retrained: after is before
      metrics.update({k.replace("before_", "after_", 1): v for k, v in list(metrics.items())})
    metrics.update(rows_new=float(num_new), rows_replayed=float(len(mixed.tokens) - num_new), time=time.time() - t0)
    return metrics
