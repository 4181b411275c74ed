"""grpo_jax.data.synthetic_paths: hand-counted paths, the state-following step check, the generator's bounds and
determinism, and the runner's --task=synthetic_paths."""

import collections
import re

import pytest

from experiments.runner import config as config_lib
from experiments.runner import task as task_lib
from grpo_jax.data import step_labels
from grpo_jax.data import synthetic_paths as sp
from grpo_jax.data.example import Example
from grpo_jax.data.steps import check_steps, parse_step, split_steps
from grpo_jax.rewards import rule


def _example(question: str, solution: str = "") -> Example:
  return Example(question=question, answer="", solution=solution, metadata={"task": sp.TASK})


def _value(question: str) -> int:
  """A sum of products by hand (test oracle)."""
  total = 0
  for term in question.split("+"):
    product = 1
    for factor in term.split("*"):
      product *= int(factor)
    total += product
  return total


def test_a_product_of_three_then_a_sum_has_three_paths():
  # 2*3*4+5: the product first (any pair of its three factors, then the rest), then the sum
  assert sp.parse_question("2*3*4+5") == ((2, 3, 4), (5,))
  assert sp.valid_paths("2*3*4+5") == [((2, "*", 3), (4, "*", 6), (5, "+", 24)),
                                       ((2, "*", 4), (3, "*", 8), (5, "+", 24)),
                                       ((3, "*", 4), (2, "*", 12), (5, "+", 24))]
  assert sp.count_paths("2*3*4+5") == 3
  assert sp.count_paths("3*4+5") == 1  # one move at a time: 3*4, then 12+5


def test_equal_values_from_different_terms_are_one_path_text():
  # 2*3+4*5+6: 2*3 makes a second 6. By hand: (2*3, 4*5) in either order, then 6+6 or 6+20 first: 4 paths;
  # 2*3, 6+6, 4*5, 12+20; 4*5, 6+20, 2*3, 26+6. 6 in all, each text once.
  paths = sp.valid_paths("2*3+4*5+6")
  assert len(paths) == len(set(paths)) == sp.count_paths("2*3+4*5+6") == 6
  assert ((2, "*", 3), (6, "+", 6), (4, "*", 5), (12, "+", 20)) in paths
  assert ((4, "*", 5), (6, "+", 20), (2, "*", 3), (6, "+", 26)) in paths
  assert all(p[-1][2] + p[-1][0] == 32 for p in paths)


def test_check_steps_follows_the_state_and_marks_the_first_wrong_step():
  e = _example("2*3*4+5")
  assert sp.check_steps(e, "4*3=12\n2*12=24\n24+5=29\n#### 29") == [True, True, True]  # operands in any order
  assert sp.check_steps(e, "2*4=8\n8*3=24\n5+24=29\n#### 29") == [True, True, True]
  # 6 is not a finished term while 4 still multiplies it: precedence broken at step 2, everything after is wrong
  assert sp.check_steps(e, "2*3=6\n6+5=11\n11*4=44\n#### 44") == [True, False, False]
  assert sp.check_steps(e, "2*3=7\n7*4=28\n28+5=33\n#### 33") == [False, False, False]  # arithmetic
  assert sp.check_steps(e, "2*5=10\n3*4=12") == [False, False]  # 2 and 5 are in different terms
  assert sp.check_steps(e, "2*3=6\n6*4=24\n24+5=29\n29+5=34\n#### 34") == [True, True, True, False]  # past the end
  assert sp.check_steps(e, "2*3=6\n24-6=18") == [True, False]  # '-' is never a move
  assert sp.check_steps(e, "2*3=6\nsix times four") == [True, False]
  assert sp.check_steps(e, "") == []
  # 3*4+5: 4+5 ignores precedence
  assert sp.check_steps(_example("3*4+5"), "4+5=9\n3*9=27\n#### 27") == [False, False]


def test_every_valid_path_checks_and_the_shared_checkers_dispatch_on_the_task():
  for question in ("2*3*4+5", "2*3+4*5+6", "9*2+7+8*3*2"):
    e = _example(question)
    for path in sp.valid_paths(question):
      text = "\n".join(f"{a}{op}{b}={a * b if op == '*' else a + b}" for a, op, b in path)
      assert sp.check_steps(e, text) == [True] * len(path), text
      assert sp.path_of(text) == path
  # the chain task's checker would compare with the reference's j-th step; a paths example uses the state
  e = Example(question="2*3*4+5", answer="29", solution="2*3=6\n6*4=24\n24+5=29\n#### 29",
              metadata={"task": sp.TASK})
  other_path = "3*4=12\n2*12=24\n24+5=29\n#### 29"
  assert check_steps(e, other_path) == [True, True, True]
  assert check_steps(Example(e.question, e.answer, e.solution), other_path) == [False, False, True]  # chain rule
  assert rule.step_correctness(other_path, e) == 1.0
  assert rule.step_correctness("2*3=6\n6+5=11\n11*4=44\n#### 44", e) == pytest.approx(1 / 3)
  labels = step_labels.exact_labels(e, "2*3=6\n6+5=11\n11*4=44\n#### 44", correct=False)
  assert labels.tolist() == [1.0, 0.0, 0.0, 0.0]  # three steps and the answer segment; the first wrong is step 2
  assert step_labels.exact_labels(e, other_path, correct=True).tolist() == [1.0] * 4


