"""TrainState (grpo_jax/train_state.py): step 0, the params, the optimiser's initial state."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax import train_state
from grpo_jax import training


def test_init_train_state():
  params = {"w": jnp.array([1.0, -2.0])}
  state = train_state.init_train_state(params, optax.adam(0.1))
  assert state.step.dtype == jnp.int32 and int(state.step) == 0
  assert state.params is params
  mu = state.opt_state[0].mu["w"]
  np.testing.assert_array_equal(mu, [0.0, 0.0])


def test_is_a_pytree_and_reexported_by_training():
  state = train_state.init_train_state({"w": jnp.ones((3,))}, optax.sgd(0.1))
  doubled = jax.tree.map(lambda x: 2 * x, state)
  assert isinstance(doubled, training.TrainState)
  np.testing.assert_array_equal(doubled.params["w"], 2.0)
  assert training.init_train_state is train_state.init_train_state
