"""A paper's claim against a cell of seeds: reproduced, contradicted, undecided, or consistent within a bound.

A claim reads one cell (a run's metric, or a paired contrast "a - b", at its last step) with mean m and standard
error s over n seeds, and the interval m ± 2s:
  ">" (a rise, a beats b): reproduced if the interval lies above 0, contradicted if below; with an equivalence
    margin δ, equal if it holds 0 but lies inside ±δ (no ordering larger than δ either way); else undecided;
  "<": the mirror image;
  "=" (no change): with an equivalence margin δ, consistent if the interval lies inside ±δ, contradicted if it lies
    wholly outside, else undecided; with none (δ = 0), contradicted if the interval excludes 0, else consistent,
    and the interval bounds the change;
  "" (the paper states no ordering): reported, no verdict.
Fewer than MIN_SEEDS (3) seeds decide nothing: the standard error of two values is itself a guess (a 2-s.e. rule
on 2 seeds is a 70% interval, t with 1 degree of freedom; on 3 seeds 82%, on 5 seeds 88%). An undecided cell also
says how many seeds would decide it if its mean and spread held: n' = n (2s / |m|)^2, since the standard error
falls as 1/√n.
"""

import dataclasses
import math

EXPECT = (">", "<", "=", "")
Z = 2.0  # standard errors for a decision
MAX_SEEDS = 50  # beyond this, "seeds to decide" reads as "too small an effect to decide"
MIN_SEEDS = 3  # the fewest seeds that decide a claim


@dataclasses.dataclass(frozen=True)
class Verdict:
  word: str  # reproduced, contradicted, equal, undecided, consistent, reported
  detail: str  # the distance in standard errors and the interval it leaves, as text
  short: str = ""  # the same in a table cell's few words
  z: float | None = None  # |mean| / s.e. (inf when every seed is alike and the mean is not 0)
  lo: float | None = None  # the Z-s.e. interval, in the cell's units
  hi: float | None = None
  seeds: int | None = None  # undecided: about how many seeds would decide it (None: over MAX_SEEDS or no lean)


def seeds_to_decide(mean: float, se: float, n: int) -> int:
  """The seeds at which a cell of this mean and per-seed spread (se √n) lies Z standard errors from zero."""
  return max(n + 1, math.ceil(n * (Z * se / abs(mean)) ** 2))


