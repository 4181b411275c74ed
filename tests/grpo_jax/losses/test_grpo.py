import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import losses


def _batch(key, batch=4, length=6):
  k1, k2, k3 = jax.random.split(key, 3)
  logp = -jax.random.uniform(k1, (batch, length), minval=0.1, maxval=3.0)
  ref_logp = logp + 0.3 * jax.random.normal(k2, (batch, length))
  adv = jax.random.normal(k3, (batch,))
  lengths = jnp.array([6, 3, 1, 5])[:batch]
  mask = jnp.arange(length)[None] < lengths[:, None]
  return logp, ref_logp, adv, mask


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("kl", ["k3", "k1"])
def test_gradient_at_ratio_one_is_grpo_coefficient(aggregation, kl):
  logp, ref_logp, adv, mask = _batch(jax.random.PRNGKey(0))
  beta = 0.04

  def loss_fn(lp):
    return losses.grpo_loss(lp, jax.lax.stop_gradient(lp), ref_logp, adv, mask, epsilon=0.2, beta=beta,
                            kl=kl, aggregation=aggregation)[0]

  grad = jax.grad(loss_fn)(logp)
  weights = losses.aggregation_weights(mask, aggregation)
  if kl == "k3":  # DeepSeekMath §5.2.1: GC = Â + β(π_ref/π − 1)
    coefficient = losses.grpo_coefficient(adv, logp, ref_logp, beta)
  else:  # ∂k1/∂logp = 1
    coefficient = adv[:, None] - beta
  np.testing.assert_allclose(grad, -weights * coefficient * mask, atol=1e-6)


def test_hand_computed_loss_and_metrics(variant):
  # One sequence, two tokens, ratios (1.5, 1.0), A = 1, β = 0.5, k3 with π_ref/π = (1, 0.5).
  old = jnp.array([[-1.0, -1.0]])
  logp = old + jnp.log(jnp.array([[1.5, 1.0]]))
  ref = jnp.array([[logp[0, 0], logp[0, 1] + jnp.log(0.5)]])
  loss, metrics = variant(losses.grpo_loss, epsilon=0.2, beta=0.5)(logp, old, ref, jnp.array([1.0]), jnp.ones((1, 2)))
  k3 = 0.5 + np.log(2) - 1
  pg = -(1.2 + 1.0) / 2
  np.testing.assert_allclose(metrics["pg_loss"], pg, rtol=1e-6)
  np.testing.assert_allclose(metrics["kl"], k3 / 2, rtol=1e-6)
  np.testing.assert_allclose(metrics["kl_loss"], 0.5 * k3 / 2, rtol=1e-6)
  np.testing.assert_allclose(loss, pg + 0.5 * k3 / 2, rtol=1e-6)
  np.testing.assert_allclose(metrics["clip_frac_high"], 0.5)
  np.testing.assert_allclose(metrics["clip_frac_low"], 0.0)


def test_per_token_advantages_equal_broadcast_per_sequence():
  logp, ref_logp, adv, mask = _batch(jax.random.PRNGKey(1))
  old = logp - 0.1
  a, _ = losses.grpo_loss(logp, old, ref_logp, adv, mask, epsilon=0.2, beta=0.1)
  b, _ = losses.grpo_loss(logp, old, ref_logp, jnp.broadcast_to(adv[:, None], logp.shape), mask, epsilon=0.2, beta=0.1)
  np.testing.assert_allclose(a, b, rtol=1e-6)


def test_no_reference_means_no_kl_term():
  logp, ref_logp, adv, mask = _batch(jax.random.PRNGKey(2))
  with_ref, _ = losses.grpo_loss(logp, logp, ref_logp, adv, mask, epsilon=0.2, beta=0.0)
  without, metrics = losses.grpo_loss(logp, logp, None, adv, mask, epsilon=0.2, beta=0.04)
  np.testing.assert_allclose(with_ref, without, rtol=1e-6)
  assert float(metrics["kl"]) == 0.0


def test_bfloat16_and_vmap():
  logp, ref_logp, adv, mask = _batch(jax.random.PRNGKey(3))
  f32, _ = losses.grpo_loss(logp, logp - 0.05, ref_logp, adv, mask, epsilon=0.2, beta=0.04)
  bf16, _ = losses.grpo_loss(logp.astype(jnp.bfloat16), (logp - 0.05).astype(jnp.bfloat16),
                             ref_logp.astype(jnp.bfloat16), adv, mask, epsilon=0.2, beta=0.04)
  assert bf16.dtype == jnp.float32
  np.testing.assert_allclose(bf16, f32, atol=2e-2)
  stacked = jnp.stack([logp, logp + 0.1])
  out = jax.vmap(lambda lp: losses.grpo_loss(lp, logp, ref_logp, adv, mask, epsilon=0.2, beta=0.04)[0])(stacked)
  np.testing.assert_allclose(out[1], losses.grpo_loss(logp + 0.1, logp, ref_logp, adv, mask, epsilon=0.2, beta=0.04)[0],
                             rtol=1e-6)


