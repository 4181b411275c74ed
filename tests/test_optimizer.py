import jax.numpy as jnp
import numpy as np
import optax
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


def test_clipping_and_errors():
  optimizer = training.make_optimizer(1.0, max_grad_norm=0.5)
  state = optimizer.init({"w": jnp.zeros(2)})
  clip = optax.clip_by_global_norm(0.5)
  clipped, _ = clip.update({"w": jnp.array([3.0, 4.0])}, clip.init(None))
  np.testing.assert_allclose(clipped["w"], [0.3, 0.4], rtol=1e-6)
  assert state is not None
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
