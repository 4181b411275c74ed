"""The rollout-trainer mismatch metrics and the truncated / masked importance weights, on hand-worked values."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import losses

# Two rows; Δ = log π_trainer − log π_sampler per token, chosen by hand. Row 0 has three tokens, row 1 two; the
# padding carries a NaN trainer log-prob (a masked position must not reach anything).
DELTA = np.array([[0.0, 0.5, 1.5, 0.0], [-1.0, 0.25, 0.0, 0.0]], np.float32)
MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
SAMPLER = np.array([[-0.7, -1.2, -2.3, 0.0], [-1.6, -0.2, 0.0, 0.0]], np.float32)
TRAINER = np.where(MASK, SAMPLER + DELTA, np.nan).astype(np.float32)
E = math.exp


def test_mismatch_metrics_hand_computed(variant):
  metrics = variant(losses.mismatch_metrics)(SAMPLER, TRAINER, MASK)
  # |Δ| over the five tokens: 0, 0.5, 1.5, 1, 0.25.
  assert metrics["mismatch_logp_diff_mean"] == pytest.approx(3.25 / 5, abs=1e-6)
  assert metrics["mismatch_logp_diff_max"] == pytest.approx(1.5, abs=1e-6)
  # k3 = e^Δ − Δ − 1 per token, of D_KL[π_sampler ‖ π_trainer]: 0, e^.5 − 1.5, e^1.5 − 2.5, e^−1, e^.25 − 1.25.
  k3 = (E(0.5) - 1.5 + E(1.5) - 2.5 + E(-1.0) + E(0.25) - 1.25) / 5
  assert metrics["mismatch_kl"] == pytest.approx(k3, rel=1e-5)
  # Ratios 1, 1.65, 4.48, 0.37, 1.28: two of five outside [0.5, 2].
  assert metrics["mismatch_ratio_outside"] == pytest.approx(0.4, abs=1e-7)
  wide = losses.mismatch_metrics(SAMPLER, TRAINER, MASK, ratio_low=0.3, ratio_high=5.0)
  assert wide["mismatch_ratio_outside"] == pytest.approx(0.0, abs=1e-7)


def test_mismatch_k3_is_kl_divergence_of_the_sampler_to_the_trainer():
  """The metric is `kl_divergence(sampler, trainer, "k3")` averaged over the tokens: D_KL[π_sampler ‖ π_trainer]."""
  k3 = losses.kl_divergence(jnp.asarray(SAMPLER), jnp.asarray(TRAINER), "k3", MASK)
  expected = float(jnp.sum(k3) / MASK.sum())
  assert losses.mismatch_metrics(SAMPLER, TRAINER, MASK)["mismatch_kl"] == pytest.approx(expected, rel=1e-6)


def test_identical_logprobs_give_zero_metrics_and_unit_weights(variant):
  trainer = np.where(MASK, SAMPLER, np.nan).astype(np.float32)
  metrics = variant(losses.mismatch_metrics)(SAMPLER, trainer, MASK)
  for name, value in metrics.items():
    assert float(value) == 0.0, name
  for correction in ("token_tis", "seq_tis", "token_mis", "seq_mis"):
    w = variant(losses.rollout_correction_weights, correction=correction)(SAMPLER, trainer, MASK)
    np.testing.assert_array_equal(w, MASK.astype(np.float32), err_msg=correction)


def test_token_tis_hand_computed(variant):
  w = variant(losses.truncated_is_weights, cap=2.0)(SAMPLER, TRAINER, MASK)
  np.testing.assert_allclose(w, [[1.0, E(0.5), 2.0, 0.0], [E(-1.0), E(0.25), 0.0, 0.0]], rtol=1e-5)


def test_seq_tis_hand_computed(variant):
  # Σ_t Δ_t: 2.0 in row 0 (ratio e² = 7.39, truncated), −0.75 in row 1 (ratio 0.47, kept).
  w = variant(losses.truncated_is_weights, cap=2.0, level="sequence")(SAMPLER, TRAINER, MASK)
  np.testing.assert_allclose(w, [[2.0, 2.0, 2.0, 0.0], [E(-0.75), E(-0.75), 0.0, 0.0]], rtol=1e-5)
  w = losses.truncated_is_weights(SAMPLER, TRAINER, MASK, cap=10.0, level="sequence")
  np.testing.assert_allclose(w[0, :3], [E(2.0)] * 3, rtol=1e-5)


def test_token_mis_hand_computed(variant):
  w = variant(losses.masked_is_weights, lower=0.5, upper=2.0)(SAMPLER, TRAINER, MASK)
  np.testing.assert_allclose(w, [[1.0, E(0.5), 0.0, 0.0], [0.0, E(0.25), 0.0, 0.0]], rtol=1e-5)
  one_sided = losses.masked_is_weights(SAMPLER, TRAINER, MASK, lower=0.0, upper=2.0)  # TRL's mask without C_min
  np.testing.assert_allclose(one_sided, [[1.0, E(0.5), 0.0, 0.0], [E(-1.0), E(0.25), 0.0, 0.0]], rtol=1e-5)


def test_seq_mis_hand_computed(variant):
  # Sequence ratios e² (outside [0.4, 2]: the whole row dropped) and e^−0.75 = 0.47 (inside: kept).
  w = variant(losses.masked_is_weights, lower=0.4, upper=2.0, level="sequence")(SAMPLER, TRAINER, MASK)
  np.testing.assert_allclose(w, [[0.0, 0.0, 0.0, 0.0], [E(-0.75), E(-0.75), 0.0, 0.0]], rtol=1e-5)
  w = losses.masked_is_weights(SAMPLER, TRAINER, MASK, lower=0.5, upper=2.0, level="sequence")
  np.testing.assert_array_equal(w, np.zeros_like(w))  # 0.47 < 0.5: both rows dropped


def test_bounds_are_inclusive_and_extreme_ratios_stay_finite():
  sampler = jnp.zeros((1, 3), jnp.float32)
  trainer = jnp.asarray([[jnp.log(2.0), jnp.log(0.5), 500.0]], jnp.float32)  # ratios 2, 0.5, e^500
  mask = jnp.ones((1, 3), bool)
  np.testing.assert_allclose(losses.masked_is_weights(sampler, trainer, mask, lower=0.5, upper=2.0),
                             [[2.0, 0.5, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(losses.truncated_is_weights(sampler, trainer, mask, cap=2.0), [[2.0, 0.5, 2.0]],
                             rtol=1e-6)
  seq = losses.truncated_is_weights(sampler, trainer, mask, cap=3.0, level="sequence")  # Σ Δ = 500: no overflow
  np.testing.assert_allclose(seq, [[3.0, 3.0, 3.0]], rtol=1e-6)
  metrics = losses.mismatch_metrics(sampler[:, :2], trainer[:, :2], mask[:, :2])  # ratios exactly 2 and 1/2: inside
  assert float(metrics["mismatch_ratio_outside"]) == 0.0


def test_weights_are_stop_gradient():
  for correction in ("token_tis", "seq_tis", "token_mis", "seq_mis"):
    grad = jax.grad(lambda t: jnp.sum(losses.rollout_correction_weights(
        SAMPLER, t, MASK, correction, lower=0.3, upper=5.0)))(jnp.where(MASK, TRAINER, 0.0))
    np.testing.assert_array_equal(grad, np.zeros_like(grad), err_msg=correction)


def test_unknown_correction_and_level_are_refused():
  with pytest.raises(ValueError, match="rollout correction 'tis' is unknown"):
    losses.rollout_correction_weights(SAMPLER, TRAINER, MASK, "tis")
  with pytest.raises(ValueError, match="importance level 'row' is unknown"):
    losses.truncated_is_weights(SAMPLER, TRAINER, MASK, level="row")


def test_weight_metrics_hand_computed():
  w = losses.masked_is_weights(SAMPLER, TRAINER, MASK, lower=0.5, upper=2.0)  # 1, e^.5, 0 | 0, e^.25
  metrics = losses.weight_metrics(w, MASK)
  assert metrics["rollout_is_weight_mean"] == pytest.approx((1 + E(0.5) + E(0.25)) / 5, rel=1e-6)
  assert metrics["rollout_is_weight_min"] == 0.0
  assert metrics["rollout_is_weight_max"] == pytest.approx(E(0.5), rel=1e-6)
  assert metrics["rollout_is_dropped_frac"] == pytest.approx(0.4, abs=1e-7)
  empty = losses.weight_metrics(w, np.zeros_like(MASK))
  assert all(float(v) == 0.0 for v in empty.values())


def test_grpo_loss_rollout_weights_multiply_the_policy_gradient_term_only():
  """With weights w, the loss is Σ_t a_t w_t ℓ_t + β KL: unit weights change nothing, and the gradient of each token's
  clipped term scales by its weight (KL term untouched)."""
  key = jax.random.PRNGKey(0)
  logp = jnp.where(MASK, jnp.asarray(SAMPLER) + 0.05 * jax.random.normal(key, SAMPLER.shape), 0.0)
  old, ref, adv = jnp.asarray(SAMPLER), jnp.asarray(SAMPLER) - 0.1, jnp.asarray([1.0, -0.5])
  kw = dict(epsilon=0.2, beta=0.0, aggregation="token-mean")
  plain, _ = losses.grpo_loss(logp, old, ref, adv, MASK, **kw)
  ones, _ = losses.grpo_loss(logp, old, ref, adv, MASK, rollout_weights=jnp.ones(MASK.shape), **kw)
  assert float(ones) == float(plain)
  w = losses.truncated_is_weights(SAMPLER, TRAINER, MASK, cap=2.0)
  grad = lambda weights, **more: jax.grad(lambda lp: losses.grpo_loss(  # noqa: E731
      lp, old, ref, adv, MASK, rollout_weights=weights, **{**kw, **more})[0])(logp)
  np.testing.assert_allclose(grad(w), np.asarray(w) * grad(None), rtol=1e-5, atol=1e-8)
  # β > 0: the KL gradient is the same with and without the weights.
  kl_only = lambda weights: grad(weights, beta=0.1) - grad(weights)  # noqa: E731
  np.testing.assert_allclose(kl_only(w), kl_only(None), rtol=1e-5, atol=1e-7)


def test_token_tis_matches_trl(monkeypatch):
  """TRL's token-level truncated IS (`trl.experimental.sdpo.loss_utils.apply_importance_sampling_clipping`, the
  per-token loss times min(exp(Δ), C)) on the same inputs. TRL's GRPO modes (token/sequence truncate and mask) are
  computed inline in `GRPOTrainer._generate_and_score_completions`, not exposed as a function."""
  torch = pytest.importorskip("torch")
  pytest.importorskip("trl")
  monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
  from trl.experimental.sdpo import loss_utils  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  sampler = rng.normal(-1.5, 0.5, size=(4, 16)).astype(np.float32)
  trainer = (sampler + rng.normal(0.0, 0.6, size=sampler.shape)).astype(np.float32)
  mask = np.ones(sampler.shape, bool)
  for cap in (1.25, 2.0):
    theirs = loss_utils.apply_importance_sampling_clipping(
        torch.ones(sampler.shape), torch.from_numpy(trainer), torch.from_numpy(sampler), cap).numpy()
    ours = losses.truncated_is_weights(sampler, trainer, mask, cap=cap)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    assert (theirs == cap).any() and (theirs < 1).any()  # the cap and the ratios below 1 both exercised
