"""Multi-turn agents with tools and memory, trained with Flow-GRPO (AgentFlow, arXiv 2510.05592).

  from grpo_jax import agents
  toolset = agents.math_toolset("calc,frac,recall")
  planner = agents.SamplerPlanner(params, config, tokenizer, max_prompt_len=64, max_action_tokens=20,
                                  temperature=0.7)
  trajectories = agents.run_episodes(planner, queries, group_size=8, max_turns=4, key=key,
                                     prompt_format=agents.PromptFormat(64), memory_budget=48,
                                     executor=agents.ToolExecutor(toolset, time_limit=1.0))

The loss is `grpo_jax.losses.flow_grpo`; `TurnBatch` / `turn_rows` / `flow_grpo_objective` glue it
to the training library.
"""

from grpo_jax.agents.actions import Action, answer_action, parse_action, tool_action
from grpo_jax.agents.batching import TurnBatch, flow_grpo_objective, turn_rows
from grpo_jax.agents.calculator import Calculator, evaluate, format_number
from grpo_jax.agents.math_tools import TOOLS, FractionConverter, Recall, math_toolset
from grpo_jax.agents.memory import Memory, MemoryEntry
from grpo_jax.agents.modules import Executor, Generator, RuleGenerator, ToolExecutor, Verifier, rule_verifier
from grpo_jax.agents.planner import SamplerPlanner, ScriptedPlanner, bucket_size
from grpo_jax.agents.episodes import (PlannerOutput, PlanRequest, PromptFormat, Trajectory, Turn, episode_stats,
                                     run_episodes)
from grpo_jax.agents.teacher import teacher_script, teacher_scripts
from grpo_jax.agents.tools import Deadline, Observation, Tool, ToolError, ToolSet, call_tool

__all__ = (
    "Action",
    "Calculator",
    "Deadline",
    "Executor",
    "FractionConverter",
    "Generator",
    "Memory",
    "MemoryEntry",
    "Observation",
    "PlanRequest",
    "PlannerOutput",
    "PromptFormat",
    "Recall",
    "RuleGenerator",
    "SamplerPlanner",
    "ScriptedPlanner",
    "TOOLS",
    "Tool",
    "ToolError",
    "ToolExecutor",
    "ToolSet",
    "Trajectory",
    "Turn",
    "TurnBatch",
    "Verifier",
    "answer_action",
    "bucket_size",
    "call_tool",
    "episode_stats",
    "evaluate",
    "flow_grpo_objective",
    "format_number",
    "math_toolset",
    "parse_action",
    "rule_verifier",
    "run_episodes",
    "teacher_script",
    "teacher_scripts",
    "tool_action",
    "turn_rows",
)
