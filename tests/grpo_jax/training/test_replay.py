"""Replay buffer of iterative RL (training/replay.py): the replayed fraction, reservoir sampling,
determinism and exact round trips through its serialised state."""

import numpy as np
import pytest

from grpo_jax import training
from grpo_jax.training import replay


def _rows(start, n):
  ids = np.arange(start, start + n)
  return {"id": ids.astype(np.int64), "tokens": np.stack([ids, 2 * ids, 3 * ids], 1).astype(np.int32),
          "label": (ids % 2).astype(np.float32)}


def test_num_replayed():
  assert replay.num_replayed(90, 1000, 0.1) == 10    # 10 of 100 mixed rows
  assert replay.num_replayed(900, 1000, 0.1) == 100
  assert replay.num_replayed(900, 40, 0.1) == 40     # capped by the history
  assert replay.num_replayed(60, 1000, 0.25) == 20
  assert replay.num_replayed(100, 1000, 0.0) == 0
  with pytest.raises(ValueError, match=r"\[0, 1\)"):
    replay.num_replayed(10, 10, 1.0)


def test_mix_keeps_the_stated_fraction():
  state = replay.init_replay(_rows(0, 1), capacity=500, seed=7)
  first, state = replay.mix(state, _rows(0, 180))
  np.testing.assert_array_equal(first["id"], np.arange(180))  # nothing historical yet
  assert (state.size, state.seen) == (180, 180)
  mixed, state = replay.mix(state, _rows(1000, 180))
  assert len(mixed["id"]) == 200
  old = mixed["id"] >= 1000
  assert old.sum() == 180 and (~old).sum() == 20                     # 10% historical
  np.testing.assert_array_equal(mixed["id"][:180], np.arange(1000, 1180))
  assert len(set(mixed["id"][180:])) == 20 and set(mixed["id"][180:]) <= set(range(180))
  np.testing.assert_array_equal(mixed["tokens"][:, 1], 2 * mixed["id"])  # rows stay whole
  assert (state.size, state.seen) == (360, 360)
  mixed, state = replay.mix(state, _rows(2000, 270), fraction=0.25)
  assert len(mixed["id"]) == 360 and (mixed["id"] < 2000).sum() == 90   # 25% historical


def test_reservoir_keeps_a_uniform_sample():
  state = replay.init_replay(_rows(0, 1), capacity=10, seed=0)
  for start in range(0, 100, 30):
    state = replay.add(state, _rows(start, min(30, 100 - start)))
  assert (state.size, state.seen) == (10, 100)
  assert len(set(state.columns["id"])) == 10 and set(state.columns["id"]) <= set(range(100))
  # Each of 20 rows stays with probability capacity / 20 = 1/4.
  counts = np.zeros(20)
  for seed in range(1500):
    s = replay.add(replay.init_replay(_rows(0, 1), capacity=5, seed=seed), _rows(0, 20))
    counts[s.columns["id"]] += 1
  np.testing.assert_allclose(counts / 1500, 0.25, atol=0.05)


def test_deterministic_given_a_seed():
  def run(seed):
    state = replay.init_replay(_rows(0, 1), capacity=50, seed=seed)
    out = []
    for i in range(4):
      mixed, state = replay.mix(state, _rows(100 * i, 40), fraction=0.2)
      out.append(mixed["id"])
    return np.concatenate(out)

  np.testing.assert_array_equal(run(3), run(3))
  assert not np.array_equal(run(3), run(4))


@pytest.mark.parametrize("how", ["state_dict", "orbax"])
def test_resumes_exactly_from_its_serialised_state(tmp_path, how):
  state = replay.init_replay(_rows(0, 1), capacity=30, seed=11)
  for i in range(3):
    _, state = replay.mix(state, _rows(100 * i, 25))
  if how == "state_dict":
    restored = replay.from_state_dict(replay.state_dict(state))
  else:  # inside a training checkpoint, next to the model state
    ckpt = training.Checkpointer(tmp_path / "ckpt")
    ckpt.save(1, {"replay": replay.state_dict(state)}, {"iteration": 1})
    empty = replay.init_replay(_rows(0, 1), capacity=30)
    tree, meta = ckpt.restore({"replay": replay.state_dict(empty)})
    ckpt.close()
    restored = replay.from_state_dict(tree["replay"])
    assert meta == {"iteration": 1}
  assert (restored.size, restored.seen, restored.draws, restored.seed) == (state.size, state.seen, state.draws, 11)
  for name in state.columns:
    np.testing.assert_array_equal(restored.columns[name], state.columns[name])
    assert restored.columns[name].dtype == state.columns[name].dtype
  # The continuation is the uninterrupted run's, row for row.
  a, state_a = replay.mix(state, _rows(900, 25))
  b, state_b = replay.mix(restored, _rows(900, 25))
  for name in a:
    np.testing.assert_array_equal(a[name], b[name])
  np.testing.assert_array_equal(state_a.columns["id"], state_b.columns["id"])


def test_errors():
  state = replay.init_replay(_rows(0, 1), capacity=4)
  with pytest.raises(ValueError, match="fields"):
    replay.add(state, {"id": np.arange(3)})
  with pytest.raises(ValueError, match="shape"):
    replay.add(state, {**_rows(0, 2), "tokens": np.zeros((2, 5), np.int32)})
  with pytest.raises(ValueError, match="cannot draw 1 rows"):
    replay.sample(state, 1)
  with pytest.raises(ValueError, match="capacity must be >= 1"):
    replay.init_replay(_rows(0, 1), capacity=0)
  saved = replay.state_dict(state)
  with pytest.raises(ValueError, match="replay state lacks seen, draws"):
    replay.from_state_dict({k: v for k, v in saved.items() if k not in ("seen", "draws")})
  with pytest.raises(ValueError, match="replay state has no columns"):
    replay.from_state_dict({**saved, "columns": {}})
