"""`losses.grpo_loss` against TRL's GRPOTrainer on the same inputs: its own `_compute_loss` and
`get_high_entropy_mask`, called on a one-process stand-in for the trainer (the attributes those methods read),
the policy's log-probs and entropies given instead of a model's forward."""

import collections
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import losses

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
B, T = 4, 6


class _OneProcess:
  """accelerate.Accelerator's collectives on one process: identities."""
  num_processes = 1
  sync_gradients = True

  def gather(self, x):
    return x

  gather_for_metrics = gather

  def reduce(self, x, reduction="sum"):
    del reduction
    return x

  def pad_across_processes(self, x, dim=0, pad_index=0):
    del dim, pad_index
    return x


def _trainer(**options):
  args = types.SimpleNamespace(sapo_temperature_pos=options.pop("tau_pos", 1.0),
                               sapo_temperature_neg=options.pop("tau_neg", 1.05), delta=None,
                               use_bias_correction_kl=False, steps_per_generation=1)
  stub = types.SimpleNamespace(
      args=args, importance_sampling_level="token", off_policy_mask_threshold=None, use_vllm=False,
      vllm_importance_sampling_correction=False, model=types.SimpleNamespace(training=True),
      current_gradient_accumulation_steps=1, accelerator=_OneProcess(),
      _metrics={"train": collections.defaultdict(list)}, use_adaptive_entropy=False, aux_loss_enabled=False,
      max_completion_length=T, **{"top_entropy_quantile": 1.0, "entropy_coef": 0.0, **options})
  stub._entropy_bonus_enabled = stub.entropy_coef != 0.0  # pylint: disable=protected-access
  stub.get_high_entropy_mask = functools.partial(trl.GRPOTrainer.get_high_entropy_mask, stub)
  return stub


def _trl_loss(batch, importance_sampling_ratio=None, **options):
  """TRL's loss and its gradients with respect to the log-probs and the entropies; with `importance_sampling_ratio`,
  its vLLM importance-sampling correction on, with those weights."""
  logp, old, ref, adv, mask, entropy = (torch.tensor(np.asarray(x)) for x in batch)
  logp.requires_grad_(True)
  entropy.requires_grad_(True)
  stub = _trainer(**options)
  if importance_sampling_ratio is not None:
    stub.use_vllm = stub.vllm_importance_sampling_correction = True
  stub._get_per_token_logps_and_entropies = lambda *a, **k: (logp, entropy, None)  # pylint: disable=protected-access
  mask = mask.long()
  inputs = dict(prompt_ids=torch.zeros((B, 1), dtype=torch.long), prompt_mask=torch.ones((B, 1), dtype=torch.long),
                completion_ids=torch.zeros((B, T), dtype=torch.long), completion_mask=mask, advantages=adv,
                old_per_token_logps=old, ref_per_token_logps=ref, num_items_in_batch=mask.sum())
  if importance_sampling_ratio is not None:
    inputs["importance_sampling_ratio"] = torch.tensor(np.asarray(importance_sampling_ratio))
  loss = trl.GRPOTrainer._compute_loss(stub, None, inputs)  # pylint: disable=protected-access
  loss.backward()
  entropy_grad = np.zeros((B, T)) if entropy.grad is None else entropy.grad.numpy()
  return loss.item(), logp.grad.numpy(), entropy_grad


def _ours(batch, **kwargs):
  logp, old, ref, adv, mask, entropy = batch
  fn = lambda lp, h: losses.grpo_loss(lp, old, ref, adv, mask, entropy=h, **kwargs)[0]
  loss, (g_logp, g_entropy) = jax.value_and_grad(fn, argnums=(0, 1))(logp, entropy)
  return float(loss), np.asarray(g_logp), np.asarray(g_entropy)


def _batch(seed):
  k = jax.random.split(jax.random.PRNGKey(seed), 5)
  old = -jax.random.uniform(k[0], (B, T), minval=0.1, maxval=3.0)
  logp = old + 0.4 * jax.random.normal(k[1], (B, T))  # ratios well outside [0.8, 1.28]
  ref = logp + 0.3 * jax.random.normal(k[2], (B, T))
  adv = jax.random.normal(k[3], (B,))
  mask = jnp.arange(T)[None] < jnp.array([6, 3, 1, 5])[:, None]
  entropy = jax.random.uniform(k[4], (B, T), maxval=3.0)
  return logp, old, ref, adv, mask, entropy


