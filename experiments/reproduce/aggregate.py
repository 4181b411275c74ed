"""Finished runs -> cells (one per run, metric and step: the seeds' values, mean and standard error) -> verdicts."""

import json
import math
import pathlib

from experiments.reproduce import plan as plan_lib
from experiments.studies import spec
from experiments.studies import verdicts


def read_json(path: pathlib.Path, what: str = "a JSON object", need: tuple[str, ...] = ()) -> dict:
  """The JSON object in `path` (with the keys `need`), or StudyError naming the file (cut short, not an object)."""
  try:
    value = json.loads(path.read_text())
  except (OSError, ValueError) as err:
    raise plan_lib.StudyError(f"{path}: cannot read {what} ({err})") from None
  if not isinstance(value, dict) or any(k not in value for k in need):
    raise plan_lib.StudyError(f"{path}: not {what}" + (f" (needs {', '.join(need)})" if need else ""))
  return value


def mean_se(values: list[float]) -> tuple[float, float | None]:
  """Mean and standard error of the mean, s / √n with the sample standard deviation (n − 1); None if n < 2."""
  n = len(values)
  if n == 0:
    raise ValueError("mean_se of no values")
  mean = math.fsum(values) / n
  if n < 2:
    return mean, None
  var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
  return mean, math.sqrt(var / n)


def read_curve(path: pathlib.Path) -> dict[str, dict[int, float]]:
  """metrics.jsonl as key -> step -> value; a step logged twice (a resumed run) keeps its last record."""
  curves: dict[str, dict[int, float]] = {}
  if not path.is_file():
    return curves
  for line in path.read_text().splitlines():
    try:
      record = json.loads(line)
    except ValueError:
      continue  # a line cut short by an interruption
    step = record.get("step")
    if not isinstance(step, int):
      continue
    for key, value in record.items():
      if key not in ("step", "time") and isinstance(value, (int, float)) and math.isfinite(value):
        curves.setdefault(key, {})[step] = float(value)
  return curves


def _number(value) -> float | None:
  return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def collect(study: spec.Study, jobs: list[plan_lib.Job]) -> list[dict]:
  """Cells: one per (run, metric, step), from every seed whose run finished."""
  values: dict[tuple[str, str, int | None], dict[int, float]] = {}
  extra: dict[tuple[str, str, int | None], dict] = {}
  for job in jobs:
    if not job.summary.is_file():
      continue
    summary = read_json(job.summary, "a run's summary")
    curves = None
    for metric in study.metrics:
      if metric.runs and job.run.name not in metric.runs:
        continue
      for name, key, minus, k in metric.expand():
        if metric.source == "summary":
          v, m = _number(summary.get(key)), (_number(summary.get(minus)) if minus else 0.0)
          points = {None: v - m} if v is not None and m is not None else {}
        else:
          curves = read_curve(job.directory / "metrics.jsonl") if curves is None else curves
          base, sub = curves.get(key, {}), (curves.get(minus, {}) if minus else None)
          points = {s: v - (sub[s] if sub is not None else 0.0) for s, v in base.items()
                    if sub is None or s in sub}
          if metric.since_start and points:
            first = points[min(points)]
            points = {s: v - first for s, v in points.items()}
          if metric.reduce == "mean" and points:
            points = {None: math.fsum(points.values()) / len(points)}
        for step, v in points.items():
          cell = (job.run.name, name, step)
          values.setdefault(cell, {})[job.seed] = v
          extra[cell] = {"k": k, "percent": metric.percent, "label": metric.display}
  for c in study.contrasts:
    for (run, metric, step), by_seed in list(values.items()):
      if run != c.a or metric != c.metric or (c.b, metric, step) not in values:
        continue
      other = values[(c.b, metric, step)]
      paired = {seed: v - other[seed] for seed, v in by_seed.items() if seed in other}
      if paired:
        values[(c.run, metric, step)] = paired
        extra[(c.run, metric, step)] = {**extra[(run, metric, step)], "contrast": True}
  order = {r.name: i for i, r in enumerate(study.runs)}
  order.update({c.run: len(order) + i for i, c in enumerate(study.contrasts)})
  metric_order = {name: i for i, (name, *_rest) in enumerate(n for m in study.metrics for n in m.expand())}
  cells = []
  for (run, metric, step), by_seed in sorted(
      values.items(), key=lambda kv: (order[kv[0][0]], metric_order.get(kv[0][1], 0), -1 if kv[0][2] is None
                                      else kv[0][2])):
    seeds = sorted(by_seed)
    mean, se = mean_se([by_seed[s] for s in seeds])
    cells.append({"study": study.name, "run": run, "metric": metric, "step": step, **extra[(run, metric, step)],
                  "n": len(seeds), "seeds": seeds, "values": [by_seed[s] for s in seeds], "mean": mean, "se": se})
  return cells


