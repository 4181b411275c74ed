"""Direct preference optimisation."""

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks


def dpo_loss(
    chosen_logp: chex.Array,
    rejected_logp: chex.Array,
    ref_chosen_logp: chex.Array,
    ref_rejected_logp: chex.Array,
    beta: float = 0.1,
    nll_coef: float = 0.0,
    chosen_length: chex.Array | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
  """DPO loss (Rafailov et al., 2023, arXiv 2305.18290), mean over pairs:

    ℓ = −log σ(β [log π_θ/π_ref (o⁺) − log π_θ/π_ref (o⁻)])  +  α · (−log π_θ(o⁺) / |o⁺|).

  Its gradient on each token of o⁺ (o⁻) is −β·GC (+β·GC) with GC the DPO coefficient of
  DeepSeekMath Table 10 (`dpo_coefficient`). The second term (α = `nll_coef`, 0 by default: plain DPO) is the
  length-normalised NLL of the preferred output of Iterative RPO (Pang et al., 2024, arXiv 2404.19733, α = 1),
  which keeps log π_θ(o⁺) from falling with the margin on math reasoning.

  Args:
    chosen_logp: `[B]` Σ_t log π_θ over the preferred output o⁺.
    rejected_logp: `[B]` the same over the dispreferred output o⁻.
    ref_chosen_logp: `[B]` Σ_t log π_ref over o⁺.
    ref_rejected_logp: `[B]` Σ_t log π_ref over o⁻.
    beta: β.
    nll_coef: α.
    chosen_length: `[B]` tokens of o⁺ (needed when α > 0).

  Returns:
    `(loss, metrics)` with "reward_margin" (mean β-scaled margin), "accuracy" (margin > 0), and
    "chosen_logratio" / "rejected_logratio", the mean log π_θ/π_ref of o⁺ and of o⁻: both falling while the margin
    grows is the likelihood displacement that can take held-out accuracy down with it; with α > 0, "chosen_nll"
    (the mean −log π_θ(o⁺) / |o⁺|) and "dpo_loss" (the first term).
  """
  chex.assert_rank([chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp], 1)
  chex.assert_equal_shape([chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp])
  chosen = _checks.f32(chosen_logp) - _checks.f32(ref_chosen_logp)
  rejected = _checks.f32(rejected_logp) - _checks.f32(ref_rejected_logp)
  margin = beta * (chosen - rejected)
  loss = -jnp.mean(jax.nn.log_sigmoid(margin))
  margin = jax.lax.stop_gradient(margin)
  metrics = {"reward_margin": jnp.mean(margin), "accuracy": jnp.mean((margin > 0).astype(jnp.float32)),
             "chosen_logratio": jnp.mean(jax.lax.stop_gradient(chosen)),
             "rejected_logratio": jnp.mean(jax.lax.stop_gradient(rejected))}
  if nll_coef:
    if chosen_length is None:
      raise ValueError("dpo_loss: nll_coef > 0 needs chosen_length")
    chex.assert_equal_shape([chosen_logp, chosen_length])
    nll = -jnp.mean(_checks.f32(chosen_logp) / jnp.maximum(_checks.f32(chosen_length), 1.0))
    metrics.update(dpo_loss=jax.lax.stop_gradient(loss), chosen_nll=jax.lax.stop_gradient(nll))
    loss = loss + nll_coef * nll
  return loss, {"loss": jax.lax.stop_gradient(loss), **metrics}
