"""The planner's action a^t as text: a sub-goal plus a tool call, or a final answer, and its parser.

One line, in one of two forms (the planner ends it with its end token):

  <sub-goal>: <tool> <arguments>      e.g.  "mul 4: calc 8*4"
  answer: <final answer>              e.g.  "answer: 32"

The sub-goal is free text without ':' (it may be empty); the tool is the first word after the
colon. Anything else parses to an invalid action whose `error` says what was expected.
"""

import dataclasses
from typing import Literal

MAX_ACTION_CHARS = 512
ANSWER = "answer"
EXPECTED = "expected '<sub-goal>: <tool> <arguments>' or 'answer: <value>'"

Kind = Literal["tool", "answer", "invalid"]


@dataclasses.dataclass(frozen=True)
class Action:
  """A parsed action.

  Attributes:
    kind: "tool" (a call), "answer" (the final answer) or "invalid".
    text: the action text as written (stripped).
    subgoal: the sub-goal of a tool call.
    tool: the tool's name.
    args: the argument text of the call.
    answer: the final answer.
    error: why an invalid action does not parse.
  """
  kind: Kind
  text: str
  subgoal: str = ""
  tool: str = ""
  args: str = ""
  answer: str = ""
  error: str = ""

  @property
  def call(self) -> str:
    """`tool args` of a call, the answer of a final answer, the text of an invalid action."""
    if self.kind == "tool":
      return f"{self.tool} {self.args}".strip()
    return self.answer if self.kind == "answer" else self.text


def parse_action(text: str) -> Action:
  """Parses the planner's text into an `Action`; never raises."""
  text = text.strip()
  if not text:
    return Action("invalid", text, error=f"empty action; {EXPECTED}")
  if len(text) > MAX_ACTION_CHARS:
    return Action("invalid", text[:MAX_ACTION_CHARS], error=f"action longer than {MAX_ACTION_CHARS} characters")
  if "\n" in text:
    return Action("invalid", text, error=f"an action is one line; {EXPECTED}")
  head, colon, rest = text.partition(":")
  if not colon:
    return Action("invalid", text, error=f"no ':' in the action; {EXPECTED}")
  head, rest = head.strip(), rest.strip()
  if head.lower() == ANSWER:
    if not rest:
      return Action("invalid", text, error="empty final answer")
    return Action("answer", text, answer=rest)
  tool, _, args = rest.partition(" ")
  if not tool:
    return Action("invalid", text, error=f"no tool after ':'; {EXPECTED}")
  return Action("tool", text, subgoal=head, tool=tool, args=args.strip())


def tool_action(subgoal: str, tool: str, args: str) -> str:
  """The text of a tool call: `<sub-goal>: <tool> <args>`."""
  if ":" in subgoal or "\n" in subgoal:
    raise ValueError(f"a sub-goal holds no ':' or newline, got {subgoal!r}")
  return f"{subgoal}: {tool} {args}".strip()


def answer_action(answer: str) -> str:
  """The text of a final answer: `answer: <value>`."""
  return f"{ANSWER}: {answer}"
