r"""The compiled programs of a run, built by the runner's own builders at abstract shapes.

  placement = placement_lib.Placement.from_config(config.mesh, devices)      # e.g. a TPU topology's devices
  for name, p in programs(config, model_config, placement).items():
    p.jitted.trace(*p.args, **p.kwargs).lower().compile()   # nothing allocated: ShapeDtypeStruct args

`programs` returns exactly the programs stage 2 of `loop.run(config)` runs (for --algo=grpo, online_rft,
rft_table10, distill, sft, rft and dpo, with or without LoRA, and --algo=ppo without; flow_grpo is refused with one
line), in
the order a step runs them, each built by the code the runner calls (so a change there changes them here;
tests/test_aot_compile.py checks them against a run's):

  sampler       the rollouts' sampler (`Rollouts.sampler_options`): B prompts of P tokens, G samples each
  reward        a learned reward's scorer (`learned_reward.OUTCOME_SCORES` or `STEP_SCORES`), with --reward=orm|prm
  logprobs      the π_ref (β > 0) and π_old (when recomputed) forward the method calls (`Placement.logprobs`,
                at the rollout temperature, grouped when the method shares prompts), over [B·G, P + T] rows;
                with LoRA π_ref is the base params alone (the adapters off), so with π_old as well its forward
                over base + adapters is a second program, old_logprobs
  teacher_logprobs  --algo=distill: the frozen teacher's forward over the same rows (`Distill.teacher_logprobs`),
                its params abstract from its config.json
  values        PPO's value forward V_ψ over the [B·G, P + T] rows (`PPO.values`), its value model's params from
                the train state
  update        the method's objective and optimiser schedule (`plan.update_plan`) through `Placement.train_step`,
                over a minibatch of [M, P + T] rows in `grad_accum_steps` micro-batches; the train state donated
                (with LoRA the state holds the adapters and their moments only, and the frozen base is a third,
                not donated, argument: `loop.train`'s `lora.TrainedPart`)
  eval_greedy   held-out evaluation's sampler (`evaluation.generate_options`), and eval_samples with
                --eval_samples=k: k samples per prompt at --eval_temperature

Widths are the widest the runner gives: a step trims its completions to the longest one
(`rollouts.completion_width`), which is at most T = --max_new_tokens. Every program's first argument is the
resident tree it reads (the train state, policy, reference or reward-model params; `Program.resident_args` names
every argument that is one): `resident` gives the trees that stay on the device(s) between programs, so a
program's peak is its own memory plus the resident trees that are not its arguments.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from experiments import methods as methods_lib
from experiments.methods import learned_reward
from experiments.runner import config as config_lib
from experiments.runner import evaluation
from experiments.runner import placement as placement_lib
from experiments.trainer import plan
from grpo_jax import models
from grpo_jax import partitioning
from grpo_jax import rollout_engine
from grpo_jax import sampling
from grpo_jax import training
from grpo_jax.models import lora

ALGOS = ("grpo", "online_rft", "rft_table10", "ppo", "distill", "sft", "rft", "dpo")  # those whose programs are listed


@dataclasses.dataclass(frozen=True)
class Program:
  """One jitted program of a run and its abstract arguments (`jax.ShapeDtypeStruct`s carrying shardings; static
  arguments as they are)."""
  jitted: Any  # jax.jit-wrapped: `.trace(*args, **kwargs)`
  args: tuple
  uses: str  # what the runner runs it for
  per_step: int  # calls per stage-2 step (0: not a step's program, e.g. evaluation)
  per_eval: int = 0  # calls per evaluation
  per_run: int = 0  # calls once per run, before the steps (an offline method's sampling of its data)
  # Trip count of its while loops (the sampler: its decode steps); a tuple, of nested ones (outermost first).
  loop_trips: int | tuple[int, ...] = 1
  kwargs: dict = dataclasses.field(default_factory=dict)  # static keyword arguments: `.trace(*args, **kwargs)`
  resident_args: tuple = (0,)  # the arguments that are (parts of) resident trees, not the program's own


@dataclasses.dataclass(frozen=True)
class RewardModel:
  """A learned reward model's shapes: its backbone's config (as `learned_reward.LearnedReward` loads it) and kind."""
  config: models.ModelConfig
  kind: str  # orm, orm_steps or prm (`reward_models.KINDS`)


def _abstract(shapes, shardings):
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def _check(config: config_lib.Config, placement: placement_lib.Placement, reward: RewardModel | None) -> None:
  """The runner's checks of a run's placement, plus what this module covers; ConfigError with one line."""
  if config.algorithm.algo not in ALGOS:
    raise config_lib.ConfigError(f"--algo={config.algorithm.algo}: its programs are not listed yet (listed: "
                                 f"{', '.join(ALGOS)})")
  if config.algorithm.algo == "ppo" and config.model.lora_rank:
    raise config_lib.ConfigError("--algo=ppo with --lora_rank > 0: its programs are not listed yet")
  if config.algorithm.algo == "ppo" and config.algorithm.value_init != "policy":
    raise config_lib.ConfigError(f"--value_init={config.algorithm.value_init}: the programs of a value model "
                                 "from its own checkpoint are not listed yet (listed: --value_init=policy)")
  if placement.mesh is None:
    raise config_lib.ConfigError("--mesh is empty: the runner then runs on one device; give the mesh to compile "
                                 "for, e.g. --mesh=fsdp:8")
  if learned_reward.learned(config) != (reward is not None):
    raise config_lib.ConfigError("a learned reward (--reward=orm|prm) needs its reward model's shapes, and only it")
  plan.check_divisible(config, placement.data_parallel)


def _setup(config: config_lib.Config, model_config: models.ModelConfig, placement: placement_lib.Placement,
           reward: RewardModel | None):
  """The runner's method (its rollouts on `placement`, no task or weights) and the abstract policy params; with
  --lora_rank the policy config and params are `loop.run`'s: the base's plus fresh adapters (`lora.add_adapters`)."""
  _check(config, placement, reward)
  lora_rank = config.model.lora_rank
  policy_config = lora.lora_config(model_config, rank=lora_rank, alpha=config.model.lora_alpha,
                                   targets=config_lib.lora_targets(config.model.lora_targets)
                                   ) if lora_rank else model_config
  rollouts = methods_lib.Rollouts(config, policy_config, None, None, placement)
  method = methods_lib.METHODS[config.algorithm.algo](config, policy_config, None, rollouts, None)
  init = lambda key: models.init_params(model_config, key)
  if lora_rank:
    init = lambda key: lora.add_adapters(models.init_params(model_config, key), policy_config, key)
  shapes = jax.eval_shape(init, jax.random.key(0))
  params = _abstract(shapes, partitioning.param_shardings(placement.mesh, placement.rules, shapes))
  return method, params


def _model_params(config: models.ModelConfig, placement: placement_lib.Placement):
  """Abstract params of a frozen model of `config` (the distillation teacher), placed by the rules."""
  shapes = jax.eval_shape(lambda k: models.init_params(config, k), jax.random.key(0))
  return _abstract(shapes, partitioning.param_shardings(placement.mesh, placement.rules, shapes))


def _reward_params(reward: RewardModel, placement: placement_lib.Placement):
  shapes = jax.eval_shape(lambda k: models.init_scalar_params(reward.config, k), jax.random.key(0))
  return _abstract(shapes, partitioning.param_shardings(placement.mesh, placement.rules, shapes))


def _train_state(method, params, placement: placement_lib.Placement):
  """`(optimiser steps per step, minibatch rows, optimiser, abstract train state, its shardings, frozen)`: as
  `loop.train` builds them; with LoRA the state holds the trained leaves only and `frozen` is the rest (the base,
  the policy's own arrays), else None."""
  minibatch, updates_per_step, optimizer = plan.update_plan(method)
  part = lora.TrainedPart(enabled=method.cfg.model.lora_rank > 0)  # as `loop.train` cuts it
  frozen = part.split(params)[1]  # `init_params` keeps the policy's arrays (grpo, online_rft: the policy itself)
  shapes = jax.eval_shape(lambda p, k: training.init_train_state(part.trained(method.init_params(p, k)), optimizer),
                          params, jax.random.PRNGKey(0))
  shardings = partitioning.state_shardings(placement.mesh, placement.rules, shapes)
  return updates_per_step, minibatch, optimizer, _abstract(shapes, shardings), shardings, frozen


def resident(config: config_lib.Config, model_config: models.ModelConfig, placement: placement_lib.Placement,
             reward: RewardModel | None = None) -> dict[str, Any]:
  """The abstract trees that stay on the device(s) through stage 2 of `loop.run`, by name: the train state, the
  frozen reference (`method.reference`, a copy of the start policy, whose own buffers the train state took:
  `Placement.train`) and the learned reward model. With LoRA: the train state (the adapters and their optimiser
  state) and the base ("base": the frozen part of the policy, and π_ref with β > 0: no copy)."""
  method, params = _setup(config, model_config, placement, reward)
  state = _train_state(method, params, placement)[3]
  if config.model.lora_rank:
    out = {"train state": state, "base": lora.disabled(params)}
  else:
    out = {"train state": state, "reference": params}
  if config.algorithm.algo == "distill":  # no π_ref; the teacher
    out.pop("reference", None)
    out["teacher"] = _model_params(method.teacher_config, placement)
  if reward is not None:
    out["reward model"] = _reward_params(reward, placement)
  return out


def programs(config: config_lib.Config, model_config: models.ModelConfig, placement: placement_lib.Placement,
             reward: RewardModel | None = None) -> dict[str, Program]:
  """The programs stage 2 of `loop.run(config)` compiles, by name, in the order a step runs them (see the module
  docstring). `model_config` is the policy's (`policy.load`'s), `placement` holds the mesh, `reward` the learned
  reward model's shapes (with --reward=orm|prm). Raises ConfigError (or RunError) with one line where the runner
  would refuse the config."""
  method, params = _setup(config, model_config, placement, reward)  # method.config: the policy's (LoRA: adapted)
  mesh, rules, rows_sharding = placement.mesh, placement.rules, placement.batch_sharding
  rollout, algo = config.rollout, config.algorithm
  b, g, p, t = rollout.batch_size, rollout.group_size, config.task.max_prompt_len, rollout.max_new_tokens
  n, length = b * g, p + t
  rows = lambda dtype, count, width=length: jax.ShapeDtypeStruct((count, width), dtype, sharding=rows_sharding)
  scalar = partitioning.replicated(mesh)
  key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=scalar)  # jax.random.PRNGKey's
  temperature = jax.ShapeDtypeStruct((), jnp.float32, sharding=scalar)
  out = {}

  engine = rollout.sampler == "engine"
  dp = placement.data_parallel

  def sampler(prompts: int, samples: int, **options):
    """(the program, its arguments, the most trips of its decode loop) for `prompts` (padded to a multiple of
    the data shards by the engine) x `samples`: the engine's (`rollout_engine.jit_generate`, its caps a sixth
    argument; at most ceil(N / slots) completions a slot, each up to T tokens) or the static sampler's."""
    if not engine:
      return (sampling.jit_sample(method.config, (prompts, p), mesh=mesh, rules=rules, num_samples=samples,
                                  **options), (params, rows(jnp.int32, prompts, p), rows(jnp.bool_, prompts, p), key,
                                               temperature), t - 1)
    prompts += -prompts % dp
    caps = jax.ShapeDtypeStruct((prompts * samples,), jnp.int32, sharding=rows_sharding)
    fn = rollout_engine.jit_generate(method.config, (prompts, p), mesh=mesh, rules=rules, num_samples=samples,
                                     **options)
    # one loop of phases around the steps: at most every step in one phase (one wave: t steps)
    trips = (1, -(-prompts * samples // options["num_slots"]) * t)
    return fn, (params, rows(jnp.int32, prompts, p), rows(jnp.bool_, prompts, p), key, temperature, caps), trips

  rounds = rollout.dynamic_sampling_max_rounds if rollout.dynamic_sampling else 1
  options = method.rollouts.sampler_options()
  fn, args, trips = sampler(b, g, **options)
  if method.samples_offline:  # `offline.sample_offline`: the same program, --offline_prompts / B calls in `prepare`
    calls = -(-min(algo.offline_prompts, config.task.num_train) // b)
    out["sampler"] = Program(fn, args, f"offline data: {b} prompts x {g} samples of up to {t} tokens a call, "
                             f"{calls} calls before the first step", per_step=0, per_run=calls, loop_trips=trips)
  if method.samples_each_step:
    out["sampler"] = Program(fn, args,
                             f"rollouts: {b} prompts x {g} samples of up to {t} tokens"
                             + (f", {options['prompt_chunk']} prompts at a time" if options.get("prompt_chunk")
                                else "")
                             + (f", {options['num_slots']} decode slots (continuous batching)" if engine else "")
                             + (f" (1 to {rounds} rounds a step, --dynamic_sampling)" if rounds > 1 else ""),
                             per_step=1, loop_trips=trips)
  if reward is not None:
    reward_params = _reward_params(reward, placement)
    chunk = learned_reward.scorer_options(placement, reward.config, n, length)  # as `LearnedReward` calls it
    if reward.kind == "orm" and config.reward_model.supervision == "outcome":
      out["reward"] = Program(learned_reward.OUTCOME_SCORES,
                              (reward_params, reward.config, rows(jnp.int32, n), rows(jnp.bool_, n)),
                              f"the outcome reward model's score of the {n} rows, "
                              f"{chunk['rows_per_chunk'] or n} at a time", per_step=1, kwargs=chunk)
    else:
      k = config.reward_model.prm_max_steps
      out["reward"] = Program(learned_reward.STEP_SCORES,
                              (reward_params, reward.config, rows(jnp.int32, n), rows(jnp.bool_, n),
                               rows(jnp.int32, n, k), rows(jnp.bool_, n, k)),
                              f"the {reward.kind} reward model's scores at up to {k} step ends of the {n} rows, "
                              f"{chunk['rows_per_chunk'] or n} at a time", per_step=1, kwargs=chunk)
  forwards = method.scoring_forwards()  # what `collect` runs (PPO: the rollouts' ungrouped forward)
  if forwards:
    logprobs = method.scoring_logprobs()
    fn = lambda tree: logprobs.program((n, length), tree)  # its placement follows the tree's structure
    layout = method.forward_layout()  # as `scoring_logprobs` was built
    group = layout.get("group_size", 1)
    chunk = placement.forward_chunk(model_config, n, length, group=group, logits_chunk=config.model.logprob_chunk,
                                    cached=group > 1)  # the rows a chunk of `jit_token_logprobs` takes
    buckets = layout.get("buckets")
    how = f" of the {n} rows, " + (f"{chunk or n} at a time" if buckets is None else
                                   f"in {buckets.num_micro_batches} length-sorted micro-batches at widths "
                                   f"{buckets.widths}") + (f", each prompt once per group of {g}" if group > 1 else "")
    if config.model.lora_rank:  # π_ref: the base alone; π_old: base + adapters, another argument structure
      if "π_old" in forwards:
        out["old_logprobs"] = Program(fn(params), (params, rows(jnp.int32, n), rows(jnp.bool_, n)),
                                      "the π_old forward (base + adapters)" + how, per_step=1)
      if "π_ref" in forwards:
        base = lora.disabled(params)
        out["logprobs"] = Program(fn(base), (base, rows(jnp.int32, n), rows(jnp.bool_, n)),
                                  "the π_ref forward (the base, adapters off)" + how, per_step=1)
    else:
      out["logprobs"] = Program(fn(params), (params, rows(jnp.int32, n), rows(jnp.bool_, n)),
                                f"the {' and '.join(forwards)} forward" + how, per_step=len(forwards))
  if algo.algo == "distill":  # `Distill.collect`: the teacher's forward, grouped like π_ref's
    teacher = _model_params(method.teacher_config, placement)
    group = g if method.grouped() else 1
    chunk = placement.forward_chunk(method.teacher_config, n, length, group=group,
                                    logits_chunk=config.model.logprob_chunk, cached=group > 1)
    out["teacher_logprobs"] = Program(
        method.teacher_logprobs.program((n, length), teacher), (teacher, rows(jnp.int32, n), rows(jnp.bool_, n)),
        f"the teacher's forward of the {n} rows, {chunk or n} at a time"
        + (f", each prompt once per group of {g}" if group > 1 else ""), per_step=1)
  per_step, minibatch, optimizer, state, state_shardings, frozen = _train_state(method, params, placement)
  if algo.algo == "ppo":
    out["values"] = Program(method.values.program(), (state.params["value"], rows(jnp.int32, n), rows(jnp.bool_, n)),
                            f"the value forward V_ψ of the {n} rows", per_step=1)
  bucketed = method.bucketed_update()
  step = placement.train_step(state_shardings, optimizer, method.objective(), algo.grad_accum_steps, frozen=frozen,
                              bucketed=bucketed)
  batch = method.abstract_batch(lambda dtype: rows(dtype, minibatch))
  out["update"] = Program(step.program(), (state, batch) if frozen is None else (state, batch, frozen),
                          f"{method.name}: one optimiser step over {minibatch} rows in "
                          + (f"{algo.grad_accum_steps} micro-batches" if bucketed is None else
                             f"{bucketed.buckets.num_micro_batches} length-sorted micro-batches at widths "
                             f"{bucketed.buckets.widths}")
                          + ("" if frozen is None else " (LoRA: the adapters; the base frozen)"),
                          per_step=per_step, resident_args=(0,) if frozen is None else (0, 2))
  held_out = config.task.num_test  # the held-out set has at most this many problems
  options = evaluation.generate_options(config, held_out, placement)
  e = options["batch_size"]
  calls = -(-held_out // e)
  slots = lambda k: dict(num_slots=placement.engine_slots(method.config, e, p, k, t, rollout.num_slots)) if engine \
      else {}
  fn, args, trips = sampler(e, 1, max_new_tokens=t, greedy=True, **slots(1))
  out["eval_greedy"] = Program(fn, args, f"evaluation: greedy completions of {e} held-out prompts a call",
                               per_step=0, per_eval=calls, loop_trips=trips)
  if config.eval.eval_samples:
    k = config.eval.eval_samples
    fn, args, trips = sampler(e, k, max_new_tokens=t, **slots(k))
    out["eval_samples"] = Program(fn, args, f"evaluation: {k} samples of {e} held-out prompts a call (maj@k, pass@k)",
                                  per_step=0, per_eval=calls, loop_trips=trips)
  return out
