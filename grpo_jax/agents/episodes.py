"""Batched multi-turn episodes: all G trajectories of all queries advance turn by turn together.

At turn t every active trajectory i has the state s_i^t = (q, K, M_i^t); the planner answers all of
them in one batched call, the executor runs each action, the verifier decides v_i^t, and the memory
is updated. Trajectories whose verifier said stop leave the active set, so the next planner call
covers only the rest. At t = 1 every memory is empty and the G trajectories of a query share their
prompt: the planner is asked once per query for G samples (one prefill per query).
"""

import dataclasses
from typing import Callable, NamedTuple, Protocol, Sequence

import jax

from grpo_jax.agents.actions import Action, parse_action
from grpo_jax.agents.memory import Memory
from grpo_jax.agents.modules import Executor, Generator, RuleGenerator, Verifier, rule_verifier
from grpo_jax.agents.tools import Observation

CUE = ">"


class PlanRequest(NamedTuple):
  """One planner input: the prompt of `trajectory` at `turn` (1-based)."""
  trajectory: int
  turn: int
  prompt: str


class PlannerOutput(NamedTuple):
  """One planner action: its text, and for a model planner the token ids the loss trains on.

  Attributes:
    text: the action text (without the end token).
    prompt_ids: the prompt's token ids as the model saw them (after any left truncation), or None.
    action_ids: the generated ids including the end token, or None.
    truncated: whether the action hit the token budget without an end token.
  """
  text: str
  prompt_ids: tuple[int, ...] | None = None
  action_ids: tuple[int, ...] | None = None
  truncated: bool = False


class Planner(Protocol):
  """π_θ(a^t | q, K, M^t): returns len(requests) * num_samples outputs, request-major."""

  def __call__(self, requests: Sequence[PlanRequest], key: jax.Array, num_samples: int = 1
               ) -> list[PlannerOutput]:
    ...


@dataclasses.dataclass(frozen=True)
class PromptFormat:
  """The planner's prompt: `header`, the query, the memory text within the token budget, the cue.

    (8-7+7)*4
    1. calc 8-7 -> 1
    >

  Attributes:
    max_tokens: the prompt budget; the memory gets what the header, query and cue leave.
    count_tokens: text -> tokens.
    header: fixed text before the query (e.g. `ToolSet.describe()` for an instruction model).
  """
  max_tokens: int
  count_tokens: Callable[[str], int] = len
  header: str = ""

  def frame_tokens(self, query: str) -> int:
    """Tokens of the prompt with no memory: the header, the query and the cue (what must fit `max_tokens`)."""
    return self.count_tokens(f"{self.header}{query}\n{CUE}")

  def __call__(self, query: str, memory: Memory) -> str:
    frame = f"{self.header}{query}\n{CUE}"
    room = self.max_tokens - self.count_tokens(frame) - 1  # the newline after the memory text
    text = memory.render(max(room, 0))
    return f"{self.header}{query}\n{text}\n{CUE}" if text else frame


@dataclasses.dataclass
class Turn:
  """One turn of a trajectory: what the planner saw and did, and what came back."""
  prompt: str
  output: PlannerOutput
  action: Action
  observation: Observation


@dataclasses.dataclass
class Trajectory:
  """One episode: query p, sample g; `output` is the generator's final answer text o."""
  query_index: int
  sample_index: int
  query: str
  memory: Memory
  turns: list[Turn] = dataclasses.field(default_factory=list)
  output: str = ""

  @property
  def num_turns(self) -> int:
    return len(self.turns)

  @property
  def answered(self) -> bool:
    return any(t.action.kind == "answer" for t in self.turns)

  @property
  def tool_calls(self) -> int:
    """Turns that were not a final answer: tool calls and invalid actions."""
    return sum(t.action.kind != "answer" for t in self.turns)

  @property
  def tool_errors(self) -> int:
    """Tool calls that came back as an error, invalid actions included."""
    return sum(t.action.kind != "answer" and not t.observation.ok for t in self.turns)


def run_episodes(planner: Planner, queries: Sequence[str], *, group_size: int, max_turns: int, key: jax.Array,
                 prompt_format: PromptFormat, memory_budget: int, executor: Executor,
                 verifier: Verifier = rule_verifier, generator: Generator | None = None) -> list[Trajectory]:
  """Runs G episodes per query for at most `max_turns` turns; trajectories are query-major.

  Args:
    planner: the policy (a `SamplerPlanner`, a `ScriptedPlanner`, ...).
    queries: the P queries q.
    group_size: G, trajectories per query.
    max_turns: T_max.
    key: PRNG key; turn t uses `fold_in(key, t)`.
    prompt_format: builds the planner's prompt from (q, M^t).
    memory_budget: token budget of each memory's text.
    executor: runs the actions.
    verifier: decides when a trajectory stops.
    generator: writes o from (q, M^T); default `RuleGenerator()`.

  Returns:
    P * G trajectories, trajectory p * G + g being sample g of query p.
  """
  if group_size < 1 or max_turns < 1:
    raise ValueError(f"group_size and max_turns must be >= 1, got {group_size}, {max_turns}")
  generator = RuleGenerator() if generator is None else generator
  trajectories = [Trajectory(p, g, q, Memory(memory_budget, prompt_format.count_tokens))
                  for p, q in enumerate(queries) for g in range(group_size)]
  active = list(range(len(trajectories)))
  for turn in range(1, max_turns + 1):
    if not active:
      break
    turn_key = jax.random.fold_in(key, turn)
    if turn == 1:  # shared prompt: one request per query, G samples each
      first = [PlanRequest(p * group_size, 1, prompt_format(q, trajectories[p * group_size].memory))
               for p, q in enumerate(queries)]
      outputs = planner(first, turn_key, group_size)
      prompts = [r.prompt for r in first for _ in range(group_size)]
    else:
      requests = [PlanRequest(i, turn, prompt_format(trajectories[i].query, trajectories[i].memory)) for i in active]
      outputs = planner(requests, turn_key, 1)
      prompts = [r.prompt for r in requests]
    if len(outputs) != len(active):
      raise ValueError(f"the planner returned {len(outputs)} actions for {len(active)} trajectories")
    still_active = []
    for i, prompt, output in zip(active, prompts, outputs):
      traj = trajectories[i]
      action = parse_action(output.text)
      observation = executor(action, traj.memory)
      stop = bool(verifier(action, observation, traj.memory, turn, max_turns))
      traj.memory.update(action, observation, stop)
      traj.turns.append(Turn(prompt, output, action, observation))
      if not stop:
        still_active.append(i)
    active = still_active
  for traj in trajectories:
    traj.output = generator(traj.query, traj.memory)
  return trajectories


def episode_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
  """Mean turns, tool calls and tool-error rate (errors / calls), answer rate, truncated actions."""
  n = max(len(trajectories), 1)
  calls = sum(t.tool_calls for t in trajectories)
  turns = sum(t.num_turns for t in trajectories)
  return {
      "mean_turns": turns / n,
      "tool_calls": calls / n,
      "tool_error_rate": sum(t.tool_errors for t in trajectories) / max(calls, 1),
      "answer_rate": sum(t.answered for t in trajectories) / n,
      "truncated_actions": sum(turn.output.truncated for t in trajectories for turn in t.turns) / max(turns, 1),
  }
