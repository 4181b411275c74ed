"""Batched multi-turn episodes (grpo_jax/agents/episodes.py) with a scripted planner: memory, turns, active sets."""

import jax
import pytest

from grpo_jax import agents

QUERIES = ["(8-7+7)*4", "5+3"]
SCRIPTS = [
    ["sub 7: calc 8-7", "add 7: calc 1+7", "mul 4: calc 8*4", "answer: 32"],  # query 0: the teacher's path
    ["oops", "s: calc 1+", "m: calc 8*4", "n: recall last", "answer: never reached"],  # runs out of turns
    ["add 3: calc 5+3", "answer: 8"],  # query 1
    ["answer: 9"],
]


class Recording(agents.ScriptedPlanner):
  """A scripted planner that records each call's (turn, number of requests, samples per request)."""

  def __init__(self, scripts):
    super().__init__(scripts)
    self.calls = []

  def __call__(self, requests, key, num_samples=1):
    self.calls.append((requests[0].turn, len(requests), num_samples))
    return super().__call__(requests, key, num_samples)


def _run(planner=None, max_tokens=100, generator=None, max_turns=4):
  planner = planner or Recording(SCRIPTS)
  trajectories = agents.run_episodes(
      planner, QUERIES, group_size=2, max_turns=max_turns, key=jax.random.PRNGKey(0),
      prompt_format=agents.PromptFormat(max_tokens), memory_budget=100,
      executor=agents.ToolExecutor(agents.math_toolset()), generator=generator)
  return trajectories, planner


def test_turns_memory_and_outputs():
  trajectories, planner = _run()
  assert [t.num_turns for t in trajectories] == [4, 4, 2, 1]
  assert [(t.query_index, t.sample_index) for t in trajectories] == [(0, 0), (0, 1), (1, 0), (1, 1)]
  first = trajectories[0]
  assert first.memory.render() == "1. calc 8-7 -> 1\n2. calc 1+7 -> 8\n3. calc 8*4 -> 32\n4. answer -> 32"
  assert [turn.prompt for turn in first.turns] == [
      "(8-7+7)*4\n>",
      "(8-7+7)*4\n1. calc 8-7 -> 1\n>",
      "(8-7+7)*4\n1. calc 8-7 -> 1\n2. calc 1+7 -> 8\n>",
      "(8-7+7)*4\n1. calc 8-7 -> 1\n2. calc 1+7 -> 8\n3. calc 8*4 -> 32\n>",
  ]
  second = trajectories[1]
  assert [e.text() for e in second.memory.entries] == [
      "1. oops -> error: no ':' in the action; ...", "2. calc 1+ -> error: calc: unexpected end o...",
      "3. calc 8*4 -> 32", "4. recall last -> 32"]
  assert second.memory.render() == "(turns 1-2 dropped)\n3. calc 8*4 -> 32\n4. recall last -> 32"  # 100 tokens
  assert [t.output for t in trajectories] == ["#### 32", "#### 32", "#### 8", "#### 9"]
  assert [t.answered for t in trajectories] == [True, False, True, True]


def test_finished_trajectories_leave_the_active_set():
  _, planner = _run()
  # Turn 1: one request per query with G = 2 samples; then only the trajectories still running.
  assert planner.calls == [(1, 2, 2), (2, 3, 1), (3, 2, 1), (4, 2, 1)]


def test_stats():
  trajectories, _ = _run()
  stats = agents.episode_stats(trajectories)
  # 11 turns; tool calls 3 + 4 + 1 + 0 = 8, of which 2 errors (an invalid action, a bad expression).
  assert stats == pytest.approx({"mean_turns": 11 / 4, "tool_calls": 2.0, "tool_error_rate": 2 / 8,
                                 "answer_rate": 3 / 4, "truncated_actions": 0.0})


def test_turn_budget_and_generator_without_fallback():
  trajectories, _ = _run(max_turns=2, generator=agents.RuleGenerator(use_last_result=False))
  assert [t.num_turns for t in trajectories] == [2, 2, 2, 1]
  assert [t.output for t in trajectories] == ["", "", "#### 8", "#### 9"]


def test_memory_text_fits_the_prompt_budget():
  trajectories, _ = _run(max_tokens=50)
  last = trajectories[0].turns[-1].prompt
  assert last == "(8-7+7)*4\n(turns 1-2 dropped)\n3. calc 8*4 -> 32\n>"
  assert all(len(turn.prompt) <= 50 for t in trajectories for turn in t.turns)


def test_planner_must_answer_every_trajectory():
  with pytest.raises(ValueError, match="returned 1 actions for 4"):
    _run(planner=lambda requests, key, num_samples: [agents.PlannerOutput("answer: 1")])


def test_frame_tokens_count_the_prompt_without_memory():
  from grpo_jax.agents import episodes  # pylint: disable=import-outside-toplevel
  fmt = agents.PromptFormat(max_tokens=100, header="tools: calc\n")
  assert fmt.frame_tokens("1+2") == len("tools: calc\n1+2\n") + len(episodes.CUE)
