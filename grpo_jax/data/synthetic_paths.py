"""Synthetic sums of products with several valid solution paths per problem.

A problem is a sum of terms, each a product of one-digit factors or a single addend, written
without parentheses; a solution combines two numbers per line, in any order the usual
precedence allows:

  question  "3*4*5+6+7*2"
  solution  "7*2=14\n4*5=20\n3*20=60\n60+14=74\n74+6=80\n#### 80"      (one of 24 valid paths)

A step multiplies two numbers of one unfinished product ('*'), or adds two finished terms ('+'),
so a problem with n numbers takes n - 1 steps whichever path is taken, and every valid step lies
on some path to the answer (both operations are commutative and associative). `check_steps`
follows the state the steps have reached: step j is right iff its arithmetic is right and it is a
valid move from the state the steps before it reached; after a wrong step every later step is
wrong (the state is lost). The reference solution is one path drawn uniformly move by move, so
the demonstrations cover the paths. Generation is deterministic from a seed.
"""

import dataclasses
import functools
import random
from typing import Iterable, Iterator

from grpo_jax.data.example import Example, avoiding, distinct
from grpo_jax.data.step_text import FINAL_MARKER, Step, apply_op, parse_step, split_steps

TASK = "synthetic_paths"  # `Example.metadata["task"]` of these problems: `steps.check_steps` dispatches on it
MAX_FACTORS = 4  # most factors of one product
_MAX_TRIES = 1000

# A state: the terms still to combine, each the sorted values of its remaining factors; sorted, so that states
# reached in different orders compare equal. A term of one value is finished.
State = tuple[tuple[int, ...], ...]


@dataclasses.dataclass(frozen=True)
class PathsConfig:
  """Shape of the problems.

  Attributes:
    min_steps: fewest steps per problem (numbers - 1), >= 2.
    max_steps: most steps per problem.
    add_digits: a single-addend term has 1 to add_digits digits (digit count uniform).
    max_value: the answer, and hence every intermediate value, is at most this.
  """
  min_steps: int = 4
  max_steps: int = 8
  add_digits: int = 2
  max_value: int = 999

  def __post_init__(self):
    if not 2 <= self.min_steps <= self.max_steps:
      raise ValueError(f"need 2 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}")
    if self.add_digits < 1:
      raise ValueError(f"add_digits must be >= 1, got {self.add_digits}")
    if self.max_value < 10**self.add_digits + 9:  # two terms must fit
      raise ValueError(f"max_value {self.max_value} is below two of the largest terms")


def canonical(terms: Iterable[Iterable[int]]) -> State:
  return tuple(sorted(tuple(sorted(term)) for term in terms))


def parse_question(question: str) -> State:
  """'3*4*5+6+7*2' -> its start state ((2, 7), (3, 4, 5), (6,)); ValueError on anything else."""
  try:
    terms = [[int(f) for f in term.split("*")] for term in question.strip().split("+")]
  except ValueError:
    raise ValueError(f"{question!r} is not a sum of products of integers") from None
  if any(f < 0 for term in terms for f in term):
    raise ValueError(f"{question!r} has a negative number")
  return canonical(terms)


def _without(term: tuple[int, ...], a: int, b: int) -> list[int] | None:
  """The term's values with one a and one b removed (two of a when a == b); None if it lacks them."""
  rest = list(term)
  for v in (a, b):
    if v not in rest:
      return None
    rest.remove(v)
  return rest


def successors(state: State, step: Step) -> set[State]:
  """The states `step` can lead to from `state` (empty: it is not a valid move there).

  '*' multiplies two values of one unfinished term; '+' adds two finished terms; '-' is never valid. The
  arithmetic is not checked here. A state may admit a step in several ways when values repeat.
  """
  out = set()
  for i, term in enumerate(state):
    others = state[:i] + state[i + 1:]
    if step.op == "*" and len(term) >= 2:
      rest = _without(term, step.a, step.b)
      if rest is not None:
        out.add(canonical([*others, [*rest, step.c]]))
    elif step.op == "+" and term == (step.a,):
      for j, other in enumerate(others):
        if other == (step.b,):
          out.add(canonical([*others[:j], *others[j + 1:], [step.c]]))
  return out


def moves(state: State) -> list[Step]:
  """The distinct valid steps from `state`, operands in ascending order, results right."""
  found = set()
  for i, term in enumerate(state):
    if len(term) >= 2:
      found.update((term[p], "*", term[q]) for p in range(len(term)) for q in range(p + 1, len(term)))
    elif term:
      found.update((term[0], "+", other[0]) for other in state[i + 1:] if len(other) == 1)
  return [Step(min(a, b), op, max(a, b), apply_op(a, op, b)) for a, op, b in sorted(found)]


def check_steps(example: Example, completion: str) -> list[bool]:
  """Per step of the completion, whether it is right (module docstring): arithmetic right, a valid move from
  the state the steps before it reached, and no step after a wrong one or after the answer is reached."""
  states = {parse_question(example.question)}
  result = []
  for line in split_steps(completion):
    step = parse_step(line)
    ok = bool(states) and step is not None and step.c == apply_op(step.a, step.op, step.b)
    states = set().union(*(successors(s, step) for s in states)) if ok else set()
    result.append(bool(states))
  return result


def path_of(completion: str) -> tuple[tuple[int, str, int], ...]:
  """The path a completion writes: its steps' (smaller operand, op, larger operand), in order; lines that do not
  parse as a step appear as ()."""
  path = []
  for line in split_steps(completion):
    step = parse_step(line)
    path.append(() if step is None else (min(step.a, step.b), step.op, max(step.a, step.b)))
  return tuple(path)


