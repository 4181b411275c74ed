"""The tool interface (grpo_jax/agents/tools.py): every failure an error observation, within the time limit."""

import time

import pytest

from grpo_jax import agents


class Sleepy(agents.Tool):
  name = "sleepy"
  description = "sleeps for its argument in seconds"

  def parse(self, args):
    try:
      return float(args)
    except ValueError:
      raise agents.ToolError(f"not a number: {args!r}") from None

  def execute(self, parsed, context, deadline):
    time.sleep(parsed)
    return f"slept {parsed}"


class Broken(agents.Tool):
  name = "broken"
  cooperative = True

  def execute(self, parsed, context, deadline):
    return {}["missing"]


class Echo(agents.Tool):
  name = "echo"
  cooperative = True

  def execute(self, parsed, context, deadline):
    return f"{parsed} {context}"


def test_result_and_context():
  assert agents.call_tool(Echo(), "hi", context="ctx") == agents.Observation("hi ctx", ok=True)


def test_time_limit_of_a_non_cooperative_tool():
  start = time.monotonic()
  obs = agents.call_tool(Sleepy(), "5", time_limit=0.2)
  assert time.monotonic() - start < 1.0
  assert obs == agents.Observation("error: sleepy: time limit of 0.2 s exceeded", ok=False)
  assert agents.call_tool(Sleepy(), "0.01", time_limit=1.0) == agents.Observation("slept 0.01", ok=True)


def test_bad_arguments_and_exceptions_are_error_observations():
  assert agents.call_tool(Sleepy(), "soon") == agents.Observation("error: sleepy: not a number: 'soon'", ok=False)
  assert agents.call_tool(Broken(), "x") == agents.Observation("error: broken: KeyError: 'missing'", ok=False)


def test_long_results_are_cut():
  obs = agents.call_tool(Echo(), "x" * 1000)
  assert obs.ok and len(obs.text) == agents.tools.MAX_OBSERVATION_CHARS and obs.text.endswith("...")


def test_toolset():
  tools = agents.ToolSet([Echo(), Sleepy()])
  assert tools.names() == ["echo", "sleepy"] and "echo" in tools and "calc" not in tools
  assert tools.call("echo", "a", "b") == agents.Observation("a b", ok=True)
  assert tools.call("rm", "-rf /") == agents.Observation("error: unknown tool 'rm'; tools: echo, sleepy", ok=False)
  assert tools.describe() == "echo: \nsleepy: sleeps for its argument in seconds"
  with pytest.raises(ValueError, match="distinct"):
    agents.ToolSet([Echo(), Echo()])


def test_a_tool_must_implement_execute():
  class NoExecute(agents.Tool):
    name = "noop"

  with pytest.raises(TypeError, match="execute"):
    NoExecute()
