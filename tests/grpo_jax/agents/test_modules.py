"""Executor, verifier and generator (grpo_jax/agents/modules.py), the rule-based defaults."""

import pytest

from grpo_jax import agents


def test_executor():
  executor = agents.ToolExecutor(agents.math_toolset(), time_limit=0.5)
  memory = agents.Memory(50)
  assert executor(agents.parse_action("mul 4: calc 8*4"), memory) == agents.Observation("32", ok=True)
  assert executor(agents.parse_action("answer: 32"), memory) == agents.Observation("32", ok=True)
  assert executor(agents.parse_action("nonsense"), memory).text.startswith("error: no ':' in the action")
  assert executor(agents.parse_action("x: python print(1)"), memory) == agents.Observation(
      "error: unknown tool 'python'; tools: calc, frac, recall", ok=False)
  with pytest.raises(ValueError):
    agents.ToolExecutor(agents.math_toolset(), time_limit=0)


def test_verifier():
  memory, ok = agents.Memory(50), agents.Observation("1", ok=True)
  assert agents.rule_verifier(agents.parse_action("answer: 1"), ok, memory, 1, 4)
  assert not agents.rule_verifier(agents.parse_action("s: calc 1"), ok, memory, 3, 4)
  assert agents.rule_verifier(agents.parse_action("s: calc 1"), ok, memory, 4, 4)


def test_generator():
  memory = agents.Memory(100)
  assert agents.RuleGenerator()("q", memory) == ""
  memory.update(agents.parse_action("s: calc 2+2"), agents.Observation("4", ok=True))
  memory.update(agents.parse_action("s: calc 2+"), agents.Observation("error: calc: ...", ok=False))
  assert agents.RuleGenerator()("q", memory) == "#### 4"  # the last successful result
  assert agents.RuleGenerator(use_last_result=False)("q", memory) == ""
  memory.update(agents.parse_action("answer: 5"), agents.Observation("5", ok=True))
  assert agents.RuleGenerator(use_last_result=False)("q", memory) == "#### 5"