def decide(mean: float, se: float | None, n: int, expect: str, scale: float = 1.0, digits: int = 1,
           margin: float = 0.0) -> Verdict:
  """The verdict on `expect` for a cell; `scale` and `digits` format its numbers (100 and 1 for percent points);
  `margin`: the equivalence margin δ of a claim, in the cell's units ("=": the change that counts as none; ">",
  "<": the difference below which an undecided ordering reads as equal)."""
  if expect not in EXPECT:
    raise ValueError(f"expect must be one of {EXPECT}, not {expect!r}")
  num = lambda x: f"{scale * x:+.{digits}f}"
  if se is None or n < 2:
    why = f"{n} seed{'s' if n != 1 else ''}: no standard error"
    return Verdict("undecided" if expect else "reported", why, "one seed" if n == 1 else why)
  lo, hi = mean - Z * se, mean + Z * se
  bracket = f"[{num(lo)}, {num(hi)}]"
  interval = f"{Z:g} s.e. interval {bracket}"
  z = abs(mean) / se if se > 0 else (math.inf if mean else 0.0)
  distance = f"{z:.1f} s.e." if z != math.inf else "every seed alike"
  fields = dict(z=z, lo=scale * lo, hi=scale * hi)
  if not expect:
    return Verdict("reported", interval, f"no ordering claimed; {bracket} at {Z:g} s.e.", **fields)
  if n < MIN_SEEDS:
    return Verdict("undecided", f"{distance} on {n} seeds: {MIN_SEEDS} or more decide; {interval}",
                   f"{n} seeds, too few to decide ({distance}; {bracket} at {Z:g} s.e.)", **fields)
  if expect == "=" and margin > 0:
    bound = f"±{scale * margin:.{digits}f}"
    if -margin <= lo and hi <= margin:
      word, where = "consistent", "inside"
    elif lo > margin or hi < -margin:
      word, where = "contradicted", "outside"
    else:
      word, where = "undecided", "crosses"
    detail = (f"the interval crosses {bound}" if where == "crosses" else f"{where} {bound}") + f"; {interval}"
    return Verdict(word, detail, f"{bracket} at {Z:g} s.e., {where} {bound}", **fields)
  if expect == "=":
    if lo > 0 or hi < 0:
      return Verdict("contradicted", f"a change of {distance}; {interval}", f"a change of {distance}", **fields)
    return Verdict("consistent", f"no change outside [{num(lo)}, {num(hi)}] at {Z:g} s.e.",
                   f"no change outside {bracket}", **fields)
  sign = 1.0 if expect == ">" else -1.0
  if sign * lo > 0 and sign * hi > 0:
    return Verdict("reproduced", f"{distance}; {interval}", distance, **fields)
  if sign * lo < 0 and sign * hi < 0:
    return Verdict("contradicted", f"{distance} against; {interval}", distance, **fields)
  if margin > 0 and -margin <= lo and hi <= margin:
    bound = f"±{scale * margin:.{digits}f}"
    return Verdict("equal", f"{distance}, no ordering outside {bound}; {interval}",
                   f"{bracket} at {Z:g} s.e., inside {bound}: no ordering larger than {scale * margin:.{digits}f}",
                   **fields)
  side = "the paper's direction" if sign * mean > 0 else "against" if mean else "no lean"
  seeds = seeds_to_decide(mean, se, n) if mean else None
  seeds = seeds if seeds is not None and seeds <= MAX_SEEDS else None
  more = (f"; about {seeds} seeds would decide it at this mean and spread" if seeds else
          f"; an effect this small would take over {MAX_SEEDS} seeds" if mean else "")
  short_more = (f"; ~{seeds} seeds would decide it" if seeds else
                f"; over {MAX_SEEDS} seeds to decide" if mean else "")
  lean = {"the paper's direction": "the paper's way"}.get(side, side)
  return Verdict("undecided", f"{distance}, {side}; {interval}{more}", f"{distance}, {lean}{short_more}",
                 seeds=seeds, **fields)


# THE DESIGN RULE (issue 56): Student-t on the declared seeds, Holm across the study's claims.
#
# A profile with a `spec.Design` is decided by `decide_family`, not `decide`: its claims form one family, each
# claim's cell is read on exactly the declared seeds, and every verdict controls the family-wise error rate at α
# (0.05). Each claim brings one or two hypotheses, each with an exact p-value from the t distribution with n − 1
# degrees of freedom (the cell is a mean of n paired, per-seed values, s.e. = s / √n):
#   ">" and "<": H_zero: μ = 0, two-sided, p = 2 P(T ≥ |m| / s);
#                with a margin δ, also H_wide: |μ| ≥ δ, two one-sided tests (TOST), p = P(T ≥ (δ − |m|) / s);
#   "=":         H_wide as above, and H_narrow: |μ| ≤ δ, p = 2 P(T ≥ (|m| − δ) / s).
# Holm's step-down over all the family's hypotheses (m of them) rejects those whose adjusted p-value
# p̃_(k) = max_{j ≤ k} min(1, (m − j + 1) p_(j)) is at most α. Then:
#   ">": H_zero rejected: "reproduced" if m > 0, else "contradicted"; else H_wide rejected: "equal within the
#        declared margin" (no ordering larger than δ either way); else "undecided". "<": the mirror image.
#   "=": H_wide rejected: "equal within the declared margin" (the paper's "no change"); else H_narrow rejected:
#        "contradicted" (a change larger than δ); else "undecided".
#   "": "reported" with its 95% t interval, outside the family.
# Alone (m = 1), H_zero is rejected exactly when the 95% t interval m ± t_{0.975, n−1} s excludes zero, and H_wide
# when the 90% one lies inside ±δ (TOST at α); Holm asks the claim ranked k-th of m for the interval at
# 1 − α / (m − k + 1) instead. Until every claim has all its declared seeds, no claim is decided ("pending"):
# the rule reads each cell once, at the size declared before the runs.

