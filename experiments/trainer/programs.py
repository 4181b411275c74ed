r"""The compiled programs of a run, built by the runner's own builders at abstract shapes.

  placement = placement_lib.Placement.from_config(config.mesh, devices)      # e.g. a TPU topology's devices
  for name, p in programs(config, model_config, placement).items():
    p.jitted.trace(*p.args, **p.kwargs).lower().compile()   # nothing allocated: ShapeDtypeStruct args

`programs` returns exactly the programs stage 2 of `loop.run(config)` runs (every --algo, with or without LoRA;
--algo=ppo without), in the order a step runs them, each built by the code the runner calls (so a change there
changes them here; tests/scripts/test_aot_compile.py checks them against a run's):

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
  batch         the step's training batch from the sampler's rows, one program (`GRPO.step_batch`: loss mask and
                advantages; PPO's KL rewards, GAE and statistics; the paradigm methods' coefficients), reading no
                resident tree
  update        the method's objective and optimiser schedule (`plan.update_plan`) through `Placement.train_step`,
                over a minibatch of [M, P + T] rows in `grad_accum_steps` micro-batches; the train state donated
                (with LoRA the state holds the adapters and their moments only, and the frozen base is a third,
                not donated, argument: `loop.train`'s `lora.TrainedPart`)
  eval_greedy   held-out evaluation's sampler (`evaluation.generate_options`), and eval_samples with
                --eval_samples=k: k samples per prompt at --eval_temperature

--algo=flow_grpo runs on one device (the runner refuses a mesh): its programs are the runner's without a mesh,
compiled for the first device of `placement`'s mesh: the planner's sampler (`FlowGRPO.planner`) for a step's first
turn (sampler: B queries x G actions) and its later turns (sampler_turns: one action for each of the B·G
trajectories), π_old and π_ref over the turns' rows (`FlowGRPO.scoring_shape`), the update over a minibatch's turns
(`FlowGRPO.update_rows`, an `agents.TurnBatch`), and evaluation's greedy turns (eval_greedy), at the widest row
buckets. Without a tokenizer the sampler pads with the model config's pad id (the runner: the tokenizer's), a
constant of the program that changes none of its shapes, memory or FLOPs.

A method declares the programs its `collect` and `evaluate` run, from the callables they call
(`Method.step_programs`, `Method.eval_programs`: `methods.program.Program`s over the abstract `Shapes` this module
builds); this module adds the runner's own around them: the rollouts' sampler, a learned reward's scorer, the update
and evaluation's samplers.

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
from experiments.methods import program as program_lib
from experiments.methods.program import Program, Shapes
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

ALGOS = ("grpo", "online_rft", "rft_table10", "ppo", "distill", "sft", "rft", "dpo", "flow_grpo")  # listed


@dataclasses.dataclass(frozen=True)
class RewardModel:
  """A learned reward model's shapes: its backbone's config (as `learned_reward.LearnedReward` loads it) and kind."""
  config: models.ModelConfig
  kind: str  # orm, orm_steps or prm (`reward_models.KINDS`)


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


def _one_device(placement: placement_lib.Placement) -> tuple[placement_lib.Placement, placement_lib.Placement]:
  """`(the runner's placement, the abstract arguments')` of a run on one device (--algo=flow_grpo: the runner refuses
  a mesh), compiled for the first device of `placement`'s mesh: the runner's programs without a mesh, their
  arguments whole on that device (a one-device mesh)."""
  budget = dict(forward_rows=placement.forward_rows, forward_budget=placement.forward_budget)
  device = placement_lib.Placement(partitioning.single_device_mesh(placement.mesh.devices.flat[0]), placement.rules,
                                   **budget)
  return placement_lib.Placement(**budget), device


def _setup(config: config_lib.Config, model_config: models.ModelConfig, placement: placement_lib.Placement,
           reward: RewardModel | None):
  """`(method, abstract policy params, placement of the abstract arguments)`: the runner's method (its rollouts on
  the runner's placement, no task or weights); with --lora_rank the policy config and params are `loop.run`'s: the
  base's plus fresh adapters (`lora.add_adapters`)."""
  if config.algorithm.algo == "flow_grpo" and placement.mesh is not None:
    runs_on, placement = _one_device(placement)
  else:
    runs_on = placement
  _check(config, placement, reward)
  lora_rank = config.model.lora_rank
  policy_config = lora.lora_config(model_config, rank=lora_rank, alpha=config.model.lora_alpha,
                                   targets=config_lib.lora_targets(config.model.lora_targets)
                                   ) if lora_rank else model_config
  rollouts = methods_lib.Rollouts(config, policy_config, None, None, runs_on)
  method = methods_lib.METHODS[config.algorithm.algo](config, policy_config, None, rollouts, None)
  init = lambda key: models.init_params(model_config, key)
  if lora_rank:
    init = lambda key: lora.add_adapters(models.init_params(model_config, key), policy_config, key)
  shapes = jax.eval_shape(init, jax.random.key(0))
  params = program_lib.abstract(shapes, partitioning.param_shardings(placement.mesh, placement.rules, shapes))
  return method, params, placement


