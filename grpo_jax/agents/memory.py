"""M^t, the agent's explicit text memory: one entry per turn, rendered within a token budget.

AgentFlow's update M^{t+1} = f(M^t, a^t, e^t, v^t) appends the turn's call and its result:

  1. calc 8-7 -> 1
  2. calc 1+7 -> 8

The rendered text keeps the newest entries that fit the budget; the dropped oldest ones are
summarised by one deterministic line, `(turns 1-2 dropped)`. Every entry stays available to
tools (the memory-lookup tool reads results that the rendered text no longer shows).
"""

import dataclasses
from typing import Callable

from grpo_jax.agents.actions import Action
from grpo_jax.agents.tools import Observation

MAX_ENTRY_CALL_CHARS = 32
MAX_ENTRY_RESULT_CHARS = 32


def _cut(text: str, limit: int) -> str:
  return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclasses.dataclass(frozen=True)
class MemoryEntry:
  """One turn: the action, its observation, and whether the verifier stopped there."""
  turn: int
  action: Action
  observation: Observation
  stop: bool = False

  def text(self) -> str:
    call = "answer" if self.action.kind == "answer" else _cut(self.action.call, MAX_ENTRY_CALL_CHARS)
    return f"{self.turn}. {call} -> {_cut(self.observation.text, MAX_ENTRY_RESULT_CHARS)}"


class Memory:
  """The memory of one trajectory.

  Args:
    budget: the most tokens `render` returns (newlines included).
    count_tokens: text -> number of tokens (default: characters, the tiny model's tokenizer).
  """

  def __init__(self, budget: int, count_tokens: Callable[[str], int] = len):
    if budget < 0:
      raise ValueError(f"memory budget must be >= 0, got {budget}")
    self.budget = budget
    self.count_tokens = count_tokens
    self.entries: list[MemoryEntry] = []

  def update(self, action: Action, observation: Observation, stop: bool = False) -> MemoryEntry:
    """f(M^t, a^t, e^t, v^t): appends turn t = len(entries) + 1."""
    entry = MemoryEntry(len(self.entries) + 1, action, observation, stop)
    self.entries.append(entry)
    return entry

  def results(self) -> list[tuple[int, str]]:
    """(turn, result) of every successful tool call, oldest first."""
    return [(e.turn, e.observation.text) for e in self.entries if e.action.kind == "tool" and e.observation.ok]

  def render(self, budget: int | None = None) -> str:
    """The memory text: the newest entries within min(budget, self.budget) tokens.

    When entries are dropped, the first line is `(turns a-b dropped)`, counted in the budget;
    if not even that line fits, the text is empty.
    """
    budget = self.budget if budget is None else min(budget, self.budget)
    lines = [e.text() for e in self.entries]
    for keep in range(len(lines), -1, -1):
      dropped = len(lines) - keep
      shown = lines[dropped:]
      if dropped:
        span = f"turn {dropped}" if dropped == 1 else f"turns 1-{dropped}"
        shown = [f"({span} dropped)"] + shown
      text = "\n".join(shown)
      if self.count_tokens(text) <= budget:
        return text
    return ""
