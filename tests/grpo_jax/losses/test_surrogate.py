import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import losses

# Four tokens: (A, ρ) = (1, 1.5), (1, 0.5), (-1, 1.5), (-1, 0.5).
RATIOS = jnp.array([[1.5, 0.5, 1.5, 0.5]])
ADV = jnp.array([[1.0, 1.0, -1.0, -1.0]])
OLD = jnp.array([[-1.0, -2.0, -0.5, -3.0]])
LOGP = OLD + jnp.log(RATIOS)
MASK = jnp.ones((1, 4), bool)


def test_hand_computed(variant):
  loss = variant(losses.clipped_surrogate, eps_low=0.2)(LOGP, OLD, ADV, MASK)
  np.testing.assert_allclose(loss, [[-1.2, -0.5, 1.5, 0.8]], rtol=1e-6)
  higher = variant(losses.clipped_surrogate, eps_low=0.2, eps_high=0.28)(LOGP, OLD, ADV, MASK)
  np.testing.assert_allclose(higher, [[-1.28, -0.5, 1.5, 0.8]], rtol=1e-6)


def test_gradient_zero_where_clip_active():
  grad = jax.grad(lambda lp: jnp.sum(losses.clipped_surrogate(lp, OLD, ADV, MASK, 0.2)))(LOGP)
  # d(-Aρ)/dlogp = -Aρ where unclipped; 0 where the clip is active (tokens 0 and 3).
  np.testing.assert_allclose(grad, [[0.0, -0.5, 1.5, 0.0]], rtol=1e-6)


def test_dual_clip():
  logp = jnp.log(jnp.array([[5.0, 2.0]]))
  old = jnp.zeros((1, 2))
  adv = jnp.array([[-1.0, -1.0]])
  loss = losses.clipped_surrogate(logp, old, adv, jnp.ones((1, 2)), 0.2, dual_clip=3.0)
  np.testing.assert_allclose(loss, [[3.0, 2.0]], rtol=1e-6)  # -cA caps the first token
  grad = jax.grad(lambda lp: jnp.sum(losses.clipped_surrogate(lp, old, adv, jnp.ones((1, 2)), 0.2, dual_clip=3.0)))(logp)
  np.testing.assert_allclose(grad, [[0.0, 2.0]], rtol=1e-6)


def test_per_sequence_advantages_broadcast_and_mask():
  mask = jnp.array([[1, 1, 1, 0]])
  per_seq = losses.clipped_surrogate(LOGP, OLD, jnp.array([2.0]), mask, 0.2)
  np.testing.assert_allclose(per_seq, [[-2.4, -1.0, -2.4, 0.0]], rtol=1e-6)


def test_sequence_importance_is_gspo():
  logp = jnp.array([[jnp.log(2.0), 0.0, 5.0]])
  old = jnp.zeros((1, 3))
  mask = jnp.array([[1, 1, 0]])
  # s = exp(mean(log 2, 0)) = sqrt(2) on both real tokens.
  loss = losses.clipped_surrogate(logp, old, jnp.array([1.0]), mask, 0.5, importance="sequence")
  np.testing.assert_allclose(loss, [[-np.sqrt(2), -np.sqrt(2), 0.0]], rtol=1e-6)
  clipped = losses.clipped_surrogate(logp, old, jnp.array([1.0]), mask, 0.2, importance="sequence")
  np.testing.assert_allclose(clipped, [[-1.2, -1.2, 0.0]], rtol=1e-6)

  def token_mean(lp):
    return losses.aggregate(losses.clipped_surrogate(lp, old, jnp.array([1.0]), mask, 0.5, importance="sequence"), mask)

  def gspo(lp):  # the sequence objective written directly
    return -jnp.exp(jnp.sum((lp - old) * mask) / 2)

  np.testing.assert_allclose(jax.grad(token_mean)(logp), jax.grad(gspo)(logp), rtol=1e-6)
  with pytest.raises(ValueError, match="importance level 'turn'"):
    losses.clipped_surrogate(logp, old, jnp.array([1.0]), mask, 0.2, importance="turn")


def test_clip_fractions():
  stats = losses.clip_fractions(LOGP, OLD, ADV, MASK, 0.2)
  np.testing.assert_allclose(stats["clip_frac_low"], 0.25)
  np.testing.assert_allclose(stats["clip_frac_high"], 0.25)
  np.testing.assert_allclose(stats["clip_frac"], 0.5)
  np.testing.assert_allclose(stats["ratio_mean"], 1.0, rtol=1e-6)
  np.testing.assert_allclose(stats["ratio_max"], 1.5, rtol=1e-6)


def test_clip_fractions_of_an_all_padding_batch_are_finite():
  stats = losses.clip_fractions(LOGP, OLD, ADV, jnp.zeros((1, 4), bool), 0.2)
  for name, value in stats.items():
    assert jnp.isfinite(value), name
  np.testing.assert_allclose(stats["ratio_min"], 1.0)
  np.testing.assert_allclose(stats["clip_frac"], 0.0)


def test_vmap_and_bfloat16():
  stacked = jnp.stack([LOGP, LOGP + 0.1])
  out = jax.vmap(lambda lp: losses.clipped_surrogate(lp, OLD, ADV, MASK, 0.2))(stacked)
  np.testing.assert_allclose(out[1], losses.clipped_surrogate(LOGP + 0.1, OLD, ADV, MASK, 0.2), rtol=1e-6)
  bf16 = losses.clipped_surrogate(LOGP.astype(jnp.bfloat16), OLD.astype(jnp.bfloat16), ADV, MASK, 0.2)
  assert bf16.dtype == jnp.float32
