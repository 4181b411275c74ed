"""Reward-model losses: outcome BCE (ORM), per-step BCE (PRM) and the pairwise Bradley-Terry losses.

Scores are logits s; σ(s) is the model's probability that the solution (or step) is correct.
Labels may be hard (0/1) or soft (a Monte Carlo success fraction in [0, 1], Math-Shepherd's
soft estimate). Each loss returns `(loss, metrics)`; the metrics are stop-gradient.
"""

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks


def _bce(logits: chex.Array, labels: chex.Array) -> chex.Array:
  """−[y log σ(s) + (1 − y) log(1 − σ(s))] = softplus(s) − y·s, stable for any s."""
  return jax.nn.softplus(logits) - labels * logits


def _masked_metrics(loss, logits, labels, valid, count) -> dict[str, chex.Array]:
  logits, labels = jax.lax.stop_gradient(logits), jax.lax.stop_gradient(labels)
  hit = ((logits > 0) == (labels > 0.5)).astype(jnp.float32)
  return {"loss": jax.lax.stop_gradient(loss),
          "accuracy": jnp.sum(jnp.where(valid, hit, 0.0)) / count,
          "mean_probability": jnp.sum(jnp.where(valid, jax.nn.sigmoid(logits), 0.0)) / count,
          "mean_label": jnp.sum(jnp.where(valid, labels, 0.0)) / count}


