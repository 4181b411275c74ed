"""The math toolset K: the calculator, a fraction converter and a lookup of earlier results."""

import fractions
import re

from grpo_jax.agents.calculator import MAX_LITERAL_DIGITS, Calculator, format_number
from grpo_jax.agents.memory import Memory
from grpo_jax.agents.tools import Deadline, Tool, ToolError, ToolSet

_DECIMAL = rf"\d{{1,{MAX_LITERAL_DIGITS}}}(?:\.\d{{1,{MAX_LITERAL_DIGITS}}})?"
_FRACTION = re.compile(rf"\s*(-?{_DECIMAL})\s*(?:/\s*(-?{_DECIMAL}))?\s*")
APPROX_PLACES = 6


class FractionConverter(Tool):
  """`frac <x>`: a decimal or fraction in both forms, `0.75` -> `3/4 = 0.75`, `1/3` -> `1/3 ~ 0.333333`."""
  name = "frac"
  description = "a number as a reduced fraction and a decimal, e.g. frac 0.75 -> 3/4 = 0.75"
  cooperative = True

  def parse(self, args: str) -> fractions.Fraction:
    m = _FRACTION.fullmatch(args)
    if m is None:
      raise ToolError("expected a number, e.g. 0.75 or 6/8")
    num, den = fractions.Fraction(m.group(1)), fractions.Fraction(m.group(2) or 1)
    if den == 0:
      raise ToolError("division by zero")
    return num / den

  def execute(self, parsed: fractions.Fraction, context, deadline: Deadline) -> str:
    del context, deadline  # bounded by the parse: at most 2 * MAX_LITERAL_DIGITS digits
    exact = format_number(parsed)
    ratio = f"{parsed.numerator}/{parsed.denominator}"
    if "/" not in exact:
      return f"{ratio} = {exact}"
    rounded = round(parsed, APPROX_PLACES)
    return f"{ratio} ~ {format_number(rounded)}"


class Recall(Tool):
  """`recall <turn>` or `recall last`: the result of an earlier tool call, from the full memory."""
  name = "recall"
  description = "the result of an earlier turn's tool call, e.g. recall 2 or recall last"
  cooperative = True

  def parse(self, args: str) -> int | None:
    args = args.strip().lower()
    if args == "last":
      return None
    if not re.fullmatch(r"\d{1,6}", args):
      raise ToolError("expected a turn number or 'last'")
    return int(args)

  def execute(self, parsed: int | None, context, deadline: Deadline) -> str:
    del deadline
    if not isinstance(context, Memory):
      raise ToolError("no memory to read")
    results = context.results()
    if not results:
      raise ToolError("no earlier results")
    if parsed is None:
      return results[-1][1]
    for turn, result in results:
      if turn == parsed:
        return result
    raise ToolError(f"turn {parsed} has no result; turns with results: {', '.join(str(t) for t, _ in results)}")


TOOLS = {"calc": Calculator, "frac": FractionConverter, "recall": Recall}


def math_toolset(names: str = "calc,frac,recall") -> ToolSet:
  """The toolset of the comma-separated tool names (from `TOOLS`)."""
  chosen = [n.strip() for n in names.split(",") if n.strip()]
  unknown = [n for n in chosen if n not in TOOLS]
  if unknown or not chosen:
    raise ValueError(f"unknown tools {unknown or names!r}; available: {', '.join(TOOLS)}")
  return ToolSet([TOOLS[n]() for n in chosen])
