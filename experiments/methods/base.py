"""What a method provides to the training loop (`trainer.loop`), and the defaults most methods share.

A method of DeepSeekMath's unified paradigm (§5.2.1, Table 10) is its data source (offline from the start policy,
or online from the current one), its reward and its gradient coefficient: `collect` and `objective`. The loop
owns everything else (optimiser, update step, evaluation, logging, checkpoints, resume, iterative RL); a method
may override the hooks below where it differs (its trained pytree, its optimiser, how a step's rows form
minibatches, how it is evaluated, what stage 1 imitates).
"""

import abc

import jax
import jax.numpy as jnp
import optax

from experiments.methods import program as program_lib
from experiments.runner import config as config_lib
from experiments.runner import evaluation
from experiments.runner import optimizer as optimizer_lib
from experiments.runner import policy
from experiments.runner import warm_start
from grpo_jax import length_buckets as length_buckets_lib
from grpo_jax import training
from grpo_jax.training import update as update_lib
from grpo_jax.models import lora


class Method(abc.ABC):
  """Base class: the policy is the whole trained pytree and there is no critic."""

  name = "method"
  rows_per_item = 1  # rows that must stay together in a minibatch (2: DPO's (o⁺, o⁻) pairs)
  samples_each_step = True  # whether `collect` samples the rollouts' policy every step (SFT: no)
  samples_offline = False  # whether `prepare` samples the start policy once for the run's data (RFT, DPO)
  sft_marker = policy.SFT_MARKER  # the file in a stage-1 policy that says this method family fine-tuned it

  def __init__(self, config: config_lib.Config, model_config, task, rollouts, reference):
    self.config, self.model_config, self.task = config, model_config, task
    self.rollouts, self.reference = rollouts, reference

  def use_reference(self, reference) -> None:
    """π_ref from here on: the trainer passes the start policy in before stage 2, π_θ at each iteration start of
    iterative RL (and its checkpointed copy on resume), and None once stage 2 is over (its memory freed)."""
    self.reference = reference

  def host_state(self) -> dict:
    """What a checkpoint records of the method beyond its arrays: the prompts cut to --max_prompt_len since the
    start (the rebuilt offline data's included), by `restore_host_state` on resume."""
    return {"prompts_truncated": int(self.rollouts.prompts_truncated)}

  def restore_host_state(self, meta: dict) -> None:
    """`host_state` back from a checkpoint's metadata (a checkpoint saved before it was recorded has none)."""
    if meta.get("prompts_truncated") is not None:
      self.rollouts.prompts_truncated = int(meta["prompts_truncated"])

  def rows_per_step(self) -> int:
    return self.config.rows_per_step

  def init_params(self, policy, key):
    """The pytree the optimiser trains, from the start policy's params."""
    del key
    return policy

  def policy(self, params):
    """The policy's params inside the trained pytree (evaluated and exported)."""
    return params

  def optimizer(self, total_updates: int, warmup: int) -> optax.GradientTransformation:
    return optimizer_lib.make_optimizer(self.config.optim, self.config.optim.learning_rate, total_updates, warmup)

  def prepare(self, start_policy, key) -> dict:
    """Builds offline data from the start policy; returns stats to log. Online methods do nothing."""
    del start_policy, key
    return {}

  @abc.abstractmethod
  def objective(self):
    """The `(params, batch, totals) -> (loss, metrics)` objective, static keywords bound."""

  @abc.abstractmethod
  def collect(self, params, position: int, key):
    """`(batch, stats, next_position)`: one step's training rows, on the device(s); `position` counts data
    consumed; `stats` are host floats."""

  def minibatches(self, batch, key, epoch: int, minibatch: int):
    """The step's minibatches for one epoch: rows shuffled by items of `rows_per_item` (kept together), split
    into `minibatch` rows each, gathered on the device."""
    rows = self.rows_per_step()
    items, per_item = rows // self.rows_per_item, self.rows_per_item
    order = jax.random.permutation(jax.random.fold_in(key, 10_000 + epoch), items)
    order = (order[:, None] * per_item + jnp.arange(per_item)[None, :]).reshape(-1)
    return [take(batch, order[i:i + minibatch]) for i in range(0, rows, minibatch)]

  def update_rows(self, minibatch: int) -> int:
    """The rows of the update's batch for a minibatch of `minibatch` rows (Flow-GRPO: trajectories' turns, padded)."""
    return minibatch

  def abstract_batch(self, rows):
    """The update's batch as abstract arrays: `rows(dtype, *shape)` is one placed [`update_rows`, *shape] array of
    `dtype`. A `training.Batch` of [P + T] rows built from samples (their log-probs included) by default."""
    width = self.config.task.max_prompt_len + self.config.rollout.max_new_tokens
    f32, bool_ = rows(jnp.float32, width), rows(jnp.bool_, width)
    return training.Batch(tokens=rows(jnp.int32, width), attention_mask=bool_, loss_mask=bool_, old_logp=f32,
                          ref_logp=f32, advantages=f32, sampler_logp=f32)

  def scoring_forwards(self) -> tuple[str, ...]:
    """The policy forwards a step's `collect` runs over its rows ("π_old", "π_ref"): `collect` and
    `trainer.programs` read this one answer. None by default."""
    return ()

  def scoring_shape(self) -> tuple[int, int]:
    """`(rows, width)` of the widest token rows `scoring_forwards` run over: B·G samples of P + T tokens."""
    rollout = self.config.rollout
    return rollout.batch_size * rollout.group_size, self.config.task.max_prompt_len + rollout.max_new_tokens

  def scoring_logprobs(self):
    """The forward (`Placement.logprobs`) that runs `scoring_forwards`: the rollouts' ungrouped one by default."""
    return self.rollouts.logprobs

  def forward_layout(self) -> dict:
    """`scoring_logprobs`' layout keywords (`Placement.logprobs`: group_size, prompt_len, buckets), and live_blocks
    (rows a block, empty blocks skipped: Flow-GRPO's turns); {} for rows each with its own prompt."""
    return {}

  def step_programs(self, shapes: program_lib.Shapes) -> dict[str, program_lib.Program]:
    """The programs a step's `collect` runs beyond the rollouts' sampler and a learned reward, by name, in the
    order it runs them, built from the callables it calls (ahead of time: `trainer.programs`). By default the
    forward `scoring_logprobs` over `scoring_shape`'s rows for `scoring_forwards`; with LoRA, π_ref reads the base
    alone (the adapters off: another argument structure), so π_old over base + adapters is a second program,
    old_logprobs. A subclass adds its own (PPO's values, the distillation teacher's forward, Flow-GRPO's planner)."""
    forwards = self.scoring_forwards()
    if not forwards:
      return {}
    n, width = self.scoring_shape()
    layout, logprobs = self.forward_layout(), self.scoring_logprobs()
    group, buckets, blocks = layout.get("group_size", 1), layout.get("buckets"), layout.get("live_blocks")
    chunk = self.rollouts.placement.forward_chunk(self.model_config, n, width, group=group, cached=group > 1,
                                                  logits_chunk=self.config.model.logprob_chunk)  # as its rows chunk
    how = f" of the {n} rows, " + (f"in blocks of {blocks}, those without a real row skipped" if blocks else
                                   f"{chunk or n} at a time" if buckets is None else
                                   f"in {buckets.num_micro_batches} length-sorted micro-batches at widths "
                                   f"{buckets.widths}") + (f", each prompt once per group of {group}" if group > 1
                                                           else "")

    def forward(params, uses: str, calls: int) -> program_lib.Program:  # its placement follows the tree's structure
      return program_lib.Program(logprobs.program((n, width), params), (params, shapes.rows(jnp.int32, n, width),
                                                                        shapes.rows(jnp.bool_, n, width)),
                                 uses + how, per_step=calls)

    if not self.config.model.lora_rank:
      return {"logprobs": forward(shapes.policy, f"the {' and '.join(forwards)} forward", len(forwards))}
    out = {}
    if "π_old" in forwards:
      out["old_logprobs"] = forward(shapes.policy, "the π_old forward (base + adapters)", 1)
    if "π_ref" in forwards:
      out["logprobs"] = forward(lora.disabled(shapes.policy), "the π_ref forward (the base, adapters off)", 1)
    return out

  def eval_programs(self, shapes: program_lib.Shapes, held_out: int) -> dict[str, program_lib.Program] | None:
    """The programs `evaluate` runs over at most `held_out` problems; None: `runner.evaluation`'s samplers (the
    trainer lists them from the config)."""
    del shapes, held_out
    return None

  def update_micro_batches(self, minibatch: int) -> int:
    """The micro-batches of the update over a minibatch of `minibatch` items (`make_train_step`'s
    num_micro_batches; length buckets set their own): --grad_accum_steps."""
    del minibatch
    return self.config.algorithm.grad_accum_steps

  def skips_empty_micro_batches(self) -> bool:
    """Whether the update's micro-batches without a loss token skip their forward and backward (`make_train_step`'s
    skip_empty: rows padded to one fixed count); no by default."""
    return False

  def fixed_step_shapes(self) -> bool:
    """Whether a step's forwards and update take the same shapes every step, known before the first
    (`step_programs`, `update_rows`), so that they compile ahead (`trainer.ahead`): with length buckets; padded, the
    widths follow each step's completions."""
    return self.bucketed_update() is not None

  def bucketed_update(self):
    """The update's length-bucketed layout (`training.update.BucketedRows`), or None: padded (the default)."""
    return None

  def length_buckets(self, rows: int, at_least: int) -> length_buckets_lib.Buckets | None:
    """The length-bucketed layout of `rows` sampler rows in at least `at_least` micro-batches
    (`--token_layout=buckets`), or None (padded). Raises RunError where the rows are not whole groups."""
    rollout = self.config.rollout
    if rollout.token_layout != "buckets":
      return None
    g = rollout.group_size
    if rows % g:
      raise config_lib.RunError(f"--token_layout=buckets: minibatches of {rows} rows are not whole groups of "
                                f"--group_size={g}; set --minibatch_size to a multiple of it")
    shards = self.rollouts.placement.row_shards(rows, g)
    return length_buckets_lib.Buckets(
        length_buckets_lib.ladder(rollout.max_new_tokens, rollout.bucket_widths, rollout.completion_pad_multiple or 1),
        length_buckets_lib.micro_batches(rows, at_least, shards), shards)

  def scoring_buckets(self) -> length_buckets_lib.Buckets | None:
    """The scoring forwards' length buckets (`--token_layout=buckets`; None: padded): the step's rows in at least as
    many micro-batches as the padded forward's row chunks at the full width (`--forward_memory_budget`), so its
    memory budget holds, in blocks of at least `length_buckets.MIN_BLOCK_TOKENS` tokens (`with_block_tokens`)."""
    rollout, p = self.config.rollout, self.config.task.max_prompt_len
    if rollout.token_layout != "buckets":
      return None
    rows = self.rows_per_step()
    chunk = self.rollouts.placement.forward_chunk(self.model_config, rows, p + rollout.max_new_tokens,
                                                  logits_chunk=self.config.model.logprob_chunk, cached=True)
    chunks = -(-rows // chunk) if chunk else 1
    buckets = self.length_buckets(rows, max(rollout.bucket_micro_batches, chunks))
    return length_buckets_lib.with_block_tokens(buckets, rows)

  def bucketed_rows(self, prefill=None) -> update_lib.BucketedRows | None:
    """The update's length-bucketed layout with `--token_layout=buckets` (None: padded): each minibatch in at least
    max(--bucket_micro_batches, --grad_accum_steps) length-sorted micro-batches, its prompts' prefixes by `prefill`
    (`update_lib.BucketedRows`)."""
    algo, rollout = self.config.algorithm, self.config.rollout
    minibatch = algo.minibatch_size or self.rows_per_step()
    buckets = self.length_buckets(minibatch, max(rollout.bucket_micro_batches, algo.grad_accum_steps))
    if buckets is None:
      return None
    return update_lib.BucketedRows(buckets, self.model_config, rollout.group_size, self.config.task.max_prompt_len,
                                 prefill)

  def evaluate(self, params, key, task=None) -> dict:
    """Held-out metrics of the policy params (`runner.evaluation.evaluate`) on `task.test` (default: the method's
    task; the trainer passes `Task.validation_view()` for --num_validation)."""
    task = self.task if task is None else task
    return evaluation.evaluate(params, self.model_config, task, self.config, key, self.rollouts.placement)

  def demonstrations(self) -> warm_start.Demonstrations:
    """Stage 1's data: the SFT pool's worked solutions after the task's prompts."""
    tok = self.task.tokenizer
    examples = [e for e in self.task.sft_pool if e.solution]
    pairs = [(tok.encode(self.task.prompt(e), add_special_tokens=False),
              tok.encode(e.solution, add_special_tokens=False) + [tok.eos_token_id]) for e in examples]
    return warm_start.Demonstrations(pairs, self.config.task.max_prompt_len, self.config.rollout.max_new_tokens, 12345)

  def summary_rows(self, start: dict, final: dict) -> list[tuple[str, str]]:
    """Extra lines of the closing table (held-out metrics beyond accuracy)."""
    return [(f"format rate, after {self.name}", f"{100 * final['format_rate']:.1f}%")]


def correction_kwargs(algo: config_lib.AlgorithmConfig) -> dict:
  """The objectives' rollout-correction arguments (`training.update.rollout_correction`) of the flags."""
  return dict(correction=algo.rollout_correction, lower=algo.rollout_correction_lower,
              upper=algo.rollout_correction_upper)


def take(batch, rows):
  """The rows `rows` of every array of a batch pytree (a device gather; sharded arrays stay sharded)."""
  return jax.tree.map(lambda x: x[rows], batch)
