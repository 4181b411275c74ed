"""A replay buffer of historical samples for iterative RL (DeepSeekMath §4.1.4, Algorithm 1).

After each iteration the reward model "continues training on samples of the current policy,
replaying 10% historical data": `mix(state, new_rows, fraction=0.1)` returns the new rows plus
historical rows drawn from the buffer such that historical rows are `fraction` of the mixed set,
n_hist = min(size, round(n_new · f / (1 − f))), then adds the new rows to the history.

The history is a uniform sample of every row ever added (reservoir sampling, Vitter's
Algorithm R), at most `capacity` rows. Rows are dicts of NumPy arrays with a leading row axis
(e.g. `RewardData._asdict()`). The state is plain NumPy (`state_dict`: fixed shapes, which a
training checkpoint holds), and every random draw comes from `default_rng([seed, draws])`, so a
run restored from a saved state continues exactly as the uninterrupted one.
"""

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np


class ReplayState(NamedTuple):
  """The buffer. `columns[name]` is `[capacity, ...]`; rows `[0, size)` are held."""
  columns: dict[str, np.ndarray]
  size: int
  seen: int
  draws: int
  seed: int


def _rng(state: ReplayState) -> np.random.Generator:
  return np.random.default_rng([state.seed, state.draws])


def init_replay(example_rows: Mapping[str, np.ndarray], capacity: int, seed: int = 0) -> ReplayState:
  """An empty buffer for rows shaped like `example_rows` (only their shapes and dtypes are used)."""
  if capacity < 1:
    raise ValueError(f"replay capacity must be >= 1, got {capacity}")
  columns = {name: np.zeros((capacity, *np.shape(x)[1:]), np.asarray(x).dtype) for name, x in example_rows.items()}
  return ReplayState(columns, 0, 0, 0, int(seed))


def _num_rows(rows: Mapping[str, np.ndarray], state: ReplayState) -> int:
  if set(rows) != set(state.columns):
    raise ValueError(f"replay rows have fields {sorted(rows)}, the buffer {sorted(state.columns)}")
  counts = {name: np.shape(x)[0] for name, x in rows.items()}
  if len(set(counts.values())) != 1:
    raise ValueError(f"replay rows differ in length: {counts}")
  for name, x in rows.items():
    if np.shape(x)[1:] != state.columns[name].shape[1:]:
      raise ValueError(f"replay field {name}: rows of shape {np.shape(x)[1:]}, "
                       f"the buffer holds {state.columns[name].shape[1:]}")
  return next(iter(counts.values()))


def add(state: ReplayState, rows: Mapping[str, np.ndarray]) -> ReplayState:
  """Adds rows by reservoir sampling: row number m (0-based, over all rows ever added) takes a free
  slot while m < capacity, else replaces slot j ~ U{0..m} if j < capacity, so the history stays a
  uniform sample of everything added."""
  n = _num_rows(rows, state)
  capacity = next(iter(state.columns.values())).shape[0]
  rng = _rng(state)
  columns = {name: col.copy() for name, col in state.columns.items()}
  size = state.size
  for i in range(n):
    m = state.seen + i
    if m < capacity:
      slot = m
      size = m + 1
    else:
      slot = int(rng.integers(0, m + 1))
      if slot >= capacity:
        continue
    for name, col in columns.items():
      col[slot] = rows[name][i]
  return ReplayState(columns, size, state.seen + n, state.draws + 1, state.seed)


def sample(state: ReplayState, n: int) -> tuple[dict[str, np.ndarray], ReplayState]:
  """`n` distinct historical rows (n <= size), uniformly without replacement."""
  if not 0 <= n <= state.size:
    raise ValueError(f"cannot draw {n} rows from a replay buffer holding {state.size}")
  index = np.sort(_rng(state).choice(state.size, size=n, replace=False))
  return {name: col[index] for name, col in state.columns.items()}, state._replace(draws=state.draws + 1)


def num_replayed(num_new: int, size: int, fraction: float) -> int:
  """n_hist = min(size, round(n_new · f / (1 − f))): historical rows that make `fraction` of the mix."""
  if not 0.0 <= fraction < 1.0:
    raise ValueError(f"replay fraction must be in [0, 1), got {fraction}")
  return min(size, int(round(num_new * fraction / (1.0 - fraction))))


def mix(state: ReplayState, new_rows: Mapping[str, np.ndarray], fraction: float = 0.1
        ) -> tuple[dict[str, np.ndarray], ReplayState]:
  """The new rows, then `num_replayed` historical ones; the new rows then join the history.

  Returns:
    (mixed rows, the state after drawing and adding).
  """
  n_new = _num_rows(new_rows, state)
  replay, state = sample(state, num_replayed(n_new, state.size, fraction))
  mixed = {name: np.concatenate([np.asarray(new_rows[name]), replay[name]], axis=0) for name in state.columns}
  return mixed, add(state, new_rows)


# SERIALISATION


def state_dict(state: ReplayState) -> dict:
  """A nested dict of NumPy arrays, {"columns": {name: [capacity, ...]}, "size", "seen", "draws",
  "seed"}: a pytree of fixed shapes for an orbax checkpoint (`training.Checkpointer`)."""
  out = {"columns": dict(state.columns)}
  out.update({name: np.asarray(getattr(state, name), np.int64) for name in ("size", "seen", "draws", "seed")})
  return out


def from_state_dict(d: Mapping) -> ReplayState:
  """Inverse of `state_dict`."""
  missing = [k for k in ("columns", "size", "seen", "draws", "seed") if k not in d]
  if missing:
    raise ValueError(f"replay state lacks {', '.join(missing)}")
  columns = {name: np.array(v) for name, v in d["columns"].items()}
  if not columns:
    raise ValueError("replay state has no columns")
  return ReplayState(columns, *(int(np.asarray(d[k])) for k in ("size", "seen", "draws", "seed")))
