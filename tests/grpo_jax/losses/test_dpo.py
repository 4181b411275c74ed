import jax
import jax.numpy as jnp
import numpy as np
import pytest

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


def test_nll_term_hand_computed():
  """Iterative RPO's term: α · mean(−log π_θ(o⁺) / |o⁺|) on top of DPO's; α = 0 is plain DPO."""
  args = (jnp.array([-4.0, -6.0]), jnp.array([-3.0, -9.0]), jnp.array([-5.0, -6.0]), jnp.array([-3.0, -8.0]))
  plain, _ = losses.dpo_loss(*args, beta=0.5)
  # margins 0.5·(1 − 0) = 0.5 and 0.5·(0 − (−1)) = 0.5; NLL per token: 4 / 2 = 2 and 6 / 3 = 2, mean 2.
  np.testing.assert_allclose(plain, -np.log(1 / (1 + np.exp(-0.5))), rtol=1e-6)
  loss, metrics = losses.dpo_loss(*args, beta=0.5, nll_coef=0.25, chosen_length=jnp.array([2.0, 3.0]))
  np.testing.assert_allclose(loss, plain + 0.25 * 2.0, rtol=1e-6)
  np.testing.assert_allclose(metrics["chosen_nll"], 2.0, rtol=1e-6)
  np.testing.assert_allclose(metrics["dpo_loss"], plain, rtol=1e-6)
  # The NLL's gradient on log π_θ(o⁺) is −α / |o⁺| / B on top of DPO's.
  grad = lambda a: jax.grad(lambda c: losses.dpo_loss(c, *args[1:], beta=0.5, nll_coef=a,
                                                      chosen_length=jnp.array([2.0, 3.0]))[0])(args[0])
  np.testing.assert_allclose(grad(0.25) - grad(0.0), [-0.25 / 2 / 2, -0.25 / 3 / 2], rtol=1e-6)
  with pytest.raises(ValueError, match="needs chosen_length"):
    losses.dpo_loss(*args, nll_coef=1.0)