def _step_sets(states: frozenset) -> dict[tuple, frozenset]:
  """Valid steps from a set of states (the possible states after a text), each with the states it leads to."""
  out = {}
  for state in states:
    for step in moves(state):
      key = (step.a, step.op, step.b)
      out[key] = out.get(key, frozenset()) | frozenset(successors(state, step))
  return out


def count_paths(question: str) -> int:
  """How many distinct valid solutions (as written step texts, operands in either order counted once) the
  problem has."""

  @functools.cache
  def count(states: frozenset) -> int:
    nxt = _step_sets(states)
    return 1 if not nxt else sum(count(s) for s in nxt.values())

  return count(frozenset([parse_question(question)]))


def valid_paths(question: str, limit: int = 10_000) -> list[tuple[tuple[int, str, int], ...]]:
  """The distinct valid paths (as `path_of` writes them), at most `limit` of them; ValueError beyond it."""
  paths = []

  def walk(states: frozenset, prefix: tuple):
    nxt = _step_sets(states)
    if not nxt:
      if len(paths) >= limit:
        raise ValueError(f"{question!r} has more than {limit} paths")
      paths.append(prefix)
    for key, after in sorted(nxt.items()):
      walk(after, prefix + (key,))

  walk(frozenset([parse_question(question)]), ())
  return paths


def _terms(rng: random.Random, config: PathsConfig) -> list[list[int]] | None:
  """The terms of one problem in question order, or None on a draw out of bounds."""
  numbers = rng.randint(config.min_steps, config.max_steps) + 1
  num_terms = rng.randint(2, max(2, numbers // 2))
  cuts = sorted(rng.sample(range(1, numbers), num_terms - 1))
  sizes = [b - a for a, b in zip([0, *cuts], [*cuts, numbers])]
  if max(sizes) > MAX_FACTORS:
    return None
  terms = []
  for size in sizes:
    if size == 1:
      digits = rng.randint(1, config.add_digits)
      terms.append([rng.randint(10**(digits - 1), 10**digits - 1)])
    else:
      terms.append([rng.randint(2, 9) for _ in range(size)])
  total = sum(_product(t) for t in terms)
  return terms if total <= config.max_value else None


def _product(values: Iterable[int]) -> int:
  out = 1
  for v in values:
    out *= v
  return out


def _random_path(rng: random.Random, terms: list[list[int]]) -> list[Step]:
  """A solution drawn move by move, each move uniform over the valid ones; operands in question order."""
  terms = [list(t) for t in terms]
  steps = []
  while len(terms) > 1 or len(terms[0]) > 1:
    options = [(i, p, q) for i, t in enumerate(terms) for p in range(len(t)) for q in range(p + 1, len(t))]
    finished = [i for i, t in enumerate(terms) if len(t) == 1]
    options += [(i, j, None) for x, i in enumerate(finished) for j in finished[x + 1:]]
    i, p, q = rng.choice(options)
    if q is None:  # add finished terms i < j; the sum takes i's place
      a, b = terms[i][0], terms[p][0]
      steps.append(Step(a, "+", b, a + b))
      terms[i] = [a + b]
      del terms[p]
    else:  # multiply factors p < q of term i; the product takes p's place
      a, b = terms[i][p], terms[i][q]
      steps.append(Step(a, "*", b, a * b))
      terms[i][p] = a * b
      del terms[i][q]
  return steps


def sample_example(rng: random.Random, config: PathsConfig = PathsConfig()) -> Example:
  """Draws one problem and one of its paths as the reference solution; deterministic given `rng`'s state."""
  for _ in range(_MAX_TRIES):
    terms = _terms(rng, config)
    if terms is not None:
      steps = _random_path(rng, terms)
      question = "+".join("*".join(str(f) for f in t) for t in terms)
      solution = "\n".join([str(s) for s in steps] + [f"{FINAL_MARKER} {steps[-1].c}"])
      return Example(question=question, answer=str(steps[-1].c), solution=solution,
                     metadata={"task": TASK, "num_steps": len(steps), "num_terms": len(terms)})
  raise ValueError(f"no problem satisfies {config}; raise max_value")


def _unique(rng: random.Random, config: PathsConfig, count: int, exclude: set[str]) -> list[Example]:
  return distinct(lambda: sample_example(rng, config), count, exclude, config)


def make_splits(num_train: int, num_test: int, seed: int = 0,
                config: PathsConfig = PathsConfig()) -> tuple[list[Example], list[Example]]:
  """Deterministic train and test sets with no question in common; the test set depends only on
  (num_test, seed, config), as `synthetic.make_splits`'s does."""
  if num_train < 0 or num_test < 0:
    raise ValueError(f"sizes must be >= 0, got {num_train}, {num_test}")
  test = _unique(random.Random(f"{TASK}/{seed}/test"), config, num_test, set())
  train = _unique(random.Random(f"{TASK}/{seed}/train"), config, num_train, {e.question for e in test})
  return train, test


def stream(seed: int = 0, config: PathsConfig = PathsConfig(), exclude: Iterable[str] = ()) -> Iterator[Example]:
  """An endless deterministic stream of problems whose questions avoid `exclude` (see `synthetic.stream`)."""
  rng = random.Random(f"{TASK}/{seed}/stream")
  return avoiding(lambda: sample_example(rng, config), exclude, config)