# (TRL's options, ours): TRL names a loss and its aggregation together; CISPO's epsilon_high there is the
# weight's cap 1 + ε_high.
CASES = {
    "grpo": (dict(loss_type="grpo", epsilon_low=0.2, epsilon_high=0.28),
             dict(epsilon=0.2, epsilon_high=0.28)),
    "dapo": (dict(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28),
             dict(epsilon=0.2, epsilon_high=0.28, aggregation="token-mean")),
    "dr_grpo": (dict(loss_type="dr_grpo", epsilon_low=0.2, epsilon_high=0.2),
                dict(epsilon=0.2, aggregation="seq-mean-token-sum-norm", max_len=T)),
    "cispo": (dict(loss_type="cispo", epsilon_low=0.2, epsilon_high=1.3),
              dict(epsilon=0.2, epsilon_high=0.3, aggregation="token-mean", policy_loss="cispo")),
    "sapo": (dict(loss_type="sapo", epsilon_low=0.2, epsilon_high=0.2, tau_pos=1.0, tau_neg=1.05),
             dict(epsilon=0.2, policy_loss="sapo", sapo_tau_pos=1.0, sapo_tau_neg=1.05)),
    "sapo_sharp": (dict(loss_type="sapo", epsilon_low=0.2, epsilon_high=0.2, tau_pos=3.0, tau_neg=6.0),
                   dict(epsilon=0.2, policy_loss="sapo", sapo_tau_pos=3.0, sapo_tau_neg=6.0)),
}


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_and_gradient_equal_trls(case, beta):
  theirs, ours = CASES[case]
  batch = _batch(len(case))
  ref_trl, ref_ours = _trl_loss(batch, beta=beta, **theirs), _ours(batch, beta=beta, **ours)
  np.testing.assert_allclose(ref_ours[0], ref_trl[0], rtol=1e-5)
  np.testing.assert_allclose(ref_ours[1], ref_trl[1], rtol=1e-4, atol=1e-7)
  assert np.abs(ref_trl[1]).max() > 1e-3  # a real comparison: the gradient is not all zeros


@pytest.mark.parametrize("case", ["grpo", "dapo", "cispo", "sapo"])
def test_entropy_bonus_equals_trls(case):
  theirs, ours = CASES[case]
  batch = _batch(7)
  trl_out = _trl_loss(batch, beta=0.04, entropy_coef=0.05, **theirs)
  our_out = _ours(batch, beta=0.04, entropy_coef=0.05, **ours)
  for a, b in zip(our_out, trl_out):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
  assert np.abs(trl_out[2]).max() > 1e-3


@pytest.mark.parametrize("rho", [0.2, 0.5, 0.9])
@pytest.mark.parametrize("case", ["grpo", "dapo", "cispo", "sapo"])
def test_top_entropy_quantile_equals_trls(case, rho):
  theirs, ours = CASES[case]
  batch = _batch(11)
  trl_out = _trl_loss(batch, beta=0.04, top_entropy_quantile=rho, **theirs)
  our_out = _ours(batch, beta=0.04, top_entropy_quantile=rho, **ours)
  np.testing.assert_allclose(our_out[0], trl_out[0], rtol=1e-5)
  np.testing.assert_allclose(our_out[1], trl_out[1], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("rho", [0.0, 0.2, 0.37, 1.0])
def test_top_entropy_mask_equals_trls(rho):
  _, _, _, _, mask, entropy = _batch(3)
  theirs = _trainer().get_high_entropy_mask(torch.tensor(np.asarray(entropy)), torch.tensor(np.asarray(mask)).long(),
                                            1 - rho)
  np.testing.assert_array_equal(losses.top_entropy_mask(entropy, mask, rho), theirs.numpy())


@pytest.mark.parametrize("correction", ["token_tis", "seq_mis"])
@pytest.mark.parametrize("case", ["grpo", "dapo", "cispo", "sapo"])
def test_rollout_correction_weights_enter_the_loss_as_trls(case, correction):
  """`grpo_loss(rollout_weights=w)` against TRL's `_compute_loss` with its vLLM importance-sampling correction given
  the same weights (`importance_sampling_ratio`): w multiplies each token's policy term, not the KL term."""
  theirs, ours = CASES[case]
  batch = _batch(5)
  logp, old, mask = batch[0], batch[1], batch[4]
  sampler = old + 0.3 * jax.random.normal(jax.random.PRNGKey(9), old.shape)
  w = losses.rollout_correction_weights(sampler, old, mask, correction, lower=0.3, upper=2.0)
  assert 0 < float(jnp.sum(w != 1.0)) and float(jnp.max(w)) > 1.0  # weights that change the loss
  trl_out = _trl_loss(batch, beta=0.04, importance_sampling_ratio=w, **theirs)
  our_out = _ours(batch, beta=0.04, rollout_weights=w, **ours)
  np.testing.assert_allclose(our_out[0], trl_out[0], rtol=1e-5)
  np.testing.assert_allclose(our_out[1], trl_out[1], rtol=1e-4, atol=1e-7)
  assert abs(our_out[0] - _ours(batch, beta=0.04, **ours)[0]) > 1e-4
