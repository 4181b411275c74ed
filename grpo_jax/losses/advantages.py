"""Critic-free advantage estimators: GRPO outcome and process supervision, RLOO, REINFORCE++."""

from typing import Literal

import chex
import jax
import jax.numpy as jnp

from grpo_jax.losses import _checks
from grpo_jax.losses import gae as gae_lib

Scale = Literal["group", "batch", "none"]


def _std(x: chex.Array, axis, ddof: int, where=None) -> chex.Array:
  """Masked `(std, mean)` along `axis` (keepdims); `ddof` as in NumPy, guarded for tiny counts."""
  if where is None:
    where = jnp.ones_like(x, dtype=bool)
  n = jnp.sum(where, axis=axis, keepdims=True)
  mean = jnp.sum(jnp.where(where, x, 0.0), axis=axis, keepdims=True) / jnp.maximum(n, 1)
  sq = jnp.sum(jnp.where(where, (x - mean) ** 2, 0.0), axis=axis, keepdims=True)
  return jnp.sqrt(sq / jnp.maximum(n - ddof, 1)), mean


def _safe_div(x: chex.Array, denom: chex.Array) -> chex.Array:
  """x / denom, with 0/0 → 0: a group with equal rewards has 0 advantage even when eps = 0."""
  return x / jnp.where(denom > 0, denom, 1.0)


def group_advantages(
    rewards: chex.Array,
    *,
    scale: Scale = "group",
    eps: float = 1e-4,
    ddof: int = 0,
) -> chex.Array:
  """GRPO outcome-supervision advantages (DeepSeekMath §4.1.2, arXiv 2402.03300).

    Â_i = (r_i − mean(r)) / (std(r) + eps)     over the G rewards of one prompt.

  `scale="group"` is the paper; `"batch"` divides the group-centred rewards by the
  std of all rewards in the batch; `"none"` keeps r_i − mean(r) (Dr. GRPO, arXiv
  2503.20783). A group whose rewards are all equal gets 0 advantage.

  Args:
    rewards: `[P, G]` scalar rewards, P prompts with G samples each.
    scale: which standard deviation divides the centred rewards.
    eps: added to the std.
    ddof: delta degrees of freedom of the std (0: population, 1: sample).

  Returns:
    `[P, G]` float32 advantages, the same for every token of o_i.
  """
  chex.assert_rank(rewards, 2)
  r = _checks.f32(rewards)
  centred = r - jnp.mean(r, axis=-1, keepdims=True)
  if scale == "group":
    std, _ = _std(r, axis=-1, ddof=ddof)
    return _safe_div(centred, std + eps)
  if scale == "batch":
    std, _ = _std(r, axis=None, ddof=ddof)
    return _safe_div(centred, std + eps)
  if scale == "none":
    return centred
  raise ValueError(f"group_advantages: unknown scale {scale!r}; expected 'group', 'batch' or 'none'")