def format_cell(cell: dict | None, with_n: bool = True) -> str:
  """A cell as the pages print it: mean ± standard error (seeds), in points for a percentage; "-" for none."""
  if cell is None:
    return "-"
  scale = 100.0 if cell["percent"] else 1.0
  digits = 1 if cell["percent"] else 3
  text = f"{scale * cell['mean']:.{digits}f}"
  if cell["se"] is not None:
    text += f" ± {scale * cell['se']:.{digits}f}"
  return text + (f" ({cell['n']})" if with_n else "")


def decide_claims(study: spec.Study, cells: list[dict], profile: str | None = None) -> list[dict]:
  """Each claim of the study against its cell at the last step it has (a summary metric's one cell): a profile
  with a design by its rule (`decide_design`), any other by the rule of 2 standard errors (`verdicts.decide`)."""
  if profile in study.designs:
    return decide_design(study.designs[profile], cells)
  out = []
  for claim in study.claims:
    found = [c for c in cells if c["run"] == claim.run and c["metric"] == claim.metric]
    entry = {"claim": claim.text, "run": claim.run, "metric": claim.metric, "expect": claim.expect}
    if not found:
      out.append({**entry, "cell": None, "verdict": "not run", "detail": "no seed has finished it"})
      continue
    cell = max(found, key=lambda c: -1 if c["step"] is None else c["step"])
    v = verdicts.decide(cell["mean"], cell["se"], cell["n"], claim.expect, scale=100.0 if cell["percent"] else 1.0,
                        digits=1 if cell["percent"] else 3, margin=claim.margin)
    out.append({**entry, "cell": format_cell(cell), "step": cell["step"], "n": cell["n"], "verdict": v.word,
                "detail": v.detail, "short": v.short, "z": v.z, "lo": v.lo, "hi": v.hi, "seeds_to_decide": v.seeds})
  return out


def decide_design(design: spec.Design, cells: list[dict]) -> list[dict]:
  """A design's claims, one family (`verdicts.decide_family`), each cell read on the declared seeds only."""
  entries, family = [], []
  for claim in design.claims:
    found = [c for c in cells if c["run"] == claim.run and c["metric"] == claim.metric]
    entry = {"claim": claim.text, "run": claim.run, "metric": claim.metric, "expect": claim.expect,
             "margin": claim.margin}
    cell = max(found, key=lambda c: -1 if c["step"] is None else c["step"]) if found else None
    scale, digits = (100.0, 1) if cell is None or cell["percent"] else (1.0, 3)
    values = [v for seed, v in zip(cell["seeds"], cell["values"]) if seed < design.seeds] if cell else []
    if len(values) < design.seeds:
      family.append(verdicts.Cell(claim.expect, margin=claim.margin, scale=scale, digits=digits, have=len(values),
                                  declared=design.seeds))
      entries.append({**entry, "cell": None, "step": cell["step"] if cell else None, "n": len(values)})
      continue
    mean, se = mean_se(values)
    family.append(verdicts.Cell(claim.expect, mean, se, len(values), claim.margin, scale, digits))
    shown = {**cell, "mean": mean, "se": se, "n": len(values)}
    entries.append({**entry, "cell": format_cell(shown), "step": cell["step"], "n": len(values)})
  out = []
  for entry, v in zip(entries, verdicts.decide_family(family, design.alpha)):
    out.append({**entry, "verdict": v.word, "detail": v.detail, "short": v.short, "lo": v.lo, "hi": v.hi})
  return out
