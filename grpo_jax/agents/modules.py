"""The fixed modules around the planner: executor, verifier and generator (AgentFlow, arXiv 2510.05592).

Each is a callable with a small signature, so a rule-based default and a frozen model are
interchangeable:

  executor(a^t, M^t) -> e^t                              runs the action's tool
  verifier(a^t, e^t, M^t, t, T_max) -> v^t ∈ {0, 1}      whether the loop stops after turn t
  generator(q, M^T) -> o                                 the final answer text
"""

from typing import Protocol

from grpo_jax.agents.actions import Action
from grpo_jax.agents.memory import Memory
from grpo_jax.agents.tools import Observation, ToolSet, error


class Executor(Protocol):

  def __call__(self, action: Action, memory: Memory) -> Observation:
    ...


class Verifier(Protocol):

  def __call__(self, action: Action, observation: Observation, memory: Memory, turn: int, max_turns: int) -> bool:
    ...


class Generator(Protocol):

  def __call__(self, query: str, memory: Memory) -> str:
    ...


class ToolExecutor:
  """Runs a tool call with the toolset under a time limit; an answer is its own observation, an
  invalid action an error observation."""

  def __init__(self, toolset: ToolSet, time_limit: float = 1.0):
    if not time_limit > 0:
      raise ValueError(f"tool time limit must be > 0, got {time_limit}")
    self.toolset, self.time_limit = toolset, time_limit

  def __call__(self, action: Action, memory: Memory) -> Observation:
    if action.kind == "tool":
      return self.toolset.call(action.tool, action.args, memory, self.time_limit)
    if action.kind == "answer":
      return Observation(action.answer, ok=True)
    return error(action.error)


def rule_verifier(action: Action, observation: Observation, memory: Memory, turn: int, max_turns: int) -> bool:
  """v^t = 1 on a final-answer action or when the turn budget is spent."""
  del observation, memory
  return action.kind == "answer" or turn >= max_turns


class RuleGenerator:
  """o = `#### <answer>` from the memory: the final answer if the planner gave one; otherwise, with
  `use_last_result`, the last successful tool result; else the empty string (no answer)."""

  def __init__(self, use_last_result: bool = True):
    self.use_last_result = use_last_result

  def __call__(self, query: str, memory: Memory) -> str:
    del query
    for entry in reversed(memory.entries):
      if entry.action.kind == "answer":
        return f"#### {entry.action.answer}"
    results = memory.results()
    if self.use_last_result and results:
      return f"#### {results[-1][1]}"
    return ""