def outcome_bce_loss(
    logits: chex.Array,
    labels: chex.Array,
    mask: chex.Array | None = None,
    *,
    num_examples: chex.Numeric | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
  """Binary cross-entropy of an outcome reward model (DeepSeekMath §4.1, arXiv 2402.03300):

    ℓ = (1/N) Σ_i −[y_i log σ(s_i) + (1 − y_i) log(1 − σ(s_i))],

  s_i the ORM's score of completion i (its last token), y_i ∈ [0, 1] whether it is correct.

  Args:
    logits: `[N]` scores s_i.
    labels: `[N]` labels y_i (0/1, or soft).
    mask: `[N]` true for real examples (padding rows false); default all true.
    num_examples: the normaliser N; default the number of true entries of `mask`. Pass the
      whole minibatch's count when accumulating gradients over micro-batches.

  Returns:
    `(loss, metrics)`: "loss", "accuracy" (σ(s) > 0.5 agrees with y > 0.5), "mean_probability",
    "mean_label".
  """
  chex.assert_rank([logits, labels], 1)
  chex.assert_equal_shape([logits, labels])
  return _masked_bce(logits, labels, mask, num_examples)


def step_bce_loss(
    logits: chex.Array,
    labels: chex.Array,
    step_mask: chex.Array,
    *,
    num_steps: chex.Numeric | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
  """Per-step binary cross-entropy of a process reward model (DeepSeekMath §4.1.3; Math-Shepherd,
  arXiv 2312.08935), averaged over all real steps of the batch:

    ℓ = (1/Σ_ij m_ij) Σ_ij m_ij · −[y_ij log σ(s_ij) + (1 − y_ij) log(1 − σ(s_ij))],

  s_ij the PRM's score at the end token of step j of completion i, y_ij its step label.

  Args:
    logits: `[N, K]` step scores, K the most steps.
    labels: `[N, K]` step labels in [0, 1].
    step_mask: `[N, K]` m_ij, true for real steps.
    num_steps: the normaliser Σ m; default the count in `step_mask` (pass the minibatch's when
      accumulating gradients).

  Returns:
    `(loss, metrics)` as `outcome_bce_loss`, per step.
  """
  chex.assert_rank([logits, labels, step_mask], 2)
  chex.assert_equal_shape([logits, labels, step_mask])
  return _masked_bce(logits, labels, step_mask, num_steps)


def _log1mexp(x: chex.Array) -> chex.Array:
  """log(1 − eˣ) for x < 0, accurate on both sides of −log 2 (Mächler, 2012)."""
  x = jnp.minimum(x, -1e-7)
  return jnp.where(x > -jnp.log(2.0), jnp.log(-jnp.expm1(x)), jnp.log1p(-jnp.exp(x)))


def noisy_and_logits(step_logits: chex.Array, step_mask: chex.Array) -> chex.Array:
  """The outcome logit of a solution that is right only if every step is right (noisy-AND):

    p_i = Π_j σ(s_ij),   logit_i = log p_i − log(1 − p_i),

  over the real steps j of completion i (σ(logit_i) = p_i). A completion without steps has p = 1.

  Args:
    step_logits: `[N, K]` step scores s_ij.
    step_mask: `[N, K]` true for real steps.

  Returns:
    `[N]` float32 logits.
  """
  chex.assert_rank([step_logits, step_mask], 2)
  chex.assert_equal_shape([step_logits, step_mask])
  log_p = jnp.sum(jnp.where(jnp.asarray(step_mask, bool), jax.nn.log_sigmoid(_checks.f32(step_logits)), 0.0), -1)
  return log_p - _log1mexp(log_p)


def noisy_and_outcome_loss(
    step_logits: chex.Array,
    labels: chex.Array,
    step_mask: chex.Array,
    *,
    num_examples: chex.Numeric | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
  """Outcome BCE of a reward model scored at every step end and pooled by a noisy-AND:

    ℓ = (1/N) Σ_i −[y_i log p_i + (1 − y_i) log(1 − p_i)],   p_i = Π_j σ(s_ij),

  y_i whether completion i's final answer is right (outcome supervision only, as an ORM,
  DeepSeekMath §4.1.2). A right answer pushes every step score up; a wrong one pushes down
  mostly the step the model already doubts (∂ℓ/∂s_ij ∝ 1 − σ(s_ij)), so the per-step scores
  learn to find the error from outcome labels alone (multiple-instance learning with a noisy-AND,
  Kraus et al., arXiv 1511.05286; an outcome-trained PRM in the sense of Math-Shepherd's
  min-aggregation, arXiv 2312.08935). Rows without a real step are left out.

  Args:
    step_logits: `[N, K]` step scores s_ij.
    labels: `[N]` outcome labels y_i in [0, 1].
    step_mask: `[N, K]` true for real steps.
    num_examples: the normaliser N; default the rows with a real step (pass the minibatch's when
      accumulating gradients).

  Returns:
    `(loss, metrics)` as `outcome_bce_loss`, on the pooled logits.
  """
  chex.assert_rank(labels, 1)
  logits = noisy_and_logits(step_logits, step_mask)
  return _masked_bce(logits, labels, jnp.any(jnp.asarray(step_mask, bool), axis=-1), num_examples)


def _masked_bce(logits, labels, mask, count):
  s, y = _checks.f32(logits), _checks.f32(labels)
  valid = jnp.ones(s.shape, bool) if mask is None else jnp.asarray(mask, bool)
  if count is None:
    count = jnp.sum(valid)
  count = jnp.maximum(_checks.f32(count), 1.0)
  loss = jnp.sum(jnp.where(valid, _bce(s, y), 0.0)) / count
  return loss, _masked_metrics(loss, s, y, valid, count)


def pairwise_reward_loss(
    chosen: chex.Array,
    rejected: chex.Array,
    mask: chex.Array | None = None,
    *,
    num_pairs: chex.Numeric | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
  """Bradley-Terry pairwise loss of a reward model (Ouyang et al., 2022, arXiv 2203.02155, eq. 1):

    ℓ = (1/P) Σ_p −log σ(s⁺_p − s⁻_p),

  s⁺ the score of the preferred output (e.g. a correct solution), s⁻ of the dispreferred one.
  Only score differences are trained, so σ(s) is a ranking score, not a calibrated probability.

  Args:
    chosen: `[...]` scores s⁺.
    rejected: `[...]` scores s⁻, the same shape.
    mask: true for real pairs; default all true.
    num_pairs: the normaliser P; default the count in `mask`.

  Returns:
    `(loss, metrics)`: "loss", "accuracy" (s⁺ > s⁻), "margin" (mean s⁺ − s⁻).
  """
  chex.assert_equal_shape([chosen, rejected])
  margin = _checks.f32(chosen) - _checks.f32(rejected)
  valid = jnp.ones(margin.shape, bool) if mask is None else jnp.asarray(mask, bool)
  chex.assert_equal_shape([margin, valid])
  count = jnp.maximum(_checks.f32(jnp.sum(valid) if num_pairs is None else num_pairs), 1.0)
  loss = jnp.sum(jnp.where(valid, -jax.nn.log_sigmoid(margin), 0.0)) / count
  margin = jax.lax.stop_gradient(margin)
  return loss, {"loss": jax.lax.stop_gradient(loss),
                "accuracy": jnp.sum(jnp.where(valid, (margin > 0).astype(jnp.float32), 0.0)) / count,
                "margin": jnp.sum(jnp.where(valid, margin, 0.0)) / count}


def within_problem_pairwise_loss(
    logits: chex.Array,
    labels: chex.Array,
    groups: chex.Array,
    mask: chex.Array | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
  """Bradley-Terry loss over every (right, wrong) pair of completions of the same problem:

    ℓ = (1/P) Σ_{i,j: g_i = g_j, y_i > y_j} −log σ(s_i − s_j),   P the number of such pairs.

  A pointwise loss (BCE) on completions of many problems is minimised in good part by scoring
  easy problems high, which a group-normalised advantage (GRPO) cancels; this loss has no
  per-problem term at all (adding a constant to every score of a problem leaves it unchanged),
  so all of it trains the ranking of a problem's own samples, the only ranking GRPO uses.

  Args:
    logits: `[N]` outcome scores s_i (e.g. the noisy-AND logit of an "orm_steps" model).
    labels: `[N]` outcome labels y_i (> 0.5 right).
    groups: `[N]` problem ids g_i.
    mask: `[N]` true for real rows; default all true.

  Returns:
    `(loss, metrics)` as `pairwise_reward_loss`, plus "pairs" (P); a batch without a pair has loss 0.
  """
  chex.assert_rank([logits, labels, groups], 1)
  chex.assert_equal_shape([logits, labels, groups])
  y = jnp.asarray(labels) > 0.5
  valid = jnp.ones(y.shape, bool) if mask is None else jnp.asarray(mask, bool)
  pairs = y[:, None] & ~y[None, :] & valid[:, None] & valid[None, :] & (groups[:, None] == groups[None, :])
  s = _checks.f32(logits)
  loss, metrics = pairwise_reward_loss(*jnp.broadcast_arrays(s[:, None], s[None, :]), pairs)
  return loss, {**metrics, "pairs": jnp.sum(pairs).astype(jnp.float32)}
