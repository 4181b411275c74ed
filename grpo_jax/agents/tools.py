"""The tool interface: a name, argument parsing, execution under a time limit, a result or a clear error.

A tool call never raises and never runs code from its arguments: `call_tool` turns every failure
(bad arguments, a limit, an exception inside the tool, the time limit) into an error `Observation`,
the text the executor hands back to the planner.
"""

import abc
import dataclasses
import threading
import time
from typing import Any, Mapping, Sequence

MAX_OBSERVATION_CHARS = 200  # error messages and results longer than this are cut


class ToolError(Exception):
  """A tool call that cannot run or complete; the message becomes the error observation."""


@dataclasses.dataclass(frozen=True)
class Observation:
  """e^t, what the executor hands back: a result, or an error message (`ok` False)."""
  text: str
  ok: bool


class Deadline:
  """A point in time a cooperative tool checks while it works (`check` raises ToolError after it)."""

  def __init__(self, seconds: float):
    self.seconds = seconds
    self.end = time.monotonic() + seconds

  def expired(self) -> bool:
    return time.monotonic() > self.end

  def check(self) -> None:
    if self.expired():
      raise ToolError(f"time limit of {self.seconds:g} s exceeded")


class Tool(abc.ABC):
  """Base class of tools: subclasses set `name` and `description` and implement `execute` (and `parse`).

  `cooperative` tools call `deadline.check()` often enough themselves and run inline; the others run
  in a daemon thread that is abandoned at the time limit.
  """
  name: str = ""
  description: str = ""
  cooperative: bool = False

  def parse(self, args: str) -> Any:
    """Validates the argument text; raises ToolError with a clear message."""
    return args

  @abc.abstractmethod
  def execute(self, parsed: Any, context: Any, deadline: Deadline) -> str:
    """Runs the parsed call and returns the result text; raises ToolError on failure."""


def _cut(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[:limit - 3] + "..."


def error(message: str) -> Observation:
  return Observation(f"error: {_cut(message)}", ok=False)


def _run_in_thread(tool: Tool, parsed: Any, context: Any, deadline: Deadline) -> str:
  outcome = {}

  def target():
    try:
      outcome["result"] = tool.execute(parsed, context, deadline)
    except BaseException as err:  # pylint: disable=broad-except; reported as the observation
      outcome["error"] = err

  worker = threading.Thread(target=target, name=f"tool-{tool.name}", daemon=True)
  worker.start()
  worker.join(max(deadline.end - time.monotonic(), 0.0))
  if worker.is_alive():
    raise ToolError(f"time limit of {deadline.seconds:g} s exceeded")
  if "error" in outcome:
    raise outcome["error"]
  return outcome["result"]


def call_tool(tool: Tool, args: str, context: Any = None, time_limit: float = 1.0) -> Observation:
  """Parses and runs one call within `time_limit` seconds; every failure is an error observation.

  Args:
    tool: the tool.
    args: the argument text as the planner wrote it.
    context: what the tool may read besides its arguments (the agent's memory).
    time_limit: seconds for parsing and execution together.

  Returns:
    `Observation(result, ok=True)`, or `Observation("error: ...", ok=False)`.
  """
  deadline = Deadline(time_limit)
  try:
    parsed = tool.parse(args)
    deadline.check()
    if tool.cooperative:
      result = tool.execute(parsed, context, deadline)
    else:
      result = _run_in_thread(tool, parsed, context, deadline)
    deadline.check()
  except ToolError as err:
    return error(f"{tool.name}: {err}")
  except RecursionError:
    return error(f"{tool.name}: input nested too deeply")
  except MemoryError:
    return error(f"{tool.name}: out of memory")
  except Exception as err:  # pylint: disable=broad-except; a buggy tool must not crash the rollout
    return error(f"{tool.name}: {type(err).__name__}: {err}")
  return Observation(_cut(result), ok=True)


class ToolSet:
  """K, the tools the planner may call, by name."""

  def __init__(self, tools: Sequence[Tool]):
    names = [t.name for t in tools]
    if len(set(names)) != len(names) or not all(names):
      raise ValueError(f"tool names must be distinct and non-empty, got {names}")
    self.tools: Mapping[str, Tool] = {t.name: t for t in tools}

  def __contains__(self, name: str) -> bool:
    return name in self.tools

  def names(self) -> list[str]:
    return list(self.tools)

  def describe(self) -> str:
    """One line per tool, `name: description`, for prompts of models that read instructions."""
    return "\n".join(f"{t.name}: {t.description}" for t in self.tools.values())

  def call(self, name: str, args: str, context: Any = None, time_limit: float = 1.0) -> Observation:
    """`call_tool` on the tool called `name`; an unknown name is an error observation."""
    if name not in self.tools:
      return error(f"unknown tool {_cut(name, 40)!r}; tools: {', '.join(self.tools)}")
    return call_tool(self.tools[name], args, context, time_limit)
