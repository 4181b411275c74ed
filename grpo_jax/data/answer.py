"""Final-answer extraction and equivalence for math completions.

Model output is parsed, never evaluated. Every function is linear in the input
length, and numbers beyond `MAX_DIGITS` digits or with an exponent beyond
`MAX_EXPONENT` are not converted (they are compared as normalised strings), so
adversarial completions cannot hang the host or exhaust its memory.
"""

import fractions
import re

MAX_DIGITS = 64  # longer numbers are compared as strings, never converted
MAX_EXPONENT = 64  # |e| cap for scientific notation such as "1e5"
MAX_NUMERIC_CHARS = 256  # longer answers are never parsed as numbers

_GROUP = re.compile(r"\\[{}]|[{}]")  # a brace, or an escaped (literal) one
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_TEXT = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{([^{}]*)\}")
_LATEX_SPACES = re.compile(r"\\[!,;: ]|\\left|\\right|\\displaystyle")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°")
_WS = re.compile(r"\s+")
_SINGLE_GROUP = re.compile(r"([\^_])\{(\w)\}")  # x^{2} -> x^2

_INT = r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)"
_DEC = rf"(?:{_INT}(?:\.[0-9]*)?|\.[0-9]+)"
_UNITS = r"(?:\s*%|\s+[A-Za-z][A-Za-z .']*)?"
_DECIMAL = re.compile(rf"([+-]?{_DEC}(?:[eE][+-]?[0-9]+)?){_UNITS}", re.ASCII)
_SLASH = re.compile(rf"([+-]?{_DEC})\s*/\s*([+-]?{_DEC}){_UNITS}", re.ASCII)
_FRAC = re.compile(
    rf"([+-]?)\s*\\frac\s*\{{\s*([+-]?{_DEC})\s*\}}\s*\{{\s*([+-]?{_DEC})\s*\}}{_UNITS}",
    re.ASCII)
_FRAC_SHORT = re.compile(rf"([+-]?)\s*\\frac\s*([0-9])\s*([0-9]){_UNITS}", re.ASCII)

_UNICODE = str.maketrans({
    "\u2212": "-", "\u2013": "-", "\u2014": "-", "\u00a0": " ", "\u202f": " ",
    "\u2009": " ", "\uff04": "$"})


def _matching_braces(text: str) -> dict[int, int]:
  """Maps the index of each balanced '{' to its '}'; escaped braces are literal."""
  stack, match = [], {}
  for m in _GROUP.finditer(text):
    brace = m.group()
    if brace == "{":
      stack.append(m.start())
    elif brace == "}" and stack:
      match[stack.pop()] = m.start()
  return match


def extract_boxed(text: str) -> str | None:
  """Returns the content of the last balanced `\\boxed{...}` (or `\\fbox{...}`).

  Braces are matched with a stack, so nested groups such as
  `\\boxed{\\frac{1}{2}}` come back whole; an unclosed box is skipped.
  """
  if not text:
    return None
  opens = [m.end() - 1 for m in _BOXED.finditer(text)]
  if not opens:
    return None
  match = _matching_braces(text)
  for start in reversed(opens):
    if start in match:
      return text[start + 1:match[start]].strip()
  return None


def extract_answer(text: str | None) -> str | None:
  """Extracts the final answer from a completion.

  The last `####` marker wins: its answer is the rest of that line (None if
  empty). Without a marker, the content of the last balanced `\\boxed{...}`.

  Args:
    text: a completion or reference solution.

  Returns:
    The answer text, stripped, or None when there is none.
  """
  if not text:
    return None
  pos = text.rfind("####")
  if pos >= 0:
    line = text[pos + 4:].split("\n", 1)[0].strip()
    return line or None
  return extract_boxed(text)


