"""A calculator over a safe arithmetic parser: exact rational arithmetic, never `eval`.

Grammar (a recursive-descent parser over a small token set; anything else is an error):

  expr  := term (('+' | '-') term)*
  term  := unary (('*' | '/' | '//' | '%') unary)*
  unary := ('+' | '-') unary | power
  power := atom (('**' | '^') unary)?          right-associative: 2**3**2 = 2**9
  atom  := number | '(' expr ')'               number: digits with an optional decimal point

Values are `fractions.Fraction`s, so 1/3*3 == 1 exactly. Every input is bounded before any work is
done: the expression length, the digits of a literal, the nesting depth, and the size of every
intermediate result (a power is refused from its estimated size, so `9**9**9**9` fails at once).
"""

import fractions
import re

from grpo_jax.agents.tools import Deadline, Tool, ToolError

MAX_EXPRESSION_CHARS = 256
MAX_LITERAL_DIGITS = 40
MAX_DEPTH = 48
MAX_RESULT_BITS = 2048  # numerator and denominator of every intermediate value (~616 decimal digits)
MAX_DECIMAL_PLACES = 12  # a terminating fraction with more places is shown as n/d

_TOKEN = re.compile(r"\s*(?:(\d+\.?\d*|\.\d+)|(\*\*|//|[-+*/%^()]))")


def tokenize(expression: str) -> list[str]:
  """Splits an expression into number and operator tokens; raises ToolError on anything else."""
  if len(expression) > MAX_EXPRESSION_CHARS:
    raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
  tokens, pos = [], 0
  expression = expression.rstrip()
  while pos < len(expression):
    m = _TOKEN.match(expression, pos)
    if m is None:
      bad = expression[pos:].lstrip()[:1]
      raise ToolError(f"unexpected character {bad!r} at position {len(expression) - len(expression[pos:].lstrip())}")
    number, op = m.groups()
    if number is not None and sum(c.isdigit() for c in number) > MAX_LITERAL_DIGITS:
      raise ToolError(f"number with more than {MAX_LITERAL_DIGITS} digits")
    tokens.append(number if number is not None else op)
    pos = m.end()
  if not tokens:
    raise ToolError("empty expression")
  return tokens


def _bounded(value: fractions.Fraction) -> fractions.Fraction:
  if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_RESULT_BITS:
    raise ToolError(f"result larger than {MAX_RESULT_BITS} bits")
  return value


def _power(base: fractions.Fraction, exponent: fractions.Fraction) -> fractions.Fraction:
  if exponent.denominator != 1:
    raise ToolError("exponent must be an integer")
  e = exponent.numerator
  if base == 0 and e < 0:
    raise ToolError("division by zero")
  if base in (0, 1) or e == 0:
    return fractions.Fraction(1) if e == 0 else base
  if base == -1:
    return fractions.Fraction(-1 if e % 2 else 1)
  size = max(base.numerator.bit_length(), base.denominator.bit_length())
  if abs(e) > MAX_RESULT_BITS or (size - 1) * abs(e) > MAX_RESULT_BITS:  # 2**(size-1) <= |base part|
    raise ToolError(f"power too large (more than {MAX_RESULT_BITS} bits)")
  return _bounded(base**e)


class _Parser:
  """Evaluates a token list by recursive descent, checking the deadline at every node."""

  def __init__(self, tokens: list[str], deadline: Deadline | None):
    self.tokens, self.pos, self.depth, self.deadline = tokens, 0, 0, deadline

  def peek(self) -> str | None:
    return self.tokens[self.pos] if self.pos < len(self.tokens) else None

  def take(self) -> str:
    token = self.peek()
    if token is None:
      raise ToolError("unexpected end of expression")
    self.pos += 1
    return token

  def enter(self) -> None:
    self.depth += 1
    if self.depth > MAX_DEPTH:
      raise ToolError(f"expression nested deeper than {MAX_DEPTH} levels")
    if self.deadline is not None:
      self.deadline.check()

  def expr(self) -> fractions.Fraction:
    value = self.term()
    while self.peek() in ("+", "-"):
      op = self.take()
      rhs = self.term()
      value = _bounded(value + rhs if op == "+" else value - rhs)
    return value

  def term(self) -> fractions.Fraction:
    value = self.unary()
    while self.peek() in ("*", "/", "//", "%"):
      op = self.take()
      rhs = self.unary()
      if op != "*" and rhs == 0:
        raise ToolError("division by zero")
      if op == "*":
        value = value * rhs
      elif op == "/":
        value = value / rhs
      elif op == "//":
        value = fractions.Fraction(value // rhs)
      else:
        value = value % rhs
      value = _bounded(value)
    return value

  def unary(self) -> fractions.Fraction:
    self.enter()
    if self.peek() in ("+", "-"):
      sign = self.take()
      value = self.unary()
      value = -value if sign == "-" else value
    else:
      value = self.power()
    self.depth -= 1
    return value

  def power(self) -> fractions.Fraction:
    base = self.atom()
    if self.peek() in ("**", "^"):
      self.take()
      return _power(base, self.unary())
    return base

  def atom(self) -> fractions.Fraction:
    token = self.take()
    if token == "(":
      value = self.expr()
      if self.take() != ")":
        raise ToolError("missing ')'")
      return value
    if token[0].isdigit() or token[0] == ".":
      return fractions.Fraction(token)
    raise ToolError(f"unexpected {token!r}")


def evaluate(expression: str, deadline: Deadline | None = None) -> fractions.Fraction:
  """The exact value of an arithmetic expression (see the module grammar).

  Raises:
    ToolError: for anything outside the grammar or its bounds, division by zero, or the deadline.
  """
  return _evaluate_tokens(tokenize(expression), deadline)


def _evaluate_tokens(tokens: list[str], deadline: Deadline | None) -> fractions.Fraction:
  parser = _Parser(tokens, deadline)
  value = parser.expr()
  if parser.peek() is not None:
    raise ToolError(f"unexpected {parser.peek()!r} after the expression")
  return value


def format_number(value: fractions.Fraction) -> str:
  """An integer as digits, a terminating fraction as a decimal (up to 12 places), else `n/d`."""
  if value.denominator == 1:
    return str(value.numerator)
  d = value.denominator
  twos, fives = (d & -d).bit_length() - 1, 0
  while d % 5 == 0:
    d //= 5
    fives += 1
  if d >> twos == 1 and max(twos, fives) <= MAX_DECIMAL_PLACES:
    places = max(twos, fives)
    scaled = abs(value.numerator) * 10**places // value.denominator
    sign = "-" if value < 0 else ""
    whole, frac = divmod(scaled, 10**places)
    return f"{sign}{whole}.{str(frac).rjust(places, '0').rstrip('0')}"
  return f"{value.numerator}/{value.denominator}"


class Calculator(Tool):
  """`calc <expression>`: the exact value of + - * / // % ** with parentheses."""
  name = "calc"
  description = "exact arithmetic, e.g. calc (3+4)*2/5 -> 2.8; operators + - * / // % ** and parentheses"
  cooperative = True

  def parse(self, args: str) -> list[str]:
    return tokenize(args)

  def execute(self, parsed: list[str], context, deadline: Deadline) -> str:
    del context  # the calculator reads only its arguments
    return format_number(_evaluate_tokens(parsed, deadline))

