"""A method's declared programs (experiments/methods/program.py, `Method.step_programs`) are built from the very
callables its `collect` calls, so `trainer.programs` lists what runs, not a copy of the method's decisions."""

import jax
import jax.numpy as jnp
import pytest

from experiments import methods
from experiments.methods import program as program_lib
from experiments.runner import config as config_lib
from experiments.runner import placement as placement_lib
from experiments.runner import policy
from grpo_jax import models
from grpo_jax.models import lora


def _declared(algo: str, **flags):
  """`(method, its step programs)` for the tiny policy on one device, abstract arguments as `Shapes`."""
  config = config_lib.Config().replace(algo=algo, tiny_layers=1, batch_size=2, group_size=2, max_new_tokens=6,
                                       **flags)
  base = policy.model_config(config.model)
  init = lambda k: models.init_params(base, k)  # noqa: E731
  model_config = base
  if config.model.lora_rank:  # as `loop.run` adapts the policy
    model_config = lora.lora_config(base, rank=config.model.lora_rank, alpha=config.model.lora_alpha,
                                    targets=config_lib.lora_targets(config.model.lora_targets))
    init = lambda k: lora.add_adapters(models.init_params(base, k), model_config, k)  # noqa: E731
  rollouts = methods.Rollouts(config, model_config, None, None, placement_lib.Placement())
  method = methods.METHODS[algo](config, model_config, None, rollouts, None)
  params = jax.eval_shape(init, jax.random.key(0))
  trained = jax.eval_shape(lambda p, k: method.init_params(p, k), params, jax.random.PRNGKey(0))
  shapes = program_lib.Shapes(policy=params, trained=trained,
                              rows=lambda dtype, count, *shape: jax.ShapeDtypeStruct((count, *shape), dtype),
                              key=jax.ShapeDtypeStruct((2,), jnp.uint32),
                              temperature=jax.ShapeDtypeStruct((), jnp.float32),
                              scalar=lambda dtype: jax.ShapeDtypeStruct((), dtype),
                              frozen_model=lambda c: jax.eval_shape(lambda k: models.init_params(c, k),
                                                                    jax.random.key(0)))
  return method, method.step_programs(shapes)


@pytest.mark.parametrize("flags,names,calls", [
    (dict(), ["logprobs", "batch"], 1),  # on-policy: π_ref only
    (dict(temperature=0.7, recompute_old_logprobs=True), ["logprobs", "batch"], 2),  # π_old and π_ref, one program
    (dict(beta=0.0), ["batch"], 0),  # on-policy, no KL: no forward
])
def test_grpo_declares_the_forward_its_collect_calls(flags, names, calls):
  method, declared = _declared("grpo", **flags)
  assert list(declared) == names
  if "logprobs" in names:
    program = declared["logprobs"]
    # the grouped forward `collect` calls (`group_logprobs`), at B·G rows of P + T tokens
    assert program.jitted is method.group_logprobs.program(program.args[1].shape, program.args[0])
    assert program.args[1].shape == (4, method.config.task.max_prompt_len + 6) and program.per_step == calls
    assert len(method.scoring_forwards()) == calls


def test_ppo_declares_its_value_forward_over_the_train_states_value_model():
  method, declared = _declared("ppo", temperature=0.7)
  assert list(declared) == ["logprobs", "values", "batch"] and declared["logprobs"].per_step == 2
  assert declared["values"].jitted is method.values.program()
  value = declared["values"].args[0]
  assert jax.tree.structure(value) == jax.tree.structure(method.init_params(
      models.init_params(method.model_config, jax.random.key(0)), jax.random.PRNGKey(0))["value"])


def test_the_lora_forwards_read_the_base_for_pi_ref():
  method, declared = _declared("grpo", temperature=0.7, recompute_old_logprobs=True, lora_rank=2, lora_alpha=4.0)
  assert list(declared) == ["old_logprobs", "logprobs", "batch"]
  declared.pop("batch")
  old, ref = declared["old_logprobs"].args[0], declared["logprobs"].args[0]
  assert jax.tree.structure(ref) == jax.tree.structure(lora.disabled(old)) != jax.tree.structure(old)
  for name in declared:  # the one grouped forward `collect` calls, for each argument structure
    program = declared[name]
    assert program.jitted is method.group_logprobs.program(program.args[1].shape, program.args[0])


@pytest.mark.parametrize("algo,flags,old,ref", [
    ("grpo", dict(), False, True),  # on-policy: π_old not read
    ("grpo", dict(beta=0.0, advantage_estimator="rloo"), False, False),
    ("grpo", dict(temperature=0.7, recompute_old_logprobs=True), True, True),
    ("distill", dict(temperature=0.7, recompute_old_logprobs=True, num_epochs=2), True, True),  # the teacher's
])
def test_the_batch_program_is_the_one_collect_calls(algo, flags, old, ref, tmp_path):
  # The step's batch is one program (the method's own `step_batch`), after the forwards, its arguments those
  # `collect` passes: π_old / π_ref log-probs only where they are read, no resident tree; it traces at B·G rows.
  if algo == "distill":
    from tests.experiments.methods.test_distill import _teacher  # pylint: disable=import-outside-toplevel
    flags = dict(flags, teacher_checkpoint=str(_teacher(tmp_path / "teacher", hidden_size=64)))
  method, declared = _declared(algo, **flags)
  assert list(declared)[-1] == "batch"
  program = declared["batch"]
  assert program.jitted is method.step_batch and program.resident_args == () and program.per_step == 1
  logps = [a for a in program.args[1:] if getattr(a, "shape", None) == (4, 6)]
  assert len(logps) == old + ref
  assert program.args[0].tokens.shape == (4, 6) and program.args[0].prompt_tokens.shape[0] == 4
  out = jax.eval_shape(program.jitted, *program.args)
  batch = out[0] if algo == "grpo" else out
  assert batch.tokens.shape == batch.advantages.shape == (4, method.config.task.max_prompt_len + 6)
