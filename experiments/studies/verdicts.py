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
