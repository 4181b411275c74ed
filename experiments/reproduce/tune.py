"""A tuned run's value: the grid value with the best mean validation accuracy on the tuning seeds."""

import json
from typing import Any

from experiments.reproduce import aggregate
from experiments.reproduce import plan as plan_lib


def choose(job: plan_lib.Job) -> tuple[Any, dict]:
  """A tuned run's value: the grid value whose runs on the tuning seeds have the highest mean `by` (the validation
  split's accuracy; ties: the first in the grid), or None while any of them has not finished. Also returns the
  grid's table: value -> (mean, standard error, seeds)."""
  tune, table, complete = job.tuned["tune"], {}, True
  for value, grid_jobs in job.tuned["jobs"].items():
    found = []
    for g in grid_jobs:
      try:
        found.append(float(json.loads(g.summary.read_text())[tune.by]))
      except (OSError, ValueError, KeyError, TypeError):
        complete = False
    if found:
      mean, se = aggregate.mean_se(found)
      table[value] = {"mean": mean, "se": se, "n": len(found)}
  if not complete or not table:
    return None, table
  return max(job.tuned["jobs"], key=lambda v: (table[v]["mean"], -list(job.tuned["jobs"]).index(v))), table


def resolve_tuned(job: plan_lib.Job) -> bool:
  """Fills in a tuned job's value (its argv's "{tuned}"; an alias takes the chosen grid run's directory).
  Returns False while the grid has not finished."""
  value, _ = choose(job)
  if value is None:
    return False
  if job.alias:
    grid = job.tuned["jobs"][value][job.seed]
    job.tuned.setdefault("planned", job.directory)
    job.directory, job.argv = grid.directory, grid.argv
  else:
    job.argv = [a.replace("{tuned}", str(value)) for a in job.argv]
  job.tuned["value"] = value
  return True
