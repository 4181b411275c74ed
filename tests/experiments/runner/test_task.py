"""The task's endless, per-epoch shuffled training order (`Task.train_example`)."""

import numpy as np
import pytest

from experiments.runner import config as config_lib
from experiments.runner import task as task_lib


def _task(seed=3, num_train=30, sft_examples=7):
  cfg = config_lib.TaskConfig(num_train=num_train, num_test=4, sft_examples=sft_examples)
  return task_lib.Task(cfg, None, sft_lineage=True, seed=seed)


def test_order_is_a_fresh_permutation_of_the_rl_pool_each_epoch():
  task = _task()
  n = len(task.rl_pool)
  assert n == 23  # 30 problems, the first 7 are SFT's
  # The order as it was first defined (and as runs and checkpoints made before the cache follow it): epoch e
  # is `default_rng([seed, e]).permutation(n)` of the RL pool, drawn afresh for every read.
  expected = [task.rl_pool[np.random.default_rng([3, p // n]).permutation(n)[p % n]] for p in range(4 * n + 5)]
  assert [task.train_example(p) for p in range(4 * n + 5)] == expected
  for epoch in range(4):  # each epoch visits every RL problem once, in its own order
    seen = [task.train_example(epoch * n + i) for i in range(n)]
    assert sorted(map(id, seen)) == sorted(map(id, task.rl_pool))
  assert [task.train_example(i).question for i in range(n)] != [task.train_example(n + i).question
                                                                 for i in range(n)]
  other = _task(seed=4)
  assert [other.train_example(i).question for i in range(n)] != [task.train_example(i).question for i in range(n)]


def test_the_permutation_is_computed_once_per_epoch(monkeypatch):
  calls = []
  real = np.random.default_rng

  def counting(seed):
    calls.append(tuple(seed))
    return real(seed)

  task = _task()
  n = len(task.rl_pool)
  task_lib.epoch_permutation.cache_clear()
  monkeypatch.setattr(task_lib.np.random, "default_rng", counting)
  for position in range(3 * n):  # three epochs, read one example at a time as the methods do
    task.train_example(position)
  task.train_example(10**9)  # iterative RL's reward-model prompts: a far-off epoch, one more permutation
  task.train_example(3 * n - 1)  # ... and back to the RL order: still cached
  assert calls == [(3, 0), (3, 1), (3, 2), (3, 10**9 // n)]


def test_num_validation_carves_the_rl_pool_not_the_test_set():
  from experiments.runner import config as config_lib
  from experiments.runner import task as task_lib
  cfg = config_lib.TaskConfig(num_train=300, num_test=20, sft_examples=100, num_validation=50)
  task = task_lib.Task(cfg, tokenizer=None, sft_lineage=True, seed=0)
  plain = task_lib.Task(config_lib.TaskConfig(num_train=300, num_test=20, sft_examples=100), None, True, 0)
  assert len(task.rl_pool) == 150 and len(task.validation) == 50 and task.test == plain.test
  assert task.sft_pool == plain.sft_pool
  # a seeded draw, not the pool's tail: the two parts are the plain pool, in its order, split by the draw
  held = set(np.random.default_rng([0, 56]).permutation(200)[:50].tolist())
  assert task.validation == [e for i, e in enumerate(plain.rl_pool) if i in held]
  assert task.rl_pool == [e for i, e in enumerate(plain.rl_pool) if i not in held]
  assert task.validation != plain.rl_pool[150:] and sorted(held) != list(range(150, 200))
  assert not {e.question for e in task.validation} & {e.question for e in task.rl_pool + task.test}
  view = task.validation_view()
  assert view.test == task.validation and view.rl_pool == task.rl_pool and task.test == plain.test
  with pytest.raises(config_lib.RunError, match="--num_validation=200 leaves no RL problems of 200"):
    task_lib.Task(config_lib.TaskConfig(num_train=300, sft_examples=100, num_validation=200), None, True, 0)
