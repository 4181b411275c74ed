import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import losses


def test_hand_computed(variant):
  # Δ⁺ = -1 - (-2) = 1, Δ⁻ = -3 - (-2) = -1, β = 0.5: margin 1, loss -log σ(1).
  loss, metrics = variant(losses.dpo_loss, beta=0.5)(
      jnp.array([-1.0]), jnp.array([-3.0]), jnp.array([-2.0]), jnp.array([-2.0]))
  np.testing.assert_allclose(loss, -np.log(1 / (1 + np.exp(-1.0))), rtol=1e-6)
  np.testing.assert_allclose(metrics["reward_margin"], 1.0)
  np.testing.assert_allclose(metrics["accuracy"], 1.0)
  np.testing.assert_allclose(metrics["chosen_logratio"], 1.0)
  np.testing.assert_allclose(metrics["rejected_logratio"], -1.0)


def test_equal_policy_and_reference_gives_log_two():
  x = jax.random.normal(jax.random.PRNGKey(0), (5,))
  loss, metrics = losses.dpo_loss(x, x + 1, x, x + 1)
  np.testing.assert_allclose(loss, np.log(2.0), rtol=1e-6)
  np.testing.assert_allclose(metrics["accuracy"], 0.0)
