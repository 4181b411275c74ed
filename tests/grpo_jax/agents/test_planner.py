"""Planners (grpo_jax/agents/planner.py): the sampler planner's buckets, token ids and active sets."""

import jax
import numpy as np
import pytest

from grpo_jax import agents
from grpo_jax import models
from grpo_jax.models import transformer

PROMPT_LEN, ACTION_LEN = 24, 6


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
  tokenizer = models.load_tokenizer(models.tokenizer.save_char_tokenizer(tmp_path_factory.mktemp("tok")))
  config = models.tiny_config(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                              num_key_value_heads=1)
  return transformer.init_params(config, jax.random.key(0)), config, tokenizer


def _planner(policy, **kwargs):
  params, config, tokenizer = policy
  return agents.SamplerPlanner(params, config, tokenizer, max_prompt_len=PROMPT_LEN, max_action_tokens=ACTION_LEN,
                               **kwargs)


def test_bucket_size():
  assert [agents.bucket_size(n) for n in (0, 1, 8, 9, 16, 17, 250)] == [8, 8, 8, 16, 16, 32, 256]
  assert agents.bucket_size(3, min_bucket=2) == 4


def test_outputs_and_token_ids(policy):
  _, _, tokenizer = policy
  planner = _planner(policy, temperature=1.0)
  requests = [agents.PlanRequest(0, 1, "(8-7+7)*4\n>"), agents.PlanRequest(2, 1, "x" * 30 + "\n>")]
  outputs = planner(requests, jax.random.PRNGKey(1), num_samples=2)
  assert len(outputs) == 4 and planner.rows_sampled == 16 and planner.prompts_truncated == 1
  for i, out in enumerate(outputs):
    prompt = requests[i // 2].prompt
    assert list(out.prompt_ids) == tokenizer.encode(prompt, add_special_tokens=False)[-PROMPT_LEN:]
    assert 1 <= len(out.action_ids) <= ACTION_LEN
    assert out.truncated == (out.action_ids[-1] not in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(
        models.tokenizer.IM_END)))
    assert out.text == tokenizer.decode(list(out.action_ids), skip_special_tokens=True)
  again = _planner(policy, temperature=1.0)(requests, jax.random.PRNGKey(1), num_samples=2)
  assert again == outputs  # deterministic for a key


def test_greedy_rows_do_not_depend_on_padding(policy):
  planner = _planner(policy, greedy=True)
  one = planner([agents.PlanRequest(0, 2, "5+3\n>")], jax.random.PRNGKey(0))
  many = planner([agents.PlanRequest(i, 2, p) for i, p in enumerate(["5+3\n>", "9*9\n>", "1-1\n>"] * 3)],
                 jax.random.PRNGKey(0))
  assert many[0] == one[0] and many[3] == one[0]
  assert planner.rows_sampled == 8 + 16


def test_episodes_shrink_the_sampled_rows(policy):
  """A random planner rarely answers: every trajectory runs T_max turns, and sampled rows stay bucketed."""
  planner = _planner(policy, temperature=1.0, min_bucket=4)
  trajectories = agents.run_episodes(planner, ["1+1", "2+2", "3+3"], group_size=2, max_turns=3,
                                     key=jax.random.PRNGKey(0), prompt_format=agents.PromptFormat(PROMPT_LEN),
                                     memory_budget=PROMPT_LEN, executor=agents.ToolExecutor(agents.math_toolset()))
  active = [sum(t.num_turns >= k for t in trajectories) for k in (2, 3)]
  expected = 4 * 2 + sum(agents.bucket_size(n, 4) for n in active if n)  # turn 1: 3 prompts -> 4 rows x G
  assert planner.rows_sampled == expected
  assert all(t.num_turns == 3 or t.answered for t in trajectories)
  assert np.isfinite(agents.episode_stats(trajectories)["tool_error_rate"])


def test_scripted_planner_with_a_tokenizer_gives_the_ids_a_model_planner_would(policy):
  _, _, tokenizer = policy
  request = agents.PlanRequest(0, 1, "0123456789abc")  # 13 characters, cut from the left to 10
  plain, with_ids = (agents.ScriptedPlanner([["answer: 7"]], *args)([request], jax.random.PRNGKey(0))[0]
                     for args in ((), (tokenizer, 10)))
  assert plain == agents.PlannerOutput("answer: 7")
  assert with_ids.text == "answer: 7" and tokenizer.decode(list(with_ids.prompt_ids)) == "3456789abc"
  assert with_ids.action_ids == (*tokenizer.encode("answer: 7", add_special_tokens=False), tokenizer.eos_token_id)
  assert len(with_ids.action_ids) == 10
