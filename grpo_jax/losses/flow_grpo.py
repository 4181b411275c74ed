"""Flow-GRPO (AgentFlow, arXiv 2510.05592): the GRPO loss of a multi-turn planner, per turn.

The batch is one row per turn: row s holds the action a_i^t of turn t of trajectory i = i(s),
with `mask` on the action tokens only (prompt, memory text and tool results are context, never
trained). Every turn of a trajectory carries the trajectory's outcome advantage (eq. 4 and 7).
"""

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks
from grpo_jax.losses import advantages as advantages_lib
from grpo_jax.losses import aggregation
from grpo_jax.losses import kl as kl_lib
from grpo_jax.losses import surrogate


def broadcast_outcome_advantages(
    rewards: chex.Array,
    trajectory_ids: chex.Array,
    *,
    scale: advantages_lib.Scale = "group",
    eps: float = 1e-4,
) -> chex.Array:
  """Flow-GRPO advantages of every turn (AgentFlow eq. 4 and 7).

    A_i^t = (R̄_i − mean_k R̄_k) / (std_k R̄_k + eps)    for every turn t of trajectory i,

  mean and std over the G trajectories k of the same query; R̄_i is the final outcome reward,
  broadcast to each turn's action (eq. 4). `scale` as in `group_advantages`.

  Args:
    rewards: `[P, G]` outcome rewards, P queries with G trajectories each.
    trajectory_ids: `[S]` int, row s belongs to trajectory p * G + g.
    scale: "group" (eq. 7), "batch" or "none" (no division).
    eps: added to the std.

  Returns:
    `[S]` float32 per-turn advantages.
  """
  chex.assert_rank([rewards, trajectory_ids], [2, 1])
  per_trajectory = advantages_lib.group_advantages(rewards, scale=scale, eps=eps).reshape(-1)
  return jnp.take(per_trajectory, jnp.asarray(trajectory_ids, jnp.int32), axis=0)


def flow_grpo_weights(
    mask: chex.Array,
    num_turns: chex.Array,
    num_trajectories: chex.Numeric | None = None,
) -> chex.Array:
  """Weights of eq. 5's nested means: w_{s,j} = mask_{s,j} / (N · T_{i(s)} · |a_s|), `[S, L]` float32.

  Σ_{s,j} w_{s,j} ℓ_{s,j} = (1/N) Σ_i (1/T_i) Σ_t (1/|a_i^t|) Σ_j ℓ_{i,t,j}. N defaults to
  Σ_s [|a_s| > 0] / T_{i(s)}, the number of trajectories whose turns are all in the batch; pass
  the global count when the batch is split into micro-batches.

  Args:
    mask: `[S, L]` action-token mask.
    num_turns: `[S]` T_i of each row's trajectory (any value ≥ 1 on padding rows).
    num_trajectories: N, or None.
  """
  chex.assert_rank([mask, num_turns], [2, 1])
  chex.assert_equal_shape_prefix([mask, num_turns], 1)
  m = _checks.as_mask(mask)
  lengths = jnp.sum(m, axis=-1)
  turns = jnp.maximum(_checks.f32(num_turns), 1.0)
  if num_trajectories is None:
    num_trajectories = jnp.maximum(jnp.sum(jnp.where(lengths > 0, 1.0 / turns, 0.0)), 1.0)
  per_row = 1.0 / (jnp.maximum(lengths, 1.0) * turns * num_trajectories)
  return m * per_row[:, None]


def flow_grpo_loss(
    logp: chex.Array,
    old_logp: chex.Array,
    ref_logp: chex.Array | None,
    advantages: chex.Array,
    mask: chex.Array,
    num_turns: chex.Array,
    *,
    epsilon: float,
    epsilon_high: float | None = None,
    beta: float,
    kl: kl_lib.Estimator = "k3",
    dual_clip: float | None = None,
    num_trajectories: chex.Numeric | None = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
  """Flow-GRPO loss, the negated objective of AgentFlow eq. 5 (arXiv 2510.05592).

    J = (1/G) Σ_i (1/T_i) Σ_t (1/|a_i^t|) Σ_j [ min(ρ_{i,j}^t A_i^t, clip(ρ_{i,j}^t, 1−ε, 1+ε) A_i^t)
                                                 − β D_KL(π_θ‖π_ref)_{i,j}^t ],

  ρ_{i,j}^t = π_θ(a_{i,j}^t | s_i^t, a_{i,<j}^t) / π_old(...), A_i^t from eq. 7
  (`broadcast_outcome_advantages`), the KL per token with the k3 estimator by default (as GRPO's
  eq. 4), inside the same nested means. Over a batch of P queries the outer mean is over all
  N = P·G trajectories. With T_i = 1 for every trajectory this is `grpo_loss` with
  "seq-mean-token-mean" aggregation.

  Args:
    logp: `[S, L]` log π_θ of the tokens (differentiated), one row per turn.
    old_logp: `[S, L]` log π_old.
    ref_logp: `[S, L]` log π_ref, or None when β = 0.
    advantages: `[S]` A_i^t of each row.
    mask: `[S, L]` True on the action tokens a_i^t only.
    num_turns: `[S]` T_i of each row's trajectory.
    epsilon: ε, the clip range (lower side).
    epsilon_high: upper clip range, default ε.
    beta: KL coefficient β.
    kl: the KL estimator, "k3", "k2" or "k1".
    dual_clip: c of dual-clip PPO, or None.
    num_trajectories: N for micro-batching (see `flow_grpo_weights`).

  Returns:
    `(loss, metrics)`: the scalar loss and float32 scalars "loss", "pg_loss", "kl", "kl_loss",
    "clip_frac_low", "clip_frac_high", "clip_frac", "ratio_mean", "ratio_min", "ratio_max".
  """
  chex.assert_rank([logp, old_logp, mask, advantages], [2, 2, 2, 1])
  chex.assert_equal_shape([logp, old_logp, mask])
  weights = flow_grpo_weights(mask, num_turns, num_trajectories)
  valid = weights > 0
  pg = surrogate.clipped_surrogate(logp, old_logp, advantages, mask, epsilon, epsilon_high, dual_clip)
  pg_loss = jnp.sum(jnp.where(valid, weights * pg, 0.0))
  metrics = surrogate.clip_fractions(logp, old_logp, advantages, mask, epsilon, epsilon_high)
  if ref_logp is None:
    kl_loss = jnp.zeros((), jnp.float32)
    metrics["kl"] = jnp.zeros((), jnp.float32)
  else:
    kl_t = kl_lib.kl_divergence(logp, ref_logp, kl, mask)
    kl_loss = beta * jnp.sum(jnp.where(valid, weights * kl_t, 0.0))
    metrics["kl"] = jax.lax.stop_gradient(aggregation.masked_mean(kl_t, mask))
  loss = pg_loss + kl_loss
  metrics.update(loss=jax.lax.stop_gradient(loss), pg_loss=jax.lax.stop_gradient(pg_loss),
                 kl_loss=jax.lax.stop_gradient(kl_loss))
  return loss, metrics