ALPHA = 0.05
PENDING = "pending"
EQUAL = "equal within the declared margin"


def t_interval(mean: float, se: float, n: int, level: float = 0.95) -> tuple[float, float]:
  """The two-sided Student-t interval m ± t_{(1+level)/2, n−1} s of a mean of n values with standard error s."""
  from scipy import stats
  q = float(stats.t.ppf(0.5 + level / 2, n - 1))
  return mean - q * se, mean + q * se


def _sf(x: float, n: int) -> float:
  """P(T ≥ x) for T ~ t with n − 1 degrees of freedom; ±inf (a zero standard error) give 0 and 1."""
  from scipy import stats
  if math.isinf(x) or math.isnan(x):
    return 0.0 if x > 0 else 1.0
  return float(stats.t.sf(x, n - 1))


def _ratio(x: float, se: float) -> float:
  return x / se if se > 0 else (math.inf if x > 0 else -math.inf if x < 0 else math.nan)


def p_zero(mean: float, se: float, n: int) -> float:
  """Two-sided p-value of H: μ = 0."""
  return min(1.0, 2.0 * _sf(_ratio(abs(mean), se), n))


def p_wide(mean: float, se: float, n: int, margin: float) -> float:
  """TOST p-value of H: |μ| ≥ δ (rejected: the mean lies inside ±δ)."""
  return _sf(_ratio(margin - abs(mean), se), n)


def p_narrow(mean: float, se: float, n: int, margin: float) -> float:
  """p-value of H: |μ| ≤ δ (rejected: the mean lies outside ±δ), two-sided in the side the data picked."""
  return min(1.0, 2.0 * _sf(_ratio(abs(mean) - margin, se), n))


def holm(pvalues: list[float]) -> list[float]:
  """Holm's step-down adjusted p-values, in the input's order: p̃_(k) = max_{j ≤ k} min(1, (m − j + 1) p_(j)) over
  the p-values sorted ascending; reject where p̃ ≤ α (Holm 1979, Scand. J. Statist. 6:65-70)."""
  m = len(pvalues)
  adjusted, running = [0.0] * m, 0.0
  for rank, i in enumerate(sorted(range(m), key=lambda i: pvalues[i])):
    running = max(running, min(1.0, (m - rank) * pvalues[i]))
    adjusted[i] = running
  return adjusted


@dataclasses.dataclass(frozen=True)
class Cell:
  """A claim's cell for `decide_family`: mean and standard error over n seeds (None: pending, with `have` of
  `declared` seeds), the claim's expectation and margin, and how its numbers print."""
  expect: str
  mean: float | None = None
  se: float | None = None
  n: int = 0
  margin: float = 0.0
  scale: float = 1.0
  digits: int = 1
  have: int = 0
  declared: int = 0


def decide_family(cells: list[Cell], alpha: float = ALPHA) -> list[Verdict]:
  """The verdicts of a design's claims, one family (the rule above); `Verdict.lo, hi`: the 95% t interval."""
  for c in cells:
    if c.expect not in EXPECT:
      raise ValueError(f"expect must be one of {EXPECT}, not {c.expect!r}")
    if c.expect == "=" and c.margin <= 0:
      raise ValueError("a claim of no change ('=') needs a margin > 0 under the design rule")
  pending = [c for c in cells if not _has_seeds(c)]
  p_of, m = ({}, 0) if pending else _holm_family(cells)
  return [_family_verdict(c, p_of.get(i, {}), m, alpha, pending) if _has_seeds(c) else _waiting(c)
          for i, c in enumerate(cells)]


def _has_seeds(c: Cell) -> bool:
  """Whether the cell has a mean and a standard error over two seeds or more."""
  return not (c.mean is None or c.se is None or c.n < 2)


