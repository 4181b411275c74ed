import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import training


def _lrs(optimizer, steps):
  params = {"w": jnp.zeros(())}
  state = optimizer.init(params)
  out = []
  for _ in range(steps):
    # With Adam, a constant gradient of 1 gives an update of -lr (bias-corrected, eps small).
    updates, state = optimizer.update({"w": jnp.ones(())}, state, params)
    out.append(-float(updates["w"]))
  return np.asarray(out)


def test_warmup_then_constant():
  lrs = _lrs(training.make_optimizer(0.1, warmup_steps=4, max_grad_norm=None, eps=1e-12), 7)
  np.testing.assert_allclose(lrs, [0.0, 0.025, 0.05, 0.075, 0.1, 0.1, 0.1], atol=1e-6)


def test_cosine_decays_to_ten_percent():
  lrs = _lrs(training.make_optimizer(0.1, warmup_steps=2, total_steps=10, schedule="cosine", max_grad_norm=None,
                                     eps=1e-12), 11)
  np.testing.assert_allclose(lrs[2], 0.1, rtol=1e-5)
  np.testing.assert_allclose(lrs[10], 0.01, rtol=1e-5)


def _adam_updates(grads, lr, b1=0.9, b2=0.95):
  """Adam's updates, written out: m, v the moving averages of g and g², bias-corrected, eps 0."""
  m = v = 0.0
  out = []
  for t, g in enumerate(grads, 1):
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    out.append(-lr * (m / (1 - b1**t)) / np.sqrt(v / (1 - b2**t)))
  return np.asarray(out)


def test_gradients_are_clipped_to_the_global_norm_before_adam():
  # Global norms 5 (clipped to 0.5), 0.5 (at the threshold) and 0.05 (below it: unchanged). Clipped, the first
  # two are the same gradient, so Adam's second update is -lr on each coordinate; unclipped it is 0.75 lr,
  # and with the threshold at 1.0 0.94 lr.
  grads = [np.array([3.0, 4.0]), np.array([0.3, 0.4]), np.array([0.03, 0.04])]

  def updates(max_grad_norm):
    optimizer = training.make_optimizer(0.1, max_grad_norm=max_grad_norm, eps=1e-12)
    params = {"w": jnp.zeros(2)}
    state, out = optimizer.init(params), []
    for g in grads:
      u, state = optimizer.update({"w": jnp.asarray(g, jnp.float32)}, state, params)
      out.append(np.asarray(u["w"]))
    return np.asarray(out)

  expected = _adam_updates([grads[0] * 0.5 / 5.0, grads[1], grads[2]], lr=0.1)
  np.testing.assert_allclose(expected[:2], -0.1, rtol=1e-6)
  np.testing.assert_allclose(updates(0.5), expected, rtol=1e-5)
  unclipped = _adam_updates(grads, lr=0.1)
  np.testing.assert_allclose(unclipped[1] / -0.1, 0.75, rtol=1e-3)  # the clip is what makes the difference
  np.testing.assert_allclose(updates(None), unclipped, rtol=1e-5)  # None: no clipping


def test_errors():
  with pytest.raises(ValueError, match="learning_rate"):
    training.make_optimizer(0.0)
  with pytest.raises(ValueError, match="cosine schedule needs total_steps"):
    training.make_optimizer(0.1, schedule="cosine")
  with pytest.raises(ValueError, match="unknown schedule"):
    training.make_optimizer(0.1, schedule="linear")


def test_cosine_without_warmup_starts_at_peak():
  lrs = _lrs(training.make_optimizer(0.1, warmup_steps=0, total_steps=10, schedule="cosine", max_grad_norm=None,
                                     eps=1e-12), 11)
  np.testing.assert_allclose(lrs[0], 0.1, rtol=1e-5)
  np.testing.assert_allclose(lrs[10], 0.01, rtol=1e-5)
