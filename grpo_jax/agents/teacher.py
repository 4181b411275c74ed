"""Teacher trajectories from the ground truth, for the planner's SFT warm start.

Each reference step `a<op>b=c` becomes a calculator call whose sub-goal names the operation,
then the final answer:

  (8-7+7)*4   ->   "sub 7: calc 8-7", "add 7: calc 1+7", "mul 4: calc 8*4", "answer: 32"

The script is played through the same episode loop as the policy (`run_episodes` with a
`ScriptedPlanner`), so the SFT prompts are exactly the prompts the planner will see.
"""

from typing import Sequence

from grpo_jax.agents.actions import answer_action, tool_action
from grpo_jax.data.example import Example
from grpo_jax.data.steps import reference_steps

SUBGOALS = {"+": "add", "-": "sub", "*": "mul"}


def teacher_script(example: Example) -> list[str]:
  """The action texts of the ground-truth trajectory of an example whose solution is `a<op>b=c` steps.

  Raises:
    ValueError: when the example has no such solution.
  """
  steps = reference_steps(example.solution)
  actions = [tool_action(f"{SUBGOALS[s.op]} {s.b}", "calc", f"{s.a}{s.op}{s.b}") for s in steps]
  return actions + [answer_action(example.answer)]


def teacher_scripts(examples: Sequence[Example]) -> list[list[str]]:
  """`teacher_script` of each example."""
  return [teacher_script(e) for e in examples]