def _clean(answer: str) -> str:
  """LaTeX/unicode clean-up that keeps single spaces (units are space-separated)."""
  s = answer.translate(_UNICODE).strip()
  if s.startswith(("\\boxed", "\\fbox")):
    inner = extract_boxed(s)
    if inner is not None:
      s = inner
  s = s.replace("\\$", "").replace("$", "").replace("\\%", "%").replace("{,}", ",")
  s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
  s = _TEXT.sub(r" \1", s)
  s = _LATEX_SPACES.sub(" ", s)
  s = _DEGREES.sub("", s)
  s = _SINGLE_GROUP.sub(r"\1\2", s)
  s = _WS.sub(" ", s).strip()
  while s.endswith("."):
    s = s[:-1].rstrip()
  return s


def normalize_answer(answer: str | None) -> str:
  """Normalises an answer for string comparison.

  Unicode minus signs become '-', `\\boxed{}`, `$`, `\\text{}` wrappers, LaTeX
  spacing, `\\left`/`\\right`, degree marks and trailing periods are dropped,
  `\\dfrac`/`\\tfrac` become `\\frac`, `x^{2}` becomes `x^2`, and all
  whitespace is removed. Case is kept (x and X differ in math).
  """
  if answer is None:
    return ""
  return _clean(answer).replace(" ", "")


def _to_fraction(number: str) -> fractions.Fraction | None:
  """Converts a validated decimal literal, refusing huge digit counts or exponents."""
  number = number.replace(",", "")
  mantissa, _, exponent = number.lower().partition("e")
  if sum(ch.isdigit() for ch in mantissa) > MAX_DIGITS:
    return None
  if exponent and abs(int(exponent)) > MAX_EXPONENT:  # len(s) is capped, int() is cheap
    return None
  if mantissa.endswith("."):
    number = mantissa[:-1] + (f"e{exponent}" if exponent else "")
  return fractions.Fraction(number)


def _ratio(sign: str, num: str, den: str) -> fractions.Fraction | None:
  n, d = _to_fraction(num), _to_fraction(den)
  if n is None or d is None or d == 0:
    return None
  return -n / d if sign == "-" else n / d


def parse_number(answer: str | None) -> fractions.Fraction | None:
  """Parses a numeric answer exactly, or returns None.

  Accepted forms: integers and decimals with an optional sign ("-3", ".5",
  "2.50"), thousands separators ("1,000"), scientific notation ("1e5"),
  fractions "3/4", `\\frac{3}{4}`, `\\dfrac{-3}{4}`, `\\frac34`; optionally
  with a currency sign, a trailing '%' (ignored: "50%" is 50) or trailing
  space-separated units ("18 dollars", `10\\text{ cm}`).

  Args:
    answer: the answer text.

  Returns:
    The exact value, or None when the text is not a number or exceeds the
    `MAX_DIGITS`/`MAX_EXPONENT`/`MAX_NUMERIC_CHARS` caps.
  """
  if not answer or len(answer) > 4 * MAX_NUMERIC_CHARS:
    return None
  s = _clean(answer)
  if not s or len(s) > MAX_NUMERIC_CHARS:
    return None
  for char in "£€¥":
    s = s.replace(char, "")
  if m := _DECIMAL.fullmatch(s):
    return _to_fraction(m.group(1))
  if m := _SLASH.fullmatch(s):
    return _ratio("+", m.group(1), m.group(2))
  if m := _FRAC.fullmatch(s):
    return _ratio(m.group(1), m.group(2), m.group(3))
  if m := _FRAC_SHORT.fullmatch(s):
    return _ratio(m.group(1), m.group(2), m.group(3))
  return None


def answer_key(answer: str | None) -> tuple[str, object] | None:
  """A hashable key under which equivalent answers coincide.

  Returns ("num", Fraction) for numeric answers, ("str", normalised text)
  otherwise, and None for a missing or empty answer.
  """
  if answer is None:
    return None
  value = parse_number(answer)
  if value is not None:
    return ("num", value)
  text = normalize_answer(answer)
  return ("str", text) if text else None


def answers_equal(pred: str | None, ref: str | None) -> bool:
  """Whether a predicted answer matches the reference.

  Numeric answers compare by exact value ("0.5" == "1/2" == "\\frac{1}{2}",
  "1,000" == "1000.0"); anything else by `normalize_answer` string equality.
  A missing or empty prediction never matches.
  """
  key = answer_key(pred)
  return key is not None and key == answer_key(ref)
