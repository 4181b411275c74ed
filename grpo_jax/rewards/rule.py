"""Rule-based rewards `fn(completion, example) -> float`, a registry and batched scoring.

Registered rewards:
  correctness       1.0 iff `extract_answer(completion)` equals `example.answer`
                    (`answers_equal`), else 0.0.
  format            1.0 iff the completion is one or more non-blank step lines,
                    then a final line `#### <answer>` (one space, a non-empty
                    answer), with nothing after it but whitespace and no other
                    `####` line; GSM8K and synthetic style.
  arithmetic_format `format`, and every step parses as `a<op>b=c` (synthetic).
  boxed_format      1.0 iff the completion has a balanced, non-empty
                    `\\boxed{...}` (MATH style).
  step_correctness  correct steps (`check_steps`) / max(#steps, #reference
                    steps): 1.0 only for the full reference path and no extra
                    steps (synthetic; needs an `a<op>b=c` reference solution).
  math_verify       1.0 iff Hugging Face's math-verify finds the completion's
                    answer equal to `example.answer` (symbolic, MATH style),
                    each check under a hard time bound by a `MathVerifier`
                    (`math_verify_reward`; optional package:
                    `pip install 'grpo_jax[math]'`).
"""

import math
from typing import Callable, Sequence

import numpy as np

from grpo_jax.data.example import Example
from grpo_jax.data.steps import (FINAL_MARKER, check_steps, parse_step, reference_steps,
                                 split_steps)
from grpo_jax.data.answer import answers_equal, extract_answer, extract_boxed
from grpo_jax.rewards import math_verify_reward

RewardFn = Callable[[str, Example], float]


def correctness(completion: str, example: Example) -> float:
  """1.0 iff the completion's final answer equals the reference answer."""
  return float(answers_equal(extract_answer(completion), example.answer))


def has_final_answer_format(completion: str) -> bool:
  """Steps, then exactly one final `#### <answer>` line, then only whitespace."""
  lines = completion.rstrip().split("\n")
  if len(lines) < 2:
    return False
  final, steps = lines[-1], lines[:-1]
  if not final.startswith(FINAL_MARKER + " ") or not final[len(FINAL_MARKER) + 1:].strip():
    return False
  return all(line.strip() and FINAL_MARKER not in line for line in steps)


def format_reward(completion: str, example: Example) -> float:
  """1.0 iff `has_final_answer_format(completion)`."""
  del example  # the format does not depend on the problem
  return float(has_final_answer_format(completion))


def arithmetic_format(completion: str, example: Example) -> float:
  """1.0 iff the final-answer format holds and every step is `a<op>b=c`."""
  del example
  ok = has_final_answer_format(completion) and all(
      parse_step(line) is not None for line in split_steps(completion))
  return float(ok)


def boxed_format(completion: str, example: Example) -> float:
  """1.0 iff the completion holds a balanced, non-empty `\\boxed{...}`."""
  del example
  return float(bool(extract_boxed(completion)))


def step_correctness(completion: str, example: Example) -> float:
  """Correct steps over max(#steps, #reference steps); 0.0 with neither."""
  checks = check_steps(example, completion)
  total = max(len(checks), len(reference_steps(example.solution)))
  return sum(checks) / total if total else 0.0


REWARDS: dict[str, RewardFn] = {  # the plain functions; `math_verify` also needs a verifier (`get_reward_fn`)
    "correctness": correctness,
    "format": format_reward,
    "arithmetic_format": arithmetic_format,
    "boxed_format": boxed_format,
    "step_correctness": step_correctness,
}
VERIFIED = "math_verify"  # the reward that checks with a `MathVerifier` (worker processes)
REWARD_NAMES = (*REWARDS, VERIFIED)  # every registered reward
_PACKAGE_CHECKS = {VERIFIED: math_verify_reward.check_installed}  # optional packages, checked when named


