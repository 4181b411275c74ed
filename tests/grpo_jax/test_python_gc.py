"""grpo_jax.python_gc: the objects alive at the call frozen, young collections every 10k allocations, cycles still
collected."""

import gc
import weakref

import pytest

from grpo_jax import python_gc


@pytest.fixture
def collector_settings():
  """Restores the thresholds afterwards, and the suite's freeze (conftest freezes the heap after collection)."""
  threshold = gc.get_threshold()
  yield
  gc.set_threshold(*threshold)
  gc.freeze()


class _Node:
  def __init__(self):
    self.other = None


def _cycle() -> weakref.ref:
  a, b = _Node(), _Node()
  a.other, b.other = b, a
  return weakref.ref(a)


def test_freezes_what_is_alive_and_raises_the_youngest_threshold(collector_settings):
  gc.unfreeze()
  before = _Node()  # alive at the call: frozen
  python_gc.collect_less()
  assert gc.get_threshold() == (10_000, 10, 10)
  assert gc.get_freeze_count() > 0
  assert not any(obj is before for obj in gc.get_objects())  # no generation holds it: no collection examines it
  after = _Node()
  assert any(obj is after for obj in gc.get_objects())


def test_a_cycle_made_afterwards_is_still_collected_by_the_automatic_collections(collector_settings):
  python_gc.collect_less(youngest=50)
  ref = _cycle()
  kept = [[] for _ in range(1_000)]  # 1,000 net allocations of tracked objects: young collections start on their own
  assert ref() is None and len(kept) == 1_000


def test_a_frozen_cycle_outlives_collections(collector_settings):
  ref = _cycle()  # garbage at the freeze: frozen with the rest (hence: call it once, early)
  python_gc.collect_less()
  gc.collect()
  assert ref() is not None
  gc.unfreeze()
  gc.collect()
  assert ref() is None


def test_bad_threshold_is_one_line():
  with pytest.raises(ValueError, match="youngest must be >= 1, got 0"):
    python_gc.collect_less(youngest=0)
