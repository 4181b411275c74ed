"""The safe calculator (grpo_jax/agents/calculator.py): exact results, hostile input refused in time."""

import fractions
import time

import pytest

from grpo_jax import agents
from grpo_jax.agents import calculator

LIMIT = 1.0


def _calc(args: str) -> agents.Observation:
  return agents.call_tool(agents.Calculator(), args, time_limit=LIMIT)


@pytest.mark.parametrize("expression,result", [
    ("8-7", "1"), ("1+7", "8"), ("8*4", "32"), ("(8-7+7)*4", "32"), ("2+3*4", "14"), ("(2+3)*4", "20"),
    ("10-2-3", "5"), ("7/2", "3.5"), ("1/3", "1/3"), ("1/3*3", "1"), ("2**10", "1024"), ("2^-2", "0.25"),
    ("2**3**2", "512"), ("-3**2", "-9"), ("(-3)**2", "9"), ("7//2", "3"), ("-7//2", "-4"), ("7%3", "1"),
    (" 12 + 30 ", "42"), (".5+.25", "0.75"), ("0.1+0.2", "0.3"), ("--4", "4"), ("1/8", "0.125"),
    ("123456789*987654321", "121932631112635269"), ("2**-1/5", "0.1"),
])
def test_valid_expressions(expression, result):
  obs = _calc(expression)
  assert obs == agents.Observation(result, ok=True)


def test_exact_rationals():
  assert calculator.evaluate("1/3+1/6") == fractions.Fraction(1, 2)
  assert calculator.format_number(fractions.Fraction(-7, 4)) == "-1.75"
  assert calculator.format_number(fractions.Fraction(2, 3)) == "2/3"
  assert calculator.format_number(fractions.Fraction(1, 2**13)) == f"{fractions.Fraction(1, 2**13).numerator}/8192"


@pytest.mark.parametrize("expression,message", [
    ("__import__('os')", "unexpected character '_'"),
    ("__import__('os').system('echo hacked')", "unexpected character '_'"),
    ("9**9**9**9", "power too large"),
    ("10**100000", "power too large"),
    ("2**2048*2**2048", "result larger than 2048 bits"),
    ("(10**600)**2", "power too large"),
    ("1" * 10_000, "longer than 256 characters"),
    ("1+" * 5_000 + "1", "longer than 256 characters"),
    ("(" * 200 + "1" + ")" * 200, "longer than 256 characters"),
    ("(" * 60 + "1" + ")" * 60, "nested deeper than 48"),
    ("-" * 100 + "1", "nested deeper than 48"),
    ("1" * 41, "more than 40 digits"),
    ("1/0", "division by zero"),
    ("5%0", "division by zero"),
    ("0**-1", "division by zero"),
    ("2**0.5", "exponent must be an integer"),
    ("1e9", "unexpected character 'e'"),
    ("", "empty expression"),
    ("3 4", "unexpected '4'"),
    ("(1+2", "unexpected end"),
    ("1+2)", "unexpected ')'"),
    ("lambda: 0", "unexpected character 'l'"),
    ("open('/etc/passwd').read()", "unexpected character 'o'"),
    ("1;import os", "unexpected character ';'"),
    ("\x00", "unexpected character"),
])
def test_hostile_and_malformed_input_is_an_error_observation(expression, message):
  start = time.monotonic()
  obs = _calc(expression)
  elapsed = time.monotonic() - start
  assert not obs.ok and obs.text.startswith("error: calc: ") and message in obs.text, obs
  assert elapsed < LIMIT
  assert len(obs.text) <= agents.tools.MAX_OBSERVATION_CHARS


def test_deadline_is_checked():
  obs = agents.call_tool(agents.Calculator(), "+".join(["1"] * 100), time_limit=1e-9)
  assert obs == agents.Observation("error: calc: time limit of 1e-09 s exceeded", ok=False)
