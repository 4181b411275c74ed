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
  zeros = np.zeros((s, prompt_len + action_len), np.float32)
  return TurnBatch(
      tokens=np.concatenate([prompt, action], 1), attention_mask=np.concatenate([prompt_mask, action_mask], 1),
      loss_mask=np.concatenate([np.zeros_like(prompt_mask), action_mask], 1), old_logp=zeros, ref_logp=zeros,
      advantages=np.zeros((s,), np.float32), num_turns=num_turns,
      num_trajectories=np.full((s,), len(trajectories), np.float32), trajectory_ids=trajectory_ids)


def flow_grpo_objective(params, batch: TurnBatch, totals: dict, *, config: ModelConfig, loss_kwargs: dict,
                        use_reference: bool, chunk_size: int = 128, temperature: float = 1.0):
  """`flow_grpo.flow_grpo_loss` of a `TurnBatch` for `training.make_train_step`, plus the mean token entropy.

  The policy is π ∝ exp(logits / temperature), the distribution the actions were sampled from.
  """
  del totals  # N travels in the batch: eq. 5 normalises per trajectory, not per sequence or token
  logp, entropy = logprobs_lib.token_logprobs(params, config, batch.tokens, batch.attention_mask,
                                              chunk_size=chunk_size, return_entropy=True, temperature=temperature)
  loss, metrics = flow_grpo.flow_grpo_loss(
      logp, batch.old_logp, batch.ref_logp if use_reference else None, batch.advantages, batch.loss_mask,
      batch.num_turns, num_trajectories=batch.num_trajectories[0], **loss_kwargs)
  m = batch.loss_mask.astype(jnp.float32)
  metrics["entropy"] = jax.lax.stop_gradient(jnp.sum(entropy * m) / jnp.maximum(jnp.sum(m), 1.0))
  return loss, metrics
