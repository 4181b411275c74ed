"""The action format (grpo_jax/agents/actions.py): a sub-goal plus a tool call, or a final answer."""

import pytest

from grpo_jax import agents


def test_tool_call():
  action = agents.parse_action(" mul 4: calc 8*4 ")
  assert (action.kind, action.subgoal, action.tool, action.args, action.call) == ("tool", "mul 4", "calc", "8*4",
                                                                                  "calc 8*4")
  assert agents.parse_action("look up: recall last") == agents.Action("tool", "look up: recall last", subgoal="look up",
                                                                      tool="recall", args="last")
  assert agents.parse_action(": calc 1+1").subgoal == ""
  assert agents.parse_action("x: calc a: b").args == "a: b"  # only the first ':' separates the sub-goal


def test_answer():
  assert agents.parse_action("answer: 32") == agents.Action("answer", "answer: 32", answer="32")
  assert agents.parse_action("Answer : 3/4").answer == "3/4"


@pytest.mark.parametrize("text,message", [
    ("", "empty action"), ("calc 8*4", "no ':'"), ("answer:", "empty final answer"), ("goal:", "no tool"),
    ("a: calc 1\nb: calc 2", "one line"), ("x" * 600, "longer than 512"),
])
def test_invalid(text, message):
  action = agents.parse_action(text)
  assert action.kind == "invalid" and message in action.error


def test_round_trip():
  assert agents.parse_action(agents.tool_action("add 7", "calc", "1+7")).call == "calc 1+7"
  assert agents.parse_action(agents.answer_action("8")).answer == "8"
  with pytest.raises(ValueError):
    agents.tool_action("a: b", "calc", "1")
