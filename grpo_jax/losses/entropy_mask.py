"""Forking tokens: keep the policy gradient of the highest-entropy tokens only ("Beyond the 80/20 rule")."""

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks


def top_entropy_mask(entropy: chex.Array, mask: chex.Array, quantile: float) -> chex.Array:
  """The tokens whose entropy is in the top `quantile` ρ of the batch's, `[B, T]` bool (Wang et al. 2025,
  arXiv 2506.01939; TRL's `top_entropy_quantile`):

    M_t = [H_t ≥ τ_ρ] · mask_t,   τ_ρ the (1 − ρ)-quantile of {H_t : mask_t} (linear interpolation).

  The paper trains on the top 20% (ρ = 0.2) of a batch's tokens by entropy, the "forking" tokens where the
  reasoning branches, and multiplies the policy-gradient term by M while the loss keeps its normaliser
  (the count over all tokens). ρ = 1 keeps every masked-in token; ρ → 0 only the highest-entropy ones
  (ties at τ are all kept). Not differentiated: the entropy only selects.

  Args:
    entropy: `[B, T]` per-token entropy of π_θ.
    mask: `[B, T]` completion mask.
    quantile: ρ in [0, 1].

  Returns:
    `[B, T]` bool, False where `mask` is (and everywhere when no token is masked in).
  """
  chex.assert_rank([entropy, mask], 2)
  chex.assert_equal_shape([entropy, mask])
  valid = _checks.as_mask(mask) > 0
  entropy = jax.lax.stop_gradient(_checks.f32(entropy))
  threshold = jnp.nanquantile(jnp.where(valid, entropy, jnp.nan), 1.0 - quantile)  # NaN with no valid token
  return valid & (entropy >= threshold)