def _waiting(c: Cell) -> Verdict:
  """A cell still without its seeds: pending (or reported, with no claim), no verdict."""
  why = f"{c.have} of {c.declared} declared seeds"
  return Verdict(PENDING if c.expect else "reported", f"{why}; no verdict before all have finished", why)


def _holm_family(cells: list[Cell]) -> tuple[dict[int, dict[str, float]], int]:
  """The family's hypotheses (each claim's "zero", "wide", "narrow" of the rule above), Holm-adjusted: the p-values
  by cell index and kind, and their number m."""
  hypotheses = []  # (cell index, kind, p)
  for i, c in enumerate(cells):
    if not c.expect:
      continue
    if c.expect in (">", "<"):
      hypotheses.append((i, "zero", p_zero(c.mean, c.se, c.n)))
    if c.margin > 0:
      hypotheses.append((i, "wide", p_wide(c.mean, c.se, c.n, c.margin)))
    if c.expect == "=":
      hypotheses.append((i, "narrow", p_narrow(c.mean, c.se, c.n, c.margin)))
  adjusted = holm([p for _, _, p in hypotheses])
  p_of: dict[int, dict[str, float]] = {}
  for (i, kind, _), p in zip(hypotheses, adjusted):
    p_of.setdefault(i, {})[kind] = p
  return p_of, len(hypotheses)


def _family_verdict(c: Cell, ps: dict[str, float], m: int, alpha: float, pending: list[Cell]) -> Verdict:
  """The verdict of a cell with its seeds, from its Holm-adjusted p-values `ps` among the family's `m`; with its
  95% t interval: reported (no claim), pending (while any of `pending` waits for seeds), or the rule's word."""
  num = lambda x: f"{c.scale * x:+.{c.digits}f}"  # noqa: E731
  lo, hi = t_interval(c.mean, c.se, c.n)
  bracket = f"[{num(lo)}, {num(hi)}]"
  interval = f"95% t interval {bracket} on {c.n} seeds"
  fields = dict(z=abs(c.mean) / c.se if c.se > 0 else (math.inf if c.mean else 0.0), lo=c.scale * lo,
                hi=c.scale * hi)
  if not c.expect:
    return Verdict("reported", interval, f"no ordering claimed; {bracket} (95% t)", **fields)
  if pending:
    short = ", ".join(f"{p.have} of {p.declared}" for p in pending[:1])
    return Verdict(PENDING, f"{interval}; the family waits for every claim's declared seeds ({short} seeds "
                            "in one)", f"{bracket} (95% t); waiting for the family's declared seeds", **fields)
  bound = f"±{c.scale * c.margin:.{c.digits}f}"
  said = "; ".join(f"{name} {ps[key]:.3g}" for key, name in (("zero", "against zero"), ("wide", f"inside {bound}"),
                                                            ("narrow", f"outside {bound}")) if key in ps)
  detail = f"{interval}; Holm-adjusted p ({m} hypotheses, α = {alpha:g}): {said}"
  word, key = _family_word(c, ps, alpha)
  p = ps[key] if key else min(ps.values())  # the p-value of the test that decided, else the nearest to deciding
  return Verdict(word, detail, f"{bracket} (95% t), Holm p {p:.2g}", **fields)


def _family_word(c: Cell, ps: dict[str, float], alpha: float) -> tuple[str, str | None]:
  """The rule's word for a claim from the hypotheses its adjusted p-values `ps` reject at `alpha`, and the key of
  the hypothesis that decided it (None: undecided)."""
  if c.expect in (">", "<"):
    sign = 1.0 if c.expect == ">" else -1.0
    if ps["zero"] <= alpha:
      return ("reproduced" if sign * c.mean > 0 else "contradicted"), "zero"
    return (EQUAL, "wide") if ps.get("wide", 1.0) <= alpha else ("undecided", None)
  if ps["wide"] <= alpha:
    return EQUAL, "wide"
  return ("contradicted", "narrow") if ps["narrow"] <= alpha else ("undecided", None)
