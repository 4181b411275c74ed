"""What a study is: runs (flag sets of the runners), the metrics read from them, and the plots drawn.

A study is data. `python -m experiments.reproduce --study=NAME` expands it over seeds and a profile into
processes (`python -m <module> --flag=value ... --seed=S --work_dir=DIR`), runs them, and aggregates what
they wrote (`summary.json`, `metrics.jsonl`) into cells: (study, run, metric, step) -> per-seed values,
mean and standard error. Adding a study is a `Study(...)` of a few lines in a module of this package (or a
JSON file of the same fields, `--study=path/to/study.json`).

Flag values may name another run of the same seed: "{run:sft}/sft_policy" is the run directory of the run
called "sft" (it runs first; if it fails, the runs that need it are not started). "{seed}" is the seed.
"""

import dataclasses
from typing import Any, Mapping

GRPO_MATH = "experiments.grpo_math"
FLOW_GRPO = "experiments.flow_grpo"
TRAIN_REWARD_MODEL = "experiments.train_reward_model"
SAMPLE_EVAL = "experiments.sample_eval"

# The flag each runner takes its output directory from (default: work_dir).
OUT_FLAGS = {TRAIN_REWARD_MODEL: "rm_dir"}


@dataclasses.dataclass(frozen=True)
class Tune:
  """A flag of a run chosen on a validation split, never the test set (a learning rate, per method).

  The run is first made at each value of the grid on the tuning seeds 0 .. seeds − 1, as the runs "<name>@<value>";
  each needs `--num_validation` (the RL pool's tail held out of training, evaluated at the end: summary key `by`).
  The value with the highest mean `by` over the tuning seeds (ties: the first in the grid) is then the run's own
  on every other seed, and the tuning seeds' runs at that value are the run's runs there: they differ from the
  others in nothing but the seed, and the choice read none of their test numbers.

  Attributes:
    values: the grid, in order.
    flag: the flag chosen.
    seeds: the tuning seeds, 0 .. seeds − 1.
    by: the summary key that chooses (the final policy's accuracy on the validation split).
  """
  values: tuple[Any, ...]
  flag: str = "learning_rate"
  seeds: int = 2
  by: str = "final_val_accuracy"

  def __post_init__(self):
    if len(self.values) < 2 or len(set(self.values)) != len(self.values) or self.seeds < 1:
      raise ValueError(f"a tuned --{self.flag} needs two or more distinct values and one or more tuning seeds")

  def grid_name(self, run: str, value) -> str:
    return f"{run}@{value:g}" if isinstance(value, float) else f"{run}@{value}"


@dataclasses.dataclass(frozen=True)
class Run:
  """One configuration, run once per seed as its own process.

  Attributes:
    name: the run's name in the study (tables, legends, `{run:NAME}` references).
    flags: flag name -> value (True: --name, False: --noname, None: left out).
    module: the runner, `python -m module`.
    label: display name in tables and plots (default: name).
    profiles: profile name -> flags that override `flags` in that profile.
    command: an argv prefix that replaces `python -m module` (tests use fake runners).
    out_flag: the flag that takes the run directory (default: by module, else work_dir).
    only_in: the profiles the run belongs to (default: all).
    tune: a flag chosen per run on a validation split (`Tune`), or None.
    shared: run once, as seed 0, for every seed: a start that every seed's other runs read ("{run:NAME}" names seed
      0's directory on every seed), where one per seed would cost more than the study affords. The verdicts then
      hold for that start only, and the page says so.
  """
  name: str
  flags: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  module: str = GRPO_MATH
  label: str = ""
  profiles: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
  command: tuple[str, ...] = ()
  out_flag: str = ""
  only_in: tuple[str, ...] = ()
  tune: Tune | None = None
  shared: bool = False

  def __post_init__(self):
    if self.shared and self.tune:
      raise ValueError(f"run {self.name}: a shared run (one process for every seed) cannot be tuned per seed")

  @property
  def display(self) -> str:
    return self.label or self.name

  @property
  def output_flag(self) -> str:
    return self.out_flag or OUT_FLAGS.get(self.module, "work_dir")


