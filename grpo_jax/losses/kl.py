"""KL divergence between the policy and the reference: per-token estimators and the exact value."""

from typing import Literal

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks

Estimator = Literal["k1", "k2", "k3"]


def kl_divergence(
    logp: chex.Array,
    ref_logp: chex.Array,
    kind: Estimator = "k3",
    mask: chex.Array | None = None,
) -> chex.Array:
  """Per-token estimators of D_KL[π_θ ‖ π_ref] from sampled tokens o_t ~ π_θ.

  With d = log π_ref(o_t) − log π_θ(o_t) (Schulman, "Approximating KL divergence"):

    k1 = −d,    k2 = d² / 2,    k3 = exp(d) − d − 1 = π_ref/π_θ − log(π_ref/π_θ) − 1.

  k3 is DeepSeekMath eq. 4 (arXiv 2402.03300): unbiased and always ≥ 0. k1 is the
  log-ratio of the per-token KL-penalised reward (eq. 2). Gradients flow through `logp`
  (and `ref_logp` if it is not stopped): ∂k3/∂log π_θ = 1 − π_ref/π_θ.

  Args:
    logp: `[...]` log π_θ of the sampled tokens.
    ref_logp: `[...]` log π_ref of the same tokens.
    kind: "k1", "k2" or "k3".
    mask: optional mask; masked-out positions get 0.

  Returns:
    float32 array of `logp`'s shape.
  """
  chex.assert_equal_shape([logp, ref_logp])
  d = _checks.f32(ref_logp) - _checks.f32(logp)
  if mask is not None:
    chex.assert_equal_shape([logp, mask])
    d = jnp.where(_checks.as_mask(mask) > 0, d, 0.0)  # padded positions cannot overflow expm1
  if kind == "k3":
    kl = jnp.expm1(d) - d
  elif kind == "k2":
    kl = 0.5 * jnp.square(d)
  elif kind == "k1":
    kl = -d
  else:
    raise ValueError(f"kl_divergence: unknown estimator {kind!r}; expected 'k1', 'k2' or 'k3'")
  return kl


def exact_kl(
    logits: chex.Array,
    ref_logits: chex.Array,
    mask: chex.Array | None = None,
    *,
    chunk_size: int = 8192,
) -> chex.Array:
  """Exact per-token KL from full logits: D_KL[π‖π_ref] = Σ_v π(v) (log π(v) − log π_ref(v)).

  The vocabulary is processed in chunks of `chunk_size` inside `lax.scan`s (an online
  log-sum-exp pass, then the sum), so only one float32 chunk of each distribution is
  live at a time, never the full float32 softmax pair of a 150k vocabulary. Useful as
  a diagnostic next to the sampled estimators, or as a full-distribution KL penalty.

  Args:
    logits: `[..., V]` policy logits (any float dtype).
    ref_logits: `[..., V]` reference logits.
    mask: optional `[...]` mask; masked-out positions get 0.
    chunk_size: vocabulary chunk.

  Returns:
    float32 `[...]`, ≥ 0.
  """
  chex.assert_equal_shape([logits, ref_logits])
  vocab = logits.shape[-1]
  chunk = min(chunk_size, vocab)
  num_chunks = -(-vocab // chunk)
  pad = num_chunks * chunk - vocab
  # Padding entries get a very negative finite logit: probability 0, finite log-ratio.
  widths = [(0, 0)] * (logits.ndim - 1) + [(0, pad)]
  logits = jnp.pad(logits, widths, constant_values=-1e9)
  ref_logits = jnp.pad(ref_logits, widths, constant_values=-1e9)
  lead = logits.shape[:-1]

  def chunk_at(x, i):
    return jax.lax.dynamic_slice_in_dim(x, i * chunk, chunk, axis=-1).astype(jnp.float32)

  def lse_step(carry, i):
    (m_p, s_p), (m_q, s_q) = carry

    def update(m, s, x):
      m_new = jnp.maximum(m, jnp.max(x, axis=-1))
      s_new = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(x - m_new[..., None]), axis=-1)
      return m_new, s_new

    return (update(m_p, s_p, chunk_at(logits, i)), update(m_q, s_q, chunk_at(ref_logits, i))), None

  init = jnp.full(lead, -jnp.inf, jnp.float32), jnp.zeros(lead, jnp.float32)
  ((m_p, s_p), (m_q, s_q)), _ = jax.lax.scan(lse_step, (init, init), jnp.arange(num_chunks))
  lse_p, lse_q = m_p + jnp.log(s_p), m_q + jnp.log(s_q)

  def kl_step(total, i):
    logp = chunk_at(logits, i) - lse_p[..., None]
    logq = chunk_at(ref_logits, i) - lse_q[..., None]
    p = jnp.exp(logp)  # p = 0 terms (e.g. -inf logits of filtered tokens) contribute 0, not NaN
    return total + jnp.sum(jnp.where(p > 0, p * (logp - logq), 0.0), axis=-1), None

  kl, _ = jax.lax.scan(kl_step, jnp.zeros(lead, jnp.float32), jnp.arange(num_chunks))
  kl = jnp.maximum(kl, 0.0)
  if mask is not None:
    chex.assert_equal_shape([kl, mask])
    kl = jnp.where(_checks.as_mask(mask) > 0, kl, 0.0)
  return kl