def _model_params(config: models.ModelConfig, placement: placement_lib.Placement):
  """Abstract params of a frozen model of `config` (the distillation teacher), placed by the rules (without a mesh:
  unplaced)."""
  shapes = jax.eval_shape(lambda k: models.init_params(config, k), jax.random.key(0))
  if placement.mesh is None:
    return shapes
  return program_lib.abstract(shapes, partitioning.param_shardings(placement.mesh, placement.rules, shapes))


def _reward_params(reward: RewardModel, placement: placement_lib.Placement):
  shapes = jax.eval_shape(lambda k: models.init_scalar_params(reward.config, k), jax.random.key(0))
  return program_lib.abstract(shapes, partitioning.param_shardings(placement.mesh, placement.rules, shapes))


def _train_state(method, params, placement: placement_lib.Placement):
  """`(optimiser steps per step, minibatch rows, optimiser, abstract train state, its shardings, frozen)`: as
  `loop.train` builds them; with LoRA the state holds the trained leaves only and `frozen` is the rest (the base,
  the policy's own arrays), else None."""
  minibatch, updates_per_step, optimizer = plan.update_plan(method)
  part = lora.TrainedPart(enabled=method.config.model.lora_rank > 0)  # as `loop.train` cuts it
  frozen = part.split(params)[1]  # `init_params` keeps the policy's arrays (grpo, online_rft: the policy itself)
  shapes = jax.eval_shape(lambda p, k: training.init_train_state(part.trained(method.init_params(p, k)), optimizer),
                          params, jax.random.PRNGKey(0))
  shardings = partitioning.state_shardings(placement.mesh, placement.rules, shapes)
  return updates_per_step, minibatch, optimizer, program_lib.abstract(shapes, shardings), shardings, frozen


def resident(config: config_lib.Config, model_config: models.ModelConfig, placement: placement_lib.Placement,
             reward: RewardModel | None = None) -> dict[str, Any]:
  """The abstract trees that stay on the device(s) through stage 2 of `loop.run`, by name: the train state, the
  frozen reference (`method.reference`, a copy of the start policy, whose own buffers the train state took:
  `Placement.train`) and the learned reward model. With LoRA: the train state (the adapters and their optimiser
  state) and the base ("base": the frozen part of the policy, and π_ref with β > 0: no copy)."""
  method, params, placement = _setup(config, model_config, placement, reward)
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
  method, params, placement = _setup(config, model_config, placement, reward)
  update = _train_state(method, params, placement)
  shapes = placed_shapes(params, update[3].params, placement)
  declared = method.step_programs(shapes)  # the forwards `collect` runs (Flow-GRPO: its planner's turns too)
  out = {} if "sampler" in declared else _rollout_sampler(method, shapes, placement)
  if reward is not None:
    out["reward"] = _reward_program(config, reward, shapes, placement)
  out.update(declared)
  out["update"] = _update_program(method, shapes, *update)
  held_out = config.task.num_test  # the held-out set has at most this many problems
  evaluations = method.eval_programs(shapes, held_out)
  return out | (_eval_samplers(method, shapes, placement, held_out) if evaluations is None else evaluations)