@dataclasses.dataclass(frozen=True)
class Metric:
  """A number read from every seed of some runs: one cell per (run, step) or (run, k).

  Attributes:
    name: the cell's metric name ("accuracy"; with `ks`, a template such as "maj@{k}").
    key: what to read: a summary.json key (source "summary") or a metrics.jsonl key (source "curve");
      with `ks`, a template as well ("final_maj@{k}").
    source: "summary" (one value per seed) or "curve" (metrics.jsonl: one cell per logged step; when a
      step was logged twice, after a --resume, its last record counts).
    runs: the runs it is read from (default: every run whose output has the key).
    minus: a second key of the same source, subtracted seed by seed (a gain: final minus start).
    ks: the values of {k}.
    percent: a fraction shown as a percentage.
    label: display name (default: name).
    since_start: (curves) subtract the seed's value at its first logged step: the change since the start,
      paired seed by seed, which does not carry the spread of the start policies over seeds.
    reduce: (curves) "mean": one cell per run, the seed's mean over its logged steps (prompts per step, say).
  """
  name: str
  key: str
  source: str = "summary"
  runs: tuple[str, ...] = ()
  minus: str = ""
  ks: tuple[int, ...] = ()
  percent: bool = True
  label: str = ""
  since_start: bool = False
  reduce: str = ""

  def __post_init__(self):
    if self.reduce not in ("", "mean") or (self.reduce and self.source != "curve"):
      raise ValueError(f"metric {self.name}: reduce is '' or 'mean', and only for a curve")
    if self.source not in ("summary", "curve"):
      raise ValueError(f"metric {self.name}: source must be 'summary' or 'curve', not {self.source!r}")
    if self.ks and ("{k}" not in self.name or "{k}" not in self.key):
      raise ValueError(f"metric {self.name}: with ks, name and key are templates with {{k}}")
    if self.ks and self.source == "curve":
      raise ValueError(f"metric {self.name}: ks needs source 'summary'")

  @property
  def display(self) -> str:
    return self.label or self.name

  def expand(self) -> list[tuple[str, str, str, int | None]]:
    """(cell metric name, key, minus key, k) for each k (one entry, k None, without ks)."""
    if not self.ks:
      return [(self.name, self.key, self.minus, None)]
    return [(self.name.format(k=k), self.key.format(k=k), self.minus.format(k=k), k) for k in self.ks]


@dataclasses.dataclass(frozen=True)
class Contrast:
  """A paired difference: run `a` minus run `b` on a metric, seed by seed (the seeds both have), one cell per
  step. It tests an ordering (does a beat b?) without the spread that both runs share through their seed.

  Attributes:
    a, b: run names.
    metric: a metric name (a curve metric gives one cell per step both have).
  """
  a: str
  b: str
  metric: str

  @property
  def run(self) -> str:
    return f"{self.a} - {self.b}"


@dataclasses.dataclass(frozen=True)
class Claim:
  """A paper's finding, read off one cell at its last step (`experiments/studies/verdicts.py` decides it).

  Attributes:
    text: the finding in the paper's words, short ("Fig 5: GRPO+PS > GRPO+OS").
    run: a run's name, or a contrast's "a - b" (the paired difference).
    metric: a metric name (a templated one expanded, e.g. "maj@64").
    expect: ">" (above zero: a rise, a beats b), "<", "=" (no change), or "" (no ordering: reported only).
    margin: an equivalence margin, in the metric's units (0.03 is 3 points of a percent metric). For "=", the
      change that still counts as none (0: any change at 2 standard errors contradicts it); for ">" or "<", the
      difference below which an ordering that is neither reproduced nor contradicted reads as "equal" (0: never).
  """
  text: str
  run: str
  metric: str
  expect: str = ">"
  margin: float = 0.0


MIN_DESIGN_SEEDS = 8  # the fewest seeds per arm a design may declare (issue 56)