def test_non_finite_values_at_padded_positions_do_not_leak():
  logp, ref_logp, adv, mask = _batch(jax.random.PRNGKey(4))
  poisoned = jnp.where(mask, logp, -jnp.inf)
  poisoned_ref = jnp.where(mask, ref_logp, 100.0)  # expm1(100 - logp) would overflow
  clean, _ = losses.grpo_loss(logp, logp - 0.1, ref_logp, adv, mask, epsilon=0.2, beta=0.04)
  loss, metrics = losses.grpo_loss(poisoned, jnp.where(mask, logp - 0.1, 0.0), poisoned_ref, adv, mask,
                                   epsilon=0.2, beta=0.04)
  np.testing.assert_allclose(loss, clean, rtol=1e-6)
  assert all(bool(jnp.isfinite(v)) for v in metrics.values())
  grad = jax.grad(lambda lp: losses.grpo_loss(lp, logp - 0.1, poisoned_ref, adv, mask, epsilon=0.2, beta=0.04)[0])(
      poisoned)
  assert bool(jnp.all(jnp.isfinite(grad)))
  np.testing.assert_array_equal(jnp.where(mask, 0.0, grad), 0.0)
  coefficient = losses.grpo_coefficient(adv, poisoned, poisoned_ref, 0.04)
  grad = jax.grad(lambda lp: losses.paradigm_loss(lp, coefficient, mask))(poisoned)
  assert bool(jnp.all(jnp.isfinite(grad)))


@pytest.mark.parametrize("policy_loss", ["cispo", "sapo"])
def test_policy_losses_share_the_clips_gradient_on_policy(policy_loss):
  logp, ref_logp, adv, mask = _batch(jax.random.PRNGKey(5))

  def loss_fn(name):
    return lambda lp: losses.grpo_loss(lp, jax.lax.stop_gradient(lp), ref_logp, adv, mask, epsilon=0.2, beta=0.04,
                                       policy_loss=name)[0]

  np.testing.assert_allclose(jax.grad(loss_fn(policy_loss))(logp), jax.grad(loss_fn("clip"))(logp), atol=1e-7)


def test_cispo_and_sapo_metrics():
  logp, ref_logp, adv, mask = _batch(jax.random.PRNGKey(6))
  old = logp + 0.5 * jax.random.normal(jax.random.PRNGKey(7), logp.shape)
  _, cispo = losses.grpo_loss(logp, old, ref_logp, adv, mask, epsilon=0.2, epsilon_high=0.5, beta=0.0,
                              policy_loss="cispo")
  ratio = jnp.exp(logp - old)
  np.testing.assert_allclose(cispo["clip_frac_high"], losses.masked_mean(ratio > 1.5, mask), rtol=1e-6)
  assert float(cispo["clip_frac_low"]) == 0.0 and float(cispo["clip_frac_high"]) > 0
  _, sapo = losses.grpo_loss(logp, old, ref_logp, adv, mask, epsilon=0.2, beta=0.0, policy_loss="sapo")
  assert "clip_frac" not in sapo and 0 < float(sapo["sapo_gradient_scale"]) < 1
  with pytest.raises(ValueError, match="policy loss 'ppo' is unknown"):
    losses.grpo_loss(logp, old, ref_logp, adv, mask, epsilon=0.2, beta=0.0, policy_loss="ppo")


def test_entropy_bonus_and_top_entropy_mask():
  logp, ref_logp, adv, mask = _batch(jax.random.PRNGKey(8))
  entropy = jax.random.uniform(jax.random.PRNGKey(9), logp.shape, maxval=2.0)
  kw = dict(epsilon=0.2, beta=0.04, aggregation="token-mean")
  base, _ = losses.grpo_loss(logp, logp - 0.1, ref_logp, adv, mask, **kw)
  bonus, metrics = losses.grpo_loss(logp, logp - 0.1, ref_logp, adv, mask, entropy=entropy, entropy_coef=0.01, **kw)
  np.testing.assert_allclose(bonus, base - 0.01 * losses.masked_mean(entropy, mask), rtol=1e-6)
  np.testing.assert_allclose(metrics["entropy_loss"], bonus - base, rtol=1e-5)

  def loss_fn(lp, beta, rho):
    return losses.grpo_loss(lp, jax.lax.stop_gradient(lp), ref_logp, adv, mask, epsilon=0.2, beta=beta,
                            entropy=entropy, top_entropy_quantile=rho)[0]

  keep = losses.top_entropy_mask(entropy, mask, 0.2)
  pg_grad = jax.grad(loss_fn)(logp, 0.0, 0.2)
  np.testing.assert_allclose(pg_grad, jnp.where(keep, jax.grad(loss_fn)(logp, 0.0, 1.0), 0.0), atol=1e-7)
  # the KL term keeps every token
  kl_grad = jax.grad(loss_fn)(logp, 0.04, 0.2) - pg_grad
  np.testing.assert_allclose(kl_grad, jax.grad(loss_fn)(logp, 0.04, 1.0) - jax.grad(loss_fn)(logp, 0.0, 1.0),
                             atol=1e-7)
  _, metrics = losses.grpo_loss(logp, logp, ref_logp, adv, mask, entropy=entropy, top_entropy_quantile=0.2, **kw)
  np.testing.assert_allclose(metrics["entropy_mask_frac"], losses.masked_mean(keep, mask))
  with pytest.raises(ValueError, match="need the per-token `entropy`"):
    losses.grpo_loss(logp, logp, ref_logp, adv, mask, entropy_coef=0.01, **kw)
