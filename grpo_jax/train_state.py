"""`TrainState`: what the optimiser updates (step, params, optimiser state), a pytree checkpointed whole.

It sits below placement (`partitioning`) and training so both can build one.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

Params = Any


class TrainState(NamedTuple):
  """What the optimiser updates: a pytree, checkpointed whole."""
  step: jax.Array
  params: Params
  opt_state: optax.OptState


def init_train_state(params: Params, optimizer: optax.GradientTransformation) -> TrainState:
  """Step 0, `params`, and `optimizer`'s initial state for them."""
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params))
