"""The math toolset (grpo_jax/agents/math_tools.py): fraction converter and memory lookup."""

import pytest

from grpo_jax import agents


@pytest.mark.parametrize("args,text", [
    ("0.75", "3/4 = 0.75"), ("6/8", "3/4 = 0.75"), ("-2.5", "-5/2 = -2.5"), ("4", "4/1 = 4"),
    ("1/3", "1/3 ~ 0.333333"), ("2/3", "2/3 ~ 0.666667"), (" 1.5 / 0.5 ", "3/1 = 3"),
])
def test_fraction_converter(args, text):
  assert agents.math_toolset("frac").call("frac", args) == agents.Observation(text, ok=True)


@pytest.mark.parametrize("args,message", [("x", "expected a number"), ("1/0", "division by zero"),
                                          ("9" * 41, "expected a number"), ("__import__('os')", "expected a number")])
def test_fraction_converter_errors(args, message):
  obs = agents.math_toolset("frac").call("frac", args)
  assert not obs.ok and message in obs.text


def _memory():
  memory = agents.Memory(100)
  tools = agents.math_toolset()
  executor = agents.ToolExecutor(tools)
  for text in ["sub 7: calc 8-7", "oops", "add 7: calc 1+7"]:
    action = agents.parse_action(text)
    memory.update(action, executor(action, memory))
  return memory, tools


def test_recall_reads_earlier_results():
  memory, tools = _memory()
  assert tools.call("recall", "1", memory) == agents.Observation("1", ok=True)
  assert tools.call("recall", "last", memory) == agents.Observation("8", ok=True)
  assert tools.call("recall", "2", memory) == agents.Observation(
      "error: recall: turn 2 has no result; turns with results: 1, 3", ok=False)
  assert not tools.call("recall", "x", memory).ok
  assert tools.call("recall", "last", agents.Memory(10)) == agents.Observation(
      "error: recall: no earlier results", ok=False)


def test_recall_sees_turns_the_rendered_memory_dropped():
  memory, tools = _memory()
  assert memory.render(20) == "(turns 1-3 dropped)"
  assert tools.call("recall", "1", memory) == agents.Observation("1", ok=True)


def test_toolset_by_name():
  assert agents.math_toolset("calc").names() == ["calc"]
  with pytest.raises(ValueError, match="unknown tools"):
    agents.math_toolset("calc,shell")