@dataclasses.dataclass(frozen=True)
class Design:
  """A profile's statistics, declared in the study's spec before its runs (`verdicts.decide_family`).

  The claims form one family: each is read on exactly seeds 0 .. seeds − 1 (a cell with more seeds is cut back to
  them, one with fewer leaves every verdict "pending"), with Student-t p-values Holm-corrected across the family
  at family-wise error rate `alpha`. Every run of the profile comes from one commit: reproduce puts the commit in
  the runs' directory hash, refuses to start from a tree with uncommitted changes, and refuses to aggregate a
  table whose runs report another commit. The page names the commit that last changed the study's spec (or the
  rule) before the runs' commit: when the design was declared.

  Attributes:
    claims: the findings tested (`Claim`; a claim of no change, "=", needs a margin).
    seeds: the seeds per arm, at least MIN_DESIGN_SEEDS.
    alpha: the family-wise error rate.
    note: why these claims, seeds and margins (printed with the design).
  """
  claims: tuple[Claim, ...]
  seeds: int = MIN_DESIGN_SEEDS
  alpha: float = 0.05
  note: str = ""

  def __post_init__(self):
    if self.seeds < MIN_DESIGN_SEEDS:
      raise ValueError(f"a design declares at least {MIN_DESIGN_SEEDS} seeds per arm, not {self.seeds}")
    if not 0 < self.alpha < 1:
      raise ValueError(f"a design's alpha must be in (0, 1), not {self.alpha}")
    for c in self.claims:
      if c.expect == "=" and c.margin <= 0:
        raise ValueError(f"claim {c.text!r}: a claim of no change needs its margin declared (> 0)")


@dataclasses.dataclass(frozen=True)
class Panel:
  """One axes of a plot.

  Attributes:
    metric: a metric name (x "step"), a metric template (x "k"), or several metric names (x "run": a bar
      per metric in each run's group).
    runs: the runs drawn (default: every run with cells of the metric).
    title: the panel's title.
    ylabel: the y-axis label (default: the metric's label).
  """
  metric: str | tuple[str, ...]
  runs: tuple[str, ...] = ()
  title: str = ""
  ylabel: str = ""

  @property
  def metrics(self) -> tuple[str, ...]:
    return (self.metric,) if isinstance(self.metric, str) else tuple(self.metric)


@dataclasses.dataclass(frozen=True)
class Plot:
  """A PNG figure: panels side by side, each line (or bar) a run's mean with its standard error.

  Attributes:
    file: the PNG's file name in the output directory.
    panels: the axes, left to right.
    x: "step" (a curve metric against the logged step, shaded mean ± s.e. band per run), "k" (a templated
      metric against k on a log2 axis, the same band), or "run" (grouped bars with s.e. error bars).
    title: the figure's title.
    xlabel: the x-axis label.
  """
  file: str
  panels: tuple[Panel, ...]
  x: str = "step"
  title: str = ""
  xlabel: str = ""

  def __post_init__(self):
    if self.x not in ("step", "k", "run"):
      raise ValueError(f"plot {self.file}: x must be 'step', 'k' or 'run', not {self.x!r}")
    if not self.file.endswith(".png"):
      raise ValueError(f"plot {self.file}: the file must be a .png")


