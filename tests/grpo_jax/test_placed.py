"""placed.Placed: the call places its arguments, `.program` is the jitted program that call runs."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax import logprobs, models, placed, training
from grpo_jax.training import update as update_lib


def test_the_program_is_what_the_call_runs():
  config = models.tiny_config(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                              num_key_value_heads=1)
  params = models.init_params(config, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 6), 0, config.vocab_size)
  mask = jnp.ones((2, 6), bool)
  fn = logprobs.jit_token_logprobs(config, chunk_size=4)
  assert isinstance(fn, placed.Placed)
  compiled = fn.program(tokens.shape).lower(params, tokens, mask).compile()
  np.testing.assert_array_equal(compiled(params, tokens, mask), fn(params, tokens, mask))
  # An update step: its program, lowered for the state and a batch, is the step the call runs.
  optimizer = optax.sgd(0.1)
  objective = update_lib.bind(training.sft_objective, config=config, chunk_size=4)
  step = training.make_train_step(objective, optimizer, donate=False)
  batch = training.Batch(tokens, mask, mask, *(jnp.zeros((2, 6)),) * 3)
  state = training.init_train_state(params, optimizer)
  (got, _), (want, _) = step(state, batch), step.program().lower(state, batch).compile()(state, batch)
  jax.tree.map(np.testing.assert_array_equal, got.params, want.params)
  assert placed.Placed(lambda *a: sum(a), lambda: "program")(1, 2, 3) == 6