def placed_shapes(params, trained, placement: placement_lib.Placement) -> Shapes:
  """The `Shapes` of a run on `placement` whose policy's and trained params are the abstract `params` and
  `trained`: rows split like the batch, scalars replicated (without a mesh: unplaced)."""
  scalar = None if placement.mesh is None else partitioning.replicated(placement.mesh)
  return Shapes(policy=params, trained=trained,
                rows=lambda dtype, count, *shape: jax.ShapeDtypeStruct((count, *shape), dtype,
                                                                       sharding=placement.batch_sharding),
                key=jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=scalar),  # jax.random.PRNGKey's
                temperature=jax.ShapeDtypeStruct((), jnp.float32, sharding=scalar),
                scalar=lambda dtype: jax.ShapeDtypeStruct((), dtype, sharding=scalar),
                frozen_model=lambda model_config: _model_params(model_config, placement))


def _sampler(method, shapes: Shapes, placement: placement_lib.Placement, prompts: int, samples: int, **options):
  """(the program, its arguments, the most trips of its decode loop) of the rollouts' sampler for `prompts`
  (padded to a multiple of the data shards by the engine) x `samples`: the engine's (`rollout_engine.jit_generate`,
  its caps a sixth argument; at most ceil(N / slots) completions a slot, each up to T tokens) or the static
  sampler's (`sampling.jit_sample`)."""
  cfg = method.config
  p, t = cfg.task.max_prompt_len, cfg.rollout.max_new_tokens
  mesh, rules, rows = placement.mesh, placement.rules, shapes.rows
  if cfg.rollout.sampler != "engine":
    return (sampling.jit_sample(method.model_config, (prompts, p), mesh=mesh, rules=rules, num_samples=samples,
                                **options),
            (shapes.policy, rows(jnp.int32, prompts, p), rows(jnp.bool_, prompts, p), shapes.key, shapes.temperature),
            t - 1)
  prompts += -prompts % placement.data_parallel
  fn = rollout_engine.jit_generate(method.model_config, (prompts, p), mesh=mesh, rules=rules, num_samples=samples,
                                   **options)
  # one loop of phases around the steps: at most every step in one phase (one wave: t steps)
  trips = (1, -(-prompts * samples // options["num_slots"]) * t)
  return fn, (shapes.policy, rows(jnp.int32, prompts, p), rows(jnp.bool_, prompts, p), shapes.key, shapes.temperature,
              rows(jnp.int32, prompts * samples)), trips


def _rollout_sampler(method, shapes: Shapes, placement: placement_lib.Placement) -> dict[str, Program]:
  """The rollouts' sampler (`Rollouts.sampler_options`): each step's (`samples_each_step`), or an offline method's
  data, sampled once before the first step (`samples_offline`: `offline.sample_offline`, --offline_prompts / B
  calls in `prepare`)."""
  cfg, rollout = method.config, method.config.rollout
  b, g, t = rollout.batch_size, rollout.group_size, rollout.max_new_tokens
  options = method.rollouts.sampler_options()
  fn, args, trips = _sampler(method, shapes, placement, b, g, **options)
  if method.samples_offline:
    calls = -(-min(cfg.algorithm.offline_prompts, cfg.task.num_train) // b)
    return {"sampler": Program(fn, args, f"offline data: {b} prompts x {g} samples of up to {t} tokens a call, "
                               f"{calls} calls before the first step", per_step=0, per_run=calls, loop_trips=trips)}
  if not method.samples_each_step:
    return {}
  rounds = rollout.dynamic_sampling_max_rounds if rollout.dynamic_sampling else 1
  return {"sampler": Program(fn, args,
                             f"rollouts: {b} prompts x {g} samples of up to {t} tokens"
                             + (f", {options['prompt_chunk']} prompts at a time" if options.get("prompt_chunk")
                                else "")
                             + (f", {options['num_slots']} decode slots (continuous batching)"
                                if rollout.sampler == "engine" else "")
                             + (f" (1 to {rounds} rounds a step, --dynamic_sampling)" if rounds > 1 else ""),
                             per_step=1, loop_trips=trips)}


def _reward_program(config: config_lib.Config, reward: RewardModel, shapes: Shapes,
                    placement: placement_lib.Placement) -> Program:
  """The learned reward's scorer over the B·G rows of P + T tokens, as `LearnedReward` calls it."""
  n, length = config.rows_per_step, config.task.max_prompt_len + config.rollout.max_new_tokens
  rows, reward_params = shapes.rows, _reward_params(reward, placement)
  chunk = learned_reward.scorer_options(placement, reward.config, n, length)
  at_a_time = f"{chunk['rows_per_chunk'] or n} at a time"
  if reward.kind == "orm" and config.reward_model.supervision == "outcome":
    return Program(learned_reward.OUTCOME_SCORES,
                   (reward_params, reward.config, rows(jnp.int32, n, length), rows(jnp.bool_, n, length)),
                   f"the outcome reward model's score of the {n} rows, {at_a_time}", per_step=1, kwargs=chunk)
  k = config.reward_model.prm_max_steps
  return Program(learned_reward.STEP_SCORES,
                 (reward_params, reward.config, rows(jnp.int32, n, length), rows(jnp.bool_, n, length),
                  rows(jnp.int32, n, k), rows(jnp.bool_, n, k)),
                 f"the {reward.kind} reward model's scores at up to {k} step ends of the {n} rows, {at_a_time}",
                 per_step=1, kwargs=chunk)


def _update_program(method, shapes: Shapes, per_step: int, minibatch: int, optimizer, state, state_shardings,
                    frozen) -> Program:
  """The runner's update (`Placement.train`'s step) over a minibatch's `update_rows`; with LoRA the frozen base a
  third, not donated, argument."""
  bucketed = method.bucketed_update()
  micro = method.update_micro_batches(minibatch)
  step = method.rollouts.placement.train_step(state_shardings, optimizer, method.objective(), micro,
                                              frozen=frozen, bucketed=bucketed,
                                              skip_empty=method.skips_empty_micro_batches())
  m = method.update_rows(minibatch)
  batch = method.abstract_batch(lambda dtype, *shape: shapes.rows(dtype, m, *shape))
  return Program(step.program(), (state, batch) if frozen is None else (state, batch, frozen),
                 f"{method.name}: one optimiser step over {m} rows in "
                 + (f"{micro} micro-batches" + (" (those without a loss token skipped)"
                                                 if method.skips_empty_micro_batches() else "") if bucketed is None else
                    f"{bucketed.buckets.num_micro_batches} length-sorted micro-batches at widths "
                    f"{bucketed.buckets.widths}")
                 + ("" if frozen is None else " (LoRA: the adapters; the base frozen)"),
                 per_step=per_step, resident_args=(0,) if frozen is None else (0, 2))


def _eval_samplers(method, shapes: Shapes, placement: placement_lib.Placement, held_out: int) -> dict[str, Program]:
  """Held-out evaluation's samplers (`evaluation.generate_options`): greedy, and k samples with --eval_samples=k."""
  cfg = method.config
  p, t = cfg.task.max_prompt_len, cfg.rollout.max_new_tokens
  options = evaluation.generate_options(cfg, held_out, placement)
  e = options["batch_size"]
  calls = -(-held_out // e)
  engine = cfg.rollout.sampler == "engine"
  slots = lambda k: dict(num_slots=placement.engine_slots(method.model_config, e, p, k, t, cfg.rollout.num_slots)) \
      if engine else {}
  fn, args, trips = _sampler(method, shapes, placement, e, 1, max_new_tokens=t, greedy=True, **slots(1))
  out = {"eval_greedy": Program(fn, args, f"evaluation: greedy completions of {e} held-out prompts a call",
                                per_step=0, per_eval=calls, loop_trips=trips)}
  if cfg.eval.eval_samples:
    k = cfg.eval.eval_samples
    fn, args, trips = _sampler(method, shapes, placement, e, k, max_new_tokens=t, **slots(k))
    out["eval_samples"] = Program(fn, args, f"evaluation: {k} samples of {e} held-out prompts a call (maj@k, "
                                  "pass@k)", per_step=0, per_eval=calls, loop_trips=trips)
  return out