@dataclasses.dataclass(frozen=True)
class Study:
  """Runs, metrics and plots; `profiles` adds flags to every run of a runner in a profile.

  Attributes:
    name: the study's name (`--study=NAME`).
    title: one line: the paper figure or table it reproduces.
    runs: the runs (the order of tables and legends).
    metrics: the numbers aggregated into cells.
    plots: the figures.
    profiles: profile name -> module -> flags added to each run of that module (a run's own flags win,
      and its `profiles` entry wins over both).
    notes: profile name -> a sentence printed with the table (what the profile shortens).
    description: what the study shows and how to read it (printed above the table).
    seeds: the number of seeds when --seeds is not given (default 3).
    contrasts: paired differences between runs (a table of their own).
    claims: the paper's findings it tests, each decided from a run's or a contrast's cell (a table of verdicts),
      in the profiles without a design, by the rule of 2 standard errors (`verdicts.decide`).
    designs: profile name -> its `Design` (claims, seeds, α declared before the runs; the t-and-Holm rule).
  """
  name: str
  title: str
  runs: tuple[Run, ...]
  metrics: tuple[Metric, ...]
  plots: tuple[Plot, ...] = ()
  profiles: Mapping[str, Mapping[str, Mapping[str, Any]]] = dataclasses.field(default_factory=dict)
  notes: Mapping[str, str] = dataclasses.field(default_factory=dict)
  description: str = ""
  seeds: int = 3
  contrasts: tuple[Contrast, ...] = ()
  claims: tuple[Claim, ...] = ()
  designs: Mapping[str, Design] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    names = [r.name for r in self.runs]
    if len(set(names)) != len(names):
      raise ValueError(f"study {self.name}: run names repeat: {names}")
    known = set(names)
    for m in self.metrics:
      if set(m.runs) - known:
        raise ValueError(f"study {self.name}, metric {m.name}: unknown runs {sorted(set(m.runs) - known)}")
    for c in self.contrasts:
      if {c.a, c.b} - known:
        raise ValueError(f"study {self.name}, contrast {c.run}: unknown runs {sorted({c.a, c.b} - known)}")
    cells = known | {c.run for c in self.contrasts}
    metrics = {n for m in self.metrics for n, *_ in m.expand()}
    for c in self.claims + tuple(c for d in self.designs.values() for c in d.claims):
      if c.run not in cells or c.metric not in metrics or c.expect not in (">", "<", "=", ""):
        raise ValueError(f"study {self.name}, claim {c.text!r}: needs a run or contrast 'a - b' (not {c.run!r}), "
                         f"a metric (not {c.metric!r}) and expect one of >, <, =, '' (not {c.expect!r})")
    for profile in self.designs:
      if profile != "full" and profile not in self.profiles:
        raise ValueError(f"study {self.name}: a design for profile {profile!r}, which the study does not have")
    for p in self.plots:
      for panel in p.panels:
        if set(panel.runs) - known:
          raise ValueError(f"study {self.name}, plot {p.file}: unknown runs {sorted(set(panel.runs) - known)}")

  def claims_in(self, profile: str | None) -> tuple[Claim, ...]:
    """The claims a profile's page decides: its design's, else the study's own."""
    return self.designs[profile].claims if profile in self.designs else self.claims

  def run(self, name: str) -> Run:
    return next(r for r in self.runs if r.name == name)

  def runs_in(self, profile: str) -> tuple[Run, ...]:
    return tuple(r for r in self.runs if not r.only_in or profile in r.only_in)

  def flags_for(self, run: Run, profile: str) -> dict[str, Any]:
    """The run's flags in a profile: the profile's flags for its module, its own, its own profile's."""
    merged = dict(self.profiles.get(profile, {}).get(run.module, {}))
    merged.update(run.flags)
    merged.update(run.profiles.get(profile, {}))
    return {k: v for k, v in merged.items() if v is not None}


def from_dict(d: Mapping[str, Any]) -> Study:
  """A Study from plain data (a parsed JSON file): the same fields, nested as lists and objects."""
  d = dict(d)
  runs = tuple(Run(**{**r, "command": tuple(r.get("command", ())), "only_in": tuple(r.get("only_in", ())),
                      "tune": Tune(**{**r["tune"], "values": tuple(r["tune"]["values"])}) if r.get("tune") else None})
               for r in d.pop("runs"))
  metrics = tuple(Metric(**{**m, "runs": tuple(m.get("runs", ())), "ks": tuple(m.get("ks", ()))})
                  for m in d.pop("metrics"))
  plots = []
  for p in d.pop("plots", ()):
    panels = tuple(Panel(**{**q, "metric": q["metric"] if isinstance(q["metric"], str) else tuple(q["metric"]),
                            "runs": tuple(q.get("runs", ()))}) for q in p["panels"])
    plots.append(Plot(**{**p, "panels": panels}))
  contrasts = tuple(Contrast(**c) for c in d.pop("contrasts", ()))
  claims = tuple(Claim(**c) for c in d.pop("claims", ()))
  designs = {p: Design(**{**x, "claims": tuple(Claim(**c) for c in x["claims"])})
             for p, x in d.pop("designs", {}).items()}
  return Study(runs=runs, metrics=metrics, plots=tuple(plots), contrasts=contrasts, claims=claims, designs=designs,
               **d)