def _check_name(name: str) -> None:
  if name not in REWARD_NAMES:
    raise ValueError(f"unknown reward {name!r}; available: {', '.join(sorted(REWARD_NAMES))}")
  if name in _PACKAGE_CHECKS:
    _PACKAGE_CHECKS[name]()


def get_reward_fn(name: str, verifier: math_verify_reward.MathVerifier | None = None) -> RewardFn:
  """Returns the registered reward called `name`; a ValueError in one line when it is unknown or its optional
  package is not installed.

  `math_verify` checks with `verifier`, by default a new `MathVerifier()` of its own (its workers stop when the
  function is dropped); its function has a `batch` form, which `score` uses.
  """
  _check_name(name)
  if name == VERIFIED:
    return math_verify_reward.make_reward_fn(math_verify_reward.MathVerifier() if verifier is None else verifier)
  return REWARDS[name]


def parse_reward_spec(spec: str) -> list[tuple[str, float]]:
  """Parses "name:weight,name:weight" ("name" alone weighs 1.0)."""
  terms, seen = [], set()
  for term in spec.split(","):
    term = term.strip()
    if not term:
      raise ValueError(f"empty term in reward spec {spec!r}")
    name, sep, weight_text = term.partition(":")
    name = name.strip()
    _check_name(name)
    if name in seen:
      raise ValueError(f"reward {name!r} appears twice in spec {spec!r}")
    seen.add(name)
    try:
      weight = float(weight_text) if sep else 1.0
    except ValueError:
      raise ValueError(f"bad weight {weight_text!r} for reward {name!r} in spec {spec!r}") from None
    if not math.isfinite(weight):
      raise ValueError(f"weight of reward {name!r} must be finite, got {weight_text!r}")
    terms.append((name, weight))
  return terms


def make_reward_fn(spec: str, verifier: math_verify_reward.MathVerifier | None = None) -> RewardFn:
  """A weighted sum of registered rewards, e.g. "correctness:1.0,format:0.1".

  `verifier`: the `MathVerifier` of a `math_verify` term, owned by the caller; by default the function has one of
  its own (`get_reward_fn`).

  Raises:
    ValueError: naming an unknown reward, a bad or non-finite weight, a
      repeated reward or an empty term.
  """
  terms = [(get_reward_fn(name, verifier), weight) for name, weight in parse_reward_spec(spec)]

  def reward_fn(completion: str, example: Example) -> float:
    return float(sum(weight * fn(completion, example) for fn, weight in terms))

  def batch(completions: Sequence[str], examples: Sequence[Example]) -> np.ndarray:
    total = np.zeros(len(completions), np.float64)  # the same sums, in the same order, as `reward_fn`
    for fn, weight in terms:
      if hasattr(fn, "batch"):
        values = fn.batch(completions, examples)
      else:
        values = [fn(c, e) for c, e in zip(completions, examples)]
      total = total + weight * np.asarray(values, np.float64)
    return total

  reward_fn.__name__ = f"reward[{spec}]"
  reward_fn.batch = batch  # `score`'s way to run batched rewards (math_verify's worker pool) on a whole batch
  return reward_fn


def score(completions: Sequence[str], examples: Sequence[Example],
          reward_fn: RewardFn | str) -> np.ndarray:
  """Rewards of a batch: float32 [N], completion i scored against example i.

  Args:
    completions: N completions.
    examples: the N examples they answer (repeat each G times for groups).
    reward_fn: a reward function, or a spec string for `make_reward_fn` (built for this call: a `math_verify`
      term's workers start and stop with it; pass a function to keep them).
  """
  if len(completions) != len(examples):
    raise ValueError(f"{len(completions)} completions but {len(examples)} examples")
  if isinstance(reward_fn, str):
    reward_fn = make_reward_fn(reward_fn)
  if hasattr(reward_fn, "batch"):
    return np.asarray(reward_fn.batch(completions, examples), dtype=np.float32)
  return np.asarray([reward_fn(c, e) for c, e in zip(completions, examples)], dtype=np.float32)
