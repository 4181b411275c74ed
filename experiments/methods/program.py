"""The programs a method runs, as ahead-of-time compilation sees them.

A `Program` is one jitted program (the very callable's, `placed.Placed.program(...)`, that `collect` or the loop
calls) with abstract arguments; `Shapes` holds the abstract trees and rows those arguments are made of, placed as
the runner places them. `Method.step_programs(shapes)` declares a method's programs from its own callables, so that
`trainer.programs` lists them without re-deriving what the method decides (which forwards run, over which rows and
params, how often).
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from grpo_jax import sampling


@dataclasses.dataclass(frozen=True)
class Program:
  """One jitted program of a run and its abstract arguments (`jax.ShapeDtypeStruct`s carrying shardings; static
  arguments as they are): `jitted.trace(*args, **kwargs)`."""
  jitted: Any  # jax.jit-wrapped
  args: tuple
  uses: str  # what the runner runs it for
  per_step: int  # calls per stage-2 step (0: not a step's program, e.g. evaluation)
  per_eval: int = 0  # calls per evaluation
  per_run: int = 0  # calls once per run, before the steps (an offline method's sampling of its data)
  # Trip count of its while loops (the sampler: its decode steps); a tuple, of nested ones (outermost first).
  loop_trips: int | tuple[int, ...] = 1
  kwargs: dict = dataclasses.field(default_factory=dict)  # static keyword arguments
  resident_args: tuple = (0,)  # the arguments that are (parts of) resident trees, not the program's own


@dataclasses.dataclass(frozen=True)
class Shapes:
  """The abstract arguments of a run's programs, placed as the runner places them."""
  policy: Any  # the policy's params (with LoRA: base + adapters)
  trained: Any  # the train state's params (`Method.init_params`' tree: PPO's {"policy", "value"})
  rows: Callable[..., Any]  # rows(dtype, count, *shape): a [count, *shape] array split like the batch
  key: Any  # a `jax.random.PRNGKey`
  temperature: Any  # a float32 scalar
  scalar: Callable[[Any], Any]  # scalar(dtype): a replicated scalar
  frozen_model: Callable[[Any], Any]  # frozen_model(model_config): a frozen model's params (a teacher), placed


def samples(shapes: Shapes, rows: int, prompt_len: int, width: int) -> sampling.SampleOutput:
  """The sampler's output for `rows` completions of up to `width` tokens after `prompt_len`-token prompts, split
  like the batch (as a step's `collect` holds it, trimmed to the widest)."""
  return sampling.SampleOutput(
      prompt_tokens=shapes.rows(jnp.int32, rows, prompt_len), prompt_mask=shapes.rows(jnp.bool_, rows, prompt_len),
      tokens=shapes.rows(jnp.int32, rows, width), logprobs=shapes.rows(jnp.float32, rows, width),
      mask=shapes.rows(jnp.bool_, rows, width), lengths=shapes.rows(jnp.int32, rows),
      truncated=shapes.rows(jnp.bool_, rows))


def abstract(tree, shardings=None):
  """`jax.ShapeDtypeStruct`s of a tree of arrays (or shape structs) placed by `shardings`, a tree of the same
  structure or None: unplaced, as one device's uncommitted arrays are (a program jitted with `in_shardings` is
  compiled for its arguments placed by them, one without for unplaced ones: another sharding is another program)."""
  struct = lambda x, sh=None: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh,
                                                   weak_type=getattr(getattr(x, "aval", x), "weak_type", False))
  return jax.tree.map(struct, tree) if shardings is None else jax.tree.map(struct, tree, shardings)
