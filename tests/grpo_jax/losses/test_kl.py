import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import losses


def test_estimators_hand_computed(variant):
  logp = jnp.log(jnp.array([[0.5, 0.2]]))
  ref_logp = jnp.log(jnp.array([[0.25, 0.2]]))
  # d = log(0.25 / 0.5) = -log 2 on the first token, 0 on the second.
  ln2 = np.log(2.0)
  np.testing.assert_allclose(variant(losses.kl_divergence, kind="k1")(logp, ref_logp), [[ln2, 0.0]], atol=1e-6)
  np.testing.assert_allclose(variant(losses.kl_divergence, kind="k2")(logp, ref_logp), [[ln2**2 / 2, 0.0]], atol=1e-6)
  np.testing.assert_allclose(variant(losses.kl_divergence, kind="k3")(logp, ref_logp), [[0.5 + ln2 - 1, 0.0]], atol=1e-6)
  masked = losses.kl_divergence(logp, ref_logp, "k3", mask=jnp.array([[0, 1]]))
  np.testing.assert_allclose(masked, [[0.0, 0.0]], atol=1e-7)
  with pytest.raises(ValueError, match="unknown estimator 'k4'"):
    losses.kl_divergence(logp, ref_logp, "k4")


def test_k3_nonnegative_and_gradient():
  key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
  logp = jax.random.normal(key_a, (64,)) * 3
  ref = jax.random.normal(key_b, (64,)) * 3
  assert jnp.all(losses.kl_divergence(logp, ref, "k3") >= 0)
  grad = jax.grad(lambda lp: jnp.sum(losses.kl_divergence(lp, ref, "k3")))(logp)
  np.testing.assert_allclose(grad, 1 - jnp.exp(ref - logp), rtol=1e-5)


def test_estimators_converge_to_exact_kl_under_samples_from_policy():
  key_p, key_q, key_s = jax.random.split(jax.random.PRNGKey(1), 3)
  logits_p = jax.random.normal(key_p, (10,))
  logits_q = logits_p + 0.5 * jax.random.normal(key_q, (10,))
  logp_all, logq_all = jax.nn.log_softmax(logits_p), jax.nn.log_softmax(logits_q)
  exact = float(jnp.sum(jnp.exp(logp_all) * (logp_all - logq_all)))
  tokens = jax.random.categorical(key_s, logits_p, shape=(200_000,))
  for kind in ("k1", "k3"):  # unbiased estimators
    est = losses.kl_divergence(logp_all[tokens], logq_all[tokens], kind)
    stderr = float(jnp.std(est)) / np.sqrt(tokens.size)
    assert abs(float(jnp.mean(est)) - exact) < 4 * stderr + 1e-6, kind
  np.testing.assert_allclose(losses.exact_kl(logits_p, logits_q), exact, rtol=1e-5)


@pytest.mark.parametrize("chunk_size", [8, 37, 1000])
def test_exact_kl_matches_naive(chunk_size):
  key_p, key_q = jax.random.split(jax.random.PRNGKey(2))
  logits = 3 * jax.random.normal(key_p, (2, 3, 37))
  ref = 3 * jax.random.normal(key_q, (2, 3, 37))
  mask = jnp.array([[1, 1, 0], [1, 0, 0]])
  naive = jnp.sum(jax.nn.softmax(logits) * (jax.nn.log_softmax(logits) - jax.nn.log_softmax(ref)), -1) * mask
  chunked = jax.jit(lambda a, b, m: losses.exact_kl(a, b, m, chunk_size=chunk_size))(logits, ref, mask)
  np.testing.assert_allclose(chunked, naive, rtol=1e-5, atol=1e-6)
  grad_naive = jax.grad(lambda a: jnp.sum(jnp.sum(
      jax.nn.softmax(a) * (jax.nn.log_softmax(a) - jax.nn.log_softmax(ref)), -1) * mask))(logits)
  grad_chunked = jax.grad(lambda a: jnp.sum(losses.exact_kl(a, ref, mask, chunk_size=chunk_size)))(logits)
  np.testing.assert_allclose(grad_chunked, grad_naive, atol=1e-5)


def test_exact_kl_bfloat16_inputs_and_vmap():
  key_p, key_q = jax.random.split(jax.random.PRNGKey(3))
  logits = jax.random.normal(key_p, (4, 5, 50))
  ref = jax.random.normal(key_q, (4, 5, 50))
  out = losses.exact_kl(logits.astype(jnp.bfloat16), ref.astype(jnp.bfloat16), chunk_size=16)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, losses.exact_kl(logits, ref), atol=2e-2)
  batched = jax.vmap(lambda a, b: losses.exact_kl(a, b, chunk_size=16))(logits, ref)
  np.testing.assert_allclose(batched, losses.exact_kl(logits, ref), atol=1e-5)


def test_exact_kl_with_filtered_minus_inf_logits():
  logits = jnp.array([[0.0, 1.0, -jnp.inf, 2.0]])
  ref = jnp.array([[0.5, 0.5, 0.5, 0.5]])
  out = losses.exact_kl(logits, ref, chunk_size=2)
  p = jax.nn.softmax(logits)
  expected = jnp.sum(jnp.where(p > 0, p * (jax.nn.log_softmax(logits) - jax.nn.log_softmax(ref)), 0.0))
  np.testing.assert_allclose(out, [expected], rtol=1e-5)