def test_problems_within_bounds_and_their_reference_is_a_valid_path():
  config = sp.PathsConfig(min_steps=4, max_steps=8, add_digits=2, max_value=999)
  train, test = sp.make_splits(400, 100, seed=0, config=config)
  assert not {e.question for e in train} & {e.question for e in test}
  assert len({e.question for e in train}) == 400
  steps_seen = collections.Counter()
  for e in train + test:
    assert re.fullmatch(r"[0-9]+([*+][0-9]+)+", e.question)
    terms = [t.split("*") for t in e.question.split("+")]
    assert 2 <= len(terms) and all(len(t) <= sp.MAX_FACTORS for t in terms)
    assert all(2 <= int(f) <= 9 for t in terms if len(t) > 1 for f in t)
    assert all(1 <= int(t[0]) <= 99 for t in terms if len(t) == 1)
    numbers = sum(len(t) for t in terms)
    lines = split_steps(e.solution)
    assert len(lines) == numbers - 1 == e.metadata["num_steps"] and 4 <= len(lines) <= 8
    steps_seen[len(lines)] += 1
    assert int(e.answer) == _value(e.question) <= 999
    assert e.solution.endswith(f"\n#### {e.answer}")
    assert check_steps(e, e.solution) == [True] * len(lines)
    assert all(0 <= parse_step(line).c <= 999 for line in lines)
  assert set(steps_seen) == {4, 5, 6, 7, 8}
  counts = [sp.count_paths(e.question) for e in train[:100]]
  assert min(counts) >= 3  # at least 5 numbers in at least 2 terms: never one path
  # the references are drawn move by move: where the question opens with a product, its first step is that
  # product's first two factors only sometimes
  first = collections.Counter()
  for e in train:
    factors = [int(f) for f in e.question.split("+")[0].split("*")]
    if len(factors) > 1:
      first[sp.path_of(e.solution)[0] == (min(factors[:2]), "*", max(factors[:2]))] += 1
  assert first[True] > 30 and first[False] > 2 * first[True]


def test_deterministic_from_the_seed_and_the_test_set_from_its_own_stream():
  a, b = sp.make_splits(50, 20, seed=3), sp.make_splits(50, 20, seed=3)
  assert a == b and [e.solution for e in a[0]] == [e.solution for e in b[0]]
  assert sp.make_splits(80, 20, seed=3)[1] == a[1]  # growing the train set leaves the test set
  assert sp.make_splits(50, 20, seed=4)[1] != a[1]
  stream = sp.stream(seed=1, exclude={e.question for e in a[1]})
  drawn = [next(stream) for _ in range(30)]
  assert not {e.question for e in drawn} & {e.question for e in a[1]}


@pytest.mark.parametrize("kwargs, message", [
    (dict(min_steps=1), "need 2 <= min_steps <= max_steps"),
    (dict(min_steps=5, max_steps=4), "need 2 <= min_steps <= max_steps"),
    (dict(add_digits=0), "add_digits must be >= 1"),
    (dict(max_value=50), "below two of the largest terms"),
])
def test_bad_config_is_one_line(kwargs, message):
  with pytest.raises(ValueError, match=message):
    sp.PathsConfig(**kwargs)


def test_parse_question_refuses_other_text():
  with pytest.raises(ValueError, match="not a sum of products"):
    sp.parse_question("(2+3)*4")


def test_the_runner_builds_the_paths_task_and_refuses_the_chain_tasks_flags():
  cfg = config_lib.TaskConfig(task="synthetic_paths", num_train=60, num_test=10, sft_examples=20,
                              paths_min_steps=5, paths_max_steps=6)
  task = task_lib.Task(cfg, None, sft_lineage=True, seed=2)
  assert (len(task.sft_pool), len(task.rl_pool), len(task.test)) == (20, 40, 10)
  assert (task.train, task.test) == sp.make_splits(60, 10, seed=2, config=sp.PathsConfig(min_steps=5, max_steps=6))
  assert all(5 <= e.metadata["num_steps"] <= 6 for e in task.train)
  assert task.prompt(task.test[0]) == task.test[0].question + "\n"
  task_lib.check_files(cfg)  # generated: no files
  base = config_lib.Config().replace(task="synthetic_paths")
  base.replace(reward="exact_steps", supervision="process")  # exact step labels exist for it
  with pytest.raises(config_lib.ConfigError, match=r"^--synthetic_max_steps is read only with --task=synthetic "):
    base.replace(synthetic_max_steps=5)
  with pytest.raises(config_lib.ConfigError, match=r"^--paths_max_steps is read only with --task=synthetic_paths"):
    config_lib.Config().replace(paths_max_steps=6)
  with pytest.raises(config_lib.ConfigError, match=r"^--paths_min_steps and --paths_max_steps need 2 <= min <= max"):
    base.replace(paths_min_steps=7, paths_max_steps=6)
  with pytest.raises(config_lib.ConfigError, match=r"^--reward=exact_steps needs --task=synthetic or synthetic_paths"):
    config_lib.Config().replace(task="gsm8k", reward="exact_steps", supervision="process")


def test_grpo_with_exact_step_labels_runs_on_the_paths_task(tmp_path):
  """One GRPO+PS step end to end: SFT on the paths task's solutions, exact step labels as the step rewards."""
  from tests.conftest import run_grpo_math  # pylint: disable=import-outside-toplevel
  summary = run_grpo_math(
      f"--work_dir={tmp_path}", "--task=synthetic_paths", "--max_prompt_len=24", "--max_new_tokens=96",
      "--num_train=100", "--num_test=4", "--sft_examples=50", "--batch_size=2", "--group_size=4",
      "--eval_batch_size=4", "--tiny_layers=1", "--tiny_hidden_size=32", "--sft_steps=2", "--sft_batch_size=4",
      "--steps=1", "--eval_every=0", "--notensorboard", "--reward=exact_steps", "--supervision=process",
      "--prm_max_steps=9")
  assert summary["config"]["task"] == "synthetic_paths" and summary["config"]["supervision"] == "process"
  assert 0.0 <= summary["final_accuracy"] <= 1.0