def process_advantages(
    step_rewards: chex.Array,
    step_ends: chex.Array,
    step_mask: chex.Array,
    mask: chex.Array,
    *,
    scale: Scale = "group",
    center_tokens: bool = False,
    eps: float = 1e-4,
    ddof: int = 0,
) -> chex.Array:
  """GRPO process-supervision advantages (DeepSeekMath §4.1.3, arXiv 2402.03300).

    r̃ = (r − mean(R)) / (std(R) + eps),   R = all step rewards of the G outputs of a prompt,
    Â_{i,t} = Σ_{j : index(j) ≥ t} r̃_i^{index(j)}.

  `scale="none"` keeps r − mean(R) (as Dr. GRPO does for outcome rewards): with a learned reward
  model's continuous scores, dividing by a small group std turns score noise into unit advantages.

  The r̃ average zero over steps, but the suffix sums do not average zero over tokens: a step
  counts once for every token before its end, so when later steps score lower (after a first error
  every later step is wrong) nearly every token gets a negative advantage, and the update pushes
  down the sampled tokens as a whole. `center_tokens=True` subtracts the group's mean token
  advantage, Â_{i,t} − mean_{i',t'} Â_{i',t'} (an option of grpo_jax, not of the paper). That
  constant leaves the expected gradient unchanged only when every token weighs the same (a sum over
  tokens); under the paper's mean over each output's tokens it adds c · ∇log π(o) / |o|, which with
  c > 0 (a negative drift removed) pushes towards short outputs.

  Args:
    step_rewards: `[P, G, K]` reward of step j of output i, K the most steps.
    step_ends: `[P, G, K]` int, index(j): the token position (in `[0, T)`) where step j ends.
    step_mask: `[P, G, K]` true for real steps (outputs have different step counts).
    mask: `[P, G, T]` completion mask.
    scale: "group" divides by the std of R, "none" does not.
    center_tokens: subtract the mean advantage over the group's masked tokens.
    eps: added to the std.
    ddof: delta degrees of freedom of the std.

  Returns:
    `[P, G, T]` float32 token advantages, 0 where `mask` is false.
  """
  chex.assert_rank([step_rewards, step_ends, step_mask, mask], 3)
  chex.assert_equal_shape([step_rewards, step_ends, step_mask])
  chex.assert_equal_shape_prefix([step_rewards, mask], 2)
  chex.assert_type(step_ends, int)
  valid = jnp.asarray(step_mask, bool)
  r = _checks.f32(step_rewards)
  std, mean = _std(r, axis=(-2, -1), ddof=ddof, where=valid)
  if scale == "group":
    normed = jnp.where(valid, _safe_div(r - mean, std + eps), 0.0)
  elif scale == "none":
    normed = jnp.where(valid, r - mean, 0.0)
  else:
    raise ValueError(f"process_advantages: unknown scale {scale!r}; expected 'group' or 'none'")
  num_tokens = mask.shape[-1]
  # Place each normalised step reward on its end token, then sum from the right.
  at_end = jnp.einsum("pgk,pgkt->pgt", normed, jax.nn.one_hot(step_ends, num_tokens, dtype=jnp.float32))
  suffix_sum = jnp.flip(jnp.cumsum(jnp.flip(at_end, -1), axis=-1), -1)
  m = _checks.as_mask(mask)
  if center_tokens:
    count = jnp.maximum(jnp.sum(m, axis=(-2, -1), keepdims=True), 1.0)
    suffix_sum = suffix_sum - jnp.sum(suffix_sum * m, axis=(-2, -1), keepdims=True) / count
  return suffix_sum * m


def rloo_advantages(rewards: chex.Array) -> chex.Array:
  """REINFORCE leave-one-out advantages (Kool et al., 2019; Ahmadian et al., 2024).

    Â_i = r_i − mean_{j≠i} r_j = G/(G−1) · (r_i − mean(r)).

  Args:
    rewards: `[P, G]` rewards, G ≥ 2 samples per prompt.

  Returns:
    `[P, G]` float32 advantages.
  """
  chex.assert_rank(rewards, 2)
  group = rewards.shape[-1]
  if group < 2:
    raise ValueError(f"rloo_advantages: needs at least 2 samples per prompt, got G={group}")
  r = _checks.f32(rewards)
  others = (jnp.sum(r, axis=-1, keepdims=True) - r) / (group - 1)
  return r - others


def whiten(values: chex.Array, mask: chex.Array, *, shift_mean: bool = True, eps: float = 1e-8) -> chex.Array:
  """Normalises masked values by their batch mean and std: (x − mean) / (std + eps).

  The batch-level normalisation of REINFORCE++ (arXiv 2501.03262) and PPO's
  optional advantage whitening. `shift_mean=False` only rescales. 0 where masked out.
  """
  chex.assert_equal_shape([values, mask])
  x, valid = _checks.f32(values), jnp.asarray(mask, bool)
  std, mean = _std(x, axis=None, ddof=0, where=valid)
  out = _safe_div(x - mean if shift_mean else x, std + eps)
  return jnp.where(valid, out, 0.0)


def reinforce_pp_advantages(token_rewards: chex.Array, mask: chex.Array, gamma: float = 1.0) -> chex.Array:
  """REINFORCE++ advantages (arXiv 2501.03262): whitened reward-to-go.

    A_t = whiten_batch( Σ_{k≥t} γ^{k−t} r_k ),

  with `token_rewards` the KL-penalised rewards of DeepSeekMath eq. 2 (see
  `kl_penalized_rewards`). No critic, no groups: the batch normalises.

  Args:
    token_rewards: `[B, T]` per-token rewards.
    mask: `[B, T]` completion mask.
    gamma: discount.

  Returns:
    `[B, T]` float32 advantages.
  """
  returns = gae_lib.discounted_returns(token_rewards, mask, gamma)
  return whiten(returns, mask)
