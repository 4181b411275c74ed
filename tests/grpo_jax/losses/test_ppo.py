import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import losses


def test_kl_penalized_rewards_hand_computed(variant):
  scores = jnp.array([2.0, -1.0])
  ref = jnp.zeros((2, 3))
  logp = jnp.array([[0.1, 0.2, 0.3], [0.4, -0.2, 9.0]])
  mask = jnp.array([[1, 1, 1], [1, 1, 0]])
  rewards = variant(losses.kl_penalized_rewards, beta=0.5)(scores, logp, ref, mask)
  # eq. 2: -β log(π/π_ref) on every token, the score on the last completion token.
  np.testing.assert_allclose(rewards, [[-0.05, -0.1, -0.15 + 2.0], [-0.2, 0.1 - 1.0, 0.0]], rtol=1e-6)


def test_last_token_mask():
  mask = jnp.array([[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
  np.testing.assert_array_equal(losses.last_token_mask(mask), [[0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]])


def test_ppo_loss_is_grpo_without_kl():
  key = jax.random.PRNGKey(0)
  logp = -jax.random.uniform(key, (3, 5))
  old = logp + 0.5 * jax.random.normal(jax.random.PRNGKey(1), (3, 5))  # ratios inside and outside 1 ± ε
  adv = jax.random.normal(jax.random.PRNGKey(2), (3, 5))
  mask = jnp.arange(5)[None] < jnp.array([5, 2, 4])[:, None]
  ppo, _ = losses.ppo_loss(logp, old, adv, mask, epsilon=0.2)
  # DeepSeekMath eq. 1 written out in NumPy: -(1/N) Σ_i (1/|o_i|) Σ_t min(ρ A, clip(ρ, 1 − ε, 1 + ε) A).
  rho, a, m = np.exp(np.asarray(logp) - np.asarray(old)), np.asarray(adv), np.asarray(mask)
  surrogate = np.minimum(rho * a, np.clip(rho, 0.8, 1.2) * a)
  per_row = [surrogate[i][m[i]].mean() for i in range(3)]
  np.testing.assert_allclose(ppo, -np.mean(per_row), rtol=1e-5)
  assert abs(np.mean([(rho * a)[i][m[i]].mean() for i in range(3)]) + float(ppo)) > 0.02  # the clip is active
  grpo, _ = losses.grpo_loss(logp, old, None, adv, mask, epsilon=0.2, beta=0.0)
  np.testing.assert_allclose(ppo, grpo, rtol=1e-6)
  # At ρ = 1 the actor's gradient coefficient is A_t (DeepSeekMath Table 10): ∂loss/∂log π_t = −A_t / (N |o_i|).
  grad = jax.grad(lambda lp: losses.ppo_loss(lp, jax.lax.stop_gradient(lp), adv, mask, epsilon=0.2)[0])(logp)
  np.testing.assert_allclose(grad, -a * m / (3 * m.sum(1, keepdims=True)), atol=1e-6)


def test_ppo_pipeline_end_to_end():
  # Sequence score 1 on the last token, zero KL: with γ = λ = 1 and V = 0 every token's advantage is 1.
  scores = jnp.array([1.0])
  logp = jnp.zeros((1, 4))
  mask = jnp.array([[1, 1, 1, 0]])
  rewards = losses.kl_penalized_rewards(scores, logp, logp, mask, beta=0.1)
  adv, returns = losses.gae(rewards, jnp.zeros((1, 4)), mask, gamma=1.0, lam=1.0)
  np.testing.assert_allclose(adv, [[1, 1, 1, 0]])
  np.testing.assert_allclose(returns, [[1, 1, 1, 0]])
