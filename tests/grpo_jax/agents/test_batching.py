"""Per-turn batches (grpo_jax/agents/batching.py): the loss mask covers action tokens only."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import agents
from grpo_jax import models
from grpo_jax.losses import flow_grpo

PROMPT_LEN, ACTION_LEN = 64, 20


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return models.load_tokenizer(models.tokenizer.save_char_tokenizer(tmp_path_factory.mktemp("tok")))


def _trajectories(tokenizer):
  scripts = [["sub 7: calc 8-7", "add 7: calc 1+7", "mul 4: calc 8*4", "answer: 32"], ["answer: 31"]]
  return agents.run_episodes(agents.ScriptedPlanner(scripts, tokenizer, PROMPT_LEN), ["(8-7+7)*4"], group_size=2, max_turns=4,
                             key=jax.random.PRNGKey(0), prompt_format=agents.PromptFormat(PROMPT_LEN),
                             memory_budget=PROMPT_LEN, executor=agents.ToolExecutor(agents.math_toolset()))


def test_loss_mask_covers_action_tokens_only(tokenizer):
  trajectories = _trajectories(tokenizer)
  batch = agents.turn_rows(trajectories, PROMPT_LEN, ACTION_LEN, tokenizer.pad_token_id, rows=8)
  turns = [turn for t in trajectories for turn in t.turns]
  assert len(turns) == 5 and batch.tokens.shape == (8, PROMPT_LEN + ACTION_LEN)
  eos = tokenizer.eos_token_id
  for row, turn in enumerate(turns):
    tokens, attention, loss = batch.tokens[row], batch.attention_mask[row], batch.loss_mask[row]
    trained = tokens[loss].tolist()
    assert trained == tokenizer.encode(turn.action.text, add_special_tokens=False) + [eos]
    assert tokenizer.decode(tokens[attention & ~loss].tolist()) == turn.prompt  # context: query and memory
    assert not loss[:PROMPT_LEN].any()  # nothing of the prompt is trained
    # Tool results reach the planner only through the memory lines of later prompts, never under the mask.
    assert "->" not in tokenizer.decode(trained)
  assert tokenizer.decode(batch.tokens[3][batch.attention_mask[3] & ~batch.loss_mask[3]].tolist()).endswith(
      "1. calc 8-7 -> 1\n2. calc 1+7 -> 8\n3. calc 8*4 -> 32\n>")
  assert not batch.attention_mask[5:].any() and not batch.loss_mask[5:].any()  # padding rows
  np.testing.assert_array_equal(batch.num_turns, [4, 4, 4, 4, 1, 1, 1, 1])
  np.testing.assert_array_equal(batch.trajectory_ids, [0, 0, 0, 0, 1, 0, 0, 0])
  np.testing.assert_array_equal(batch.num_trajectories, [2] * 8)
  # L_i: "sub 7: calc 8-7", "add 7: calc 1+7", "mul 4: calc 8*4" (15 characters and the end token each) and
  # "answer: 32" (10 and the end token): 3 * 16 + 11 = 59; the other trajectory "answer: 31" alone: 11
  np.testing.assert_array_equal(batch.trajectory_tokens, [59, 59, 59, 59, 11, 1, 1, 1])


def _fixed_logprobs(monkeypatch):
  """The objective's log-probs are its `params` (an `[S, L]` array), so its gradient is the loss's in log π."""
  monkeypatch.setattr(agents.batching.logprobs_lib, "token_logprobs",
                      lambda params, *args, **kwargs: (params, jnp.zeros_like(params)))


@pytest.mark.parametrize("aggregation", ["turn", "trajectory"])
def test_objective_weights_each_token_by_its_aggregation(tokenizer, monkeypatch, aggregation):
  _fixed_logprobs(monkeypatch)
  batch = agents.turn_rows(_trajectories(tokenizer), PROMPT_LEN, ACTION_LEN, tokenizer.pad_token_id, rows=8)
  old = jnp.full(batch.tokens.shape, -2.0)
  batch = jax.tree.map(jnp.asarray, batch._replace(old_logp=old, ref_logp=old,
                                                    advantages=np.array([1, 1, 1, 1, -1, 0, 0, 0], np.float32)))
  loss = lambda logp: agents.flow_grpo_objective(  # noqa: E731
      logp, batch, {}, config=None, loss_kwargs=dict(epsilon=0.2, beta=0.0), use_reference=False,
      aggregation=aggregation)[0]
  grad = np.asarray(jax.grad(loss)(old))  # at ratio 1: −A_i · w_{s,j} on every action token
  per_row = [grad[r][batch.loss_mask[r]] for r in range(5)]
  for row in per_row:
    np.testing.assert_allclose(row, row[0])  # one weight for every token of a turn
  if aggregation == "turn":  # eq. 5: 1 / (N T_i |a_i^t|), N = 2, T_0 = 4, |a| = 16, 16, 16, 11; T_1 = 1, |a| = 11
    expected = [-1 / (2 * 4 * 16)] * 3 + [-1 / (2 * 4 * 11), 1 / (2 * 1 * 11)]
  else:  # one sequence per trajectory: 1 / (N L_i), L_0 = 59, L_1 = 11
    expected = [-1 / (2 * 59)] * 4 + [1 / (2 * 11)]
  np.testing.assert_allclose([row[0] for row in per_row], expected, rtol=1e-6)
  assert not grad[~np.asarray(batch.loss_mask)].any()


def test_unknown_aggregation_is_refused(tokenizer):
  batch = agents.turn_rows(_trajectories(tokenizer), PROMPT_LEN, ACTION_LEN, tokenizer.pad_token_id, rows=8)
  with pytest.raises(ValueError, match="aggregation must be one of"):
    agents.flow_grpo_objective(None, batch, {}, config=None, loss_kwargs={}, use_reference=False,
                               aggregation="token")


def test_gradient_reaches_action_tokens_only(tokenizer):
  batch = agents.turn_rows(_trajectories(tokenizer), PROMPT_LEN, ACTION_LEN, tokenizer.pad_token_id, rows=8)
  rng = np.random.default_rng(0)
  old = jnp.asarray(rng.normal(size=batch.tokens.shape) - 3, jnp.float32)
  adv = flow_grpo.broadcast_outcome_advantages(jnp.array([[1.0, 0.0]]), batch.trajectory_ids)

  def loss(logp):
    return flow_grpo.flow_grpo_loss(logp, old, old, adv, batch.loss_mask, batch.num_turns, epsilon=0.2, beta=0.1)[0]

  grad = np.asarray(jax.grad(loss)(old + 0.05))
  assert np.all(grad[~batch.loss_mask] == 0) and np.all(grad[batch.loss_mask] != 0)


def test_rows_must_fit(tokenizer):
  with pytest.raises(ValueError, match="5 turns do not fit in 4 rows"):
    agents.turn_rows(_trajectories(tokenizer), PROMPT_LEN, ACTION_LEN, 0, rows=4)
  with pytest.raises(ValueError, match="token ids"):
    trajectories = agents.run_episodes(agents.ScriptedPlanner([["answer: 1"]]), ["q"], group_size=1, max_turns=1,
                                       key=jax.random.PRNGKey(0), prompt_format=agents.PromptFormat(10),
                                       memory_budget=10, executor=agents.ToolExecutor(agents.math_toolset()))
    agents.turn_rows(trajectories, PROMPT_LEN, ACTION_LEN, 0)
