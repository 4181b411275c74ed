"""Teacher trajectories (grpo_jax/agents/teacher.py): ground-truth steps as calculator calls, then the answer."""

import jax
import pytest

from grpo_jax import agents
from grpo_jax import data
from grpo_jax import rewards


def test_script_of_a_synthetic_example():
  example = data.Example("(8-7+7)*4", "32", "8-7=1\n1+7=8\n8*4=32\n#### 32")
  assert agents.teacher_script(example) == ["sub 7: calc 8-7", "add 7: calc 1+7", "mul 4: calc 8*4", "answer: 32"]


def test_teacher_trajectories_reach_the_answer():
  _, test = data.make_splits(0, 50, seed=3, config=data.SyntheticConfig(min_steps=2, max_steps=4, max_digits=2))
  trajectories = agents.run_episodes(
      agents.ScriptedPlanner(agents.teacher_scripts(test)), [e.question for e in test], group_size=1, max_turns=5,
      key=jax.random.PRNGKey(0), prompt_format=agents.PromptFormat(200), memory_budget=200,
      executor=agents.ToolExecutor(agents.math_toolset("calc")))
  assert rewards.score([t.output for t in trajectories], test, "correctness").tolist() == [1.0] * 50
  for traj, example in zip(trajectories, test):
    assert traj.num_turns == example.metadata["num_steps"] + 1 and traj.tool_errors == 0


def test_needs_step_solutions():
  with pytest.raises(ValueError, match="not of the form"):
    agents.teacher_script(data.Example("q", "3", "Add them: 1+2 is 3.\n#### 3"))
