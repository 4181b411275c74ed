"""From trajectories to the per-turn training batch of Flow-GRPO, and its objective.

Row s of a `TurnBatch` is one turn: the prompt the planner saw (query and memory text, left
padded) followed by the action it generated (right padded). `loss_mask` is True on the action
tokens only, so the query, the memory text and the tool results (which reach the planner only
through later prompts) are context and never trained.
"""

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import logprobs as logprobs_lib
from grpo_jax.agents.episodes import Trajectory
from grpo_jax.losses import flow_grpo
from grpo_jax.models import ModelConfig
from grpo_jax.training import batch as batch_lib


class TurnBatch(NamedTuple):
  """Per-turn training rows; every field has leading dimension S (rows past the real turns are padding).

  Attributes:
    tokens: `[S, P + A]` prompt (left padded to P) then action (right padded to A).
    attention_mask: `[S, P + A]` False at padding.
    loss_mask: `[S, P + A]` True on action tokens (end token included).
    old_logp: `[S, P + A]` log π_old of the tokens.
    ref_logp: `[S, P + A]` log π_ref of the tokens.
    advantages: `[S]` A_i^t.
    num_turns: `[S]` T_i of the row's trajectory (1 on padding).
    num_trajectories: `[S]` N of the whole batch in every row (survives micro-batch splits).
    trajectory_ids: `[S]` int32 index of the row's trajectory (0 on padding).
    trajectory_tokens: `[S]` L_i = Σ_t |a_i^t|, the action tokens of the row's whole trajectory (1 on padding):
      what the trajectory-level aggregation (`flow_grpo_objective(..., aggregation="trajectory")`) averages over.
  """
  tokens: Any
  attention_mask: Any
  loss_mask: Any
  old_logp: Any
  ref_logp: Any
  advantages: Any
  num_turns: Any
  num_trajectories: Any
  trajectory_ids: Any
  trajectory_tokens: Any


def turn_rows(trajectories: Sequence[Trajectory], prompt_len: int, action_len: int, pad_id: int,
              rows: int | None = None) -> TurnBatch:
  """NumPy rows of every turn of `trajectories` (model-planner outputs with token ids).

  `old_logp`, `ref_logp` and `advantages` are zeros, to fill in; `rows` pads S up to that count.
  """
  turns = [(i, traj.num_turns, turn) for i, traj in enumerate(trajectories) for turn in traj.turns]
  s = len(turns) if rows is None else rows
  if s < len(turns):
    raise ValueError(f"{len(turns)} turns do not fit in {rows} rows")
  prompts = [turn.output.prompt_ids for _, _, turn in turns]
  actions = [turn.output.action_ids for _, _, turn in turns]
  if any(p is None for p in prompts) or any(a is None for a in actions):
    raise ValueError("turn_rows needs the token ids of a model planner's turns")
  prompt, prompt_mask = batch_lib.pad_left(prompts + [[]] * (s - len(turns)), prompt_len, pad_id)
  action = np.full((s, action_len), pad_id, np.int32)
  action_mask = np.zeros((s, action_len), bool)
  for r, ids in enumerate(actions):
    ids = list(ids)[:action_len]
    action[r, :len(ids)] = ids
    action_mask[r, :len(ids)] = True
  num_turns = np.ones((s,), np.float32)
  trajectory_ids = np.zeros((s,), np.int32)
  for r, (i, t, _) in enumerate(turns):
    num_turns[r], trajectory_ids[r] = t, i
  tokens_of = np.bincount(trajectory_ids[:len(turns)], action_mask[:len(turns)].sum(1), len(trajectories))
  trajectory_tokens = np.ones((s,), np.float32)
  trajectory_tokens[:len(turns)] = tokens_of[trajectory_ids[:len(turns)]]
  zeros = np.zeros((s, prompt_len + action_len), np.float32)
  return TurnBatch(
      tokens=np.concatenate([prompt, action], 1), attention_mask=np.concatenate([prompt_mask, action_mask], 1),
      loss_mask=np.concatenate([np.zeros_like(prompt_mask), action_mask], 1), old_logp=zeros, ref_logp=zeros,
      advantages=np.zeros((s,), np.float32), num_turns=num_turns,
      num_trajectories=np.full((s,), len(trajectories), np.float32), trajectory_ids=trajectory_ids,
      trajectory_tokens=trajectory_tokens)


AGGREGATIONS = ("turn", "trajectory")


def flow_grpo_objective(params, batch: TurnBatch, totals: dict, *, config: ModelConfig, loss_kwargs: dict,
                        use_reference: bool, chunk_size: int = 128, temperature: float = 1.0,
                        aggregation: str = "turn"):
  """`flow_grpo.flow_grpo_loss` of a `TurnBatch` for `training.make_train_step`, plus the mean token entropy.

  The policy is π ∝ exp(logits / temperature), the distribution the actions were sampled from. `aggregation`:

    "turn"        AgentFlow eq. 5: (1/N) Σ_i (1/T_i) Σ_t (1/|a_i^t|) Σ_j ℓ, every turn of a trajectory weighs the same;
    "trajectory"  trajectory-level GRPO: (1/N) Σ_i (1/L_i) Σ_t Σ_j ℓ with L_i = Σ_t |a_i^t|, the trajectory one
                  sequence of its action tokens (GRPO's sequence mean; a turn weighs as many tokens as it has).

  "trajectory" is eq. 5's weights with T_i replaced by L_i / |a_i^t| (`batch.trajectory_tokens` over the row's
  action tokens): 1 / (N · |a_i^t| · L_i / |a_i^t|) = 1 / (N · L_i) on every action token of trajectory i.
  """
  del totals  # N travels in the batch: eq. 5 normalises per trajectory, not per sequence or token
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, not {aggregation!r}")
  logp, entropy = logprobs_lib.token_logprobs(params, config, batch.tokens, batch.attention_mask,
                                              chunk_size=chunk_size, return_entropy=True, temperature=temperature)
  turns = batch.num_turns
  if aggregation == "trajectory":
    lengths = jnp.sum(batch.loss_mask, axis=-1).astype(jnp.float32)
    turns = batch.trajectory_tokens / jnp.maximum(lengths, 1.0)
  loss, metrics = flow_grpo.flow_grpo_loss(
      logp, batch.old_logp, batch.ref_logp if use_reference else None, batch.advantages, batch.loss_mask,
      turns, num_trajectories=batch.num_trajectories[0], **loss_kwargs)
  m = batch.loss_mask.astype(jnp.float32)
  metrics["entropy"] = jax.lax.stop_gradient(jnp.sum(entropy * m) / jnp.maximum(jnp.sum(m), 1.0))
  return loss, metrics
