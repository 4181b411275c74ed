"""A study in a profile -> its jobs: one process a run and seed, in a directory named by a hash of what it computes.

The hash covers the runner, its flags, the runner's defaults where they differ from the committed snapshot
(`studies/runner_defaults.json`) and, recursively, the runs a run reads from; a design profile's also covers its
commit. A tuned run's grid becomes runs of their own on the tuning seeds; a shared run is one process, seed 0's,
that every seed's runs read.
"""

import dataclasses
import hashlib
import json
import pathlib
import re
import sys
from typing import Any

from experiments import studies as studies_lib
from experiments.runner import config as config_lib
from experiments.studies import spec

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository: runners run from here
_REF = re.compile(r"\{run:([\w.-]+)\}")


class StudyError(Exception):
  """A problem with a study spec or the command line, reported as one line."""


@dataclasses.dataclass
class Job:
  """One process: a run of the study on one seed, its directory, its command line and what it waits for."""

  run: spec.Run
  seed: int
  directory: pathlib.Path
  argv: list[str]
  needs: list[str]  # names of the runs of the same seed it reads from
  commit: str = ""  # a design profile's: the commit every run of the study comes from
  after: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # runs of other seeds it waits for
  tuned: dict | None = None  # a tuned run: {"tune": spec.Tune, "grid": value -> the tuning seeds' grid jobs}
  alias: bool = False  # a tuned run on a tuning seed: no process, the grid run at the chosen value
  grid: bool = False  # one value of a tuned run's grid on a tuning seed

  @property
  def key(self) -> tuple[str, int]:
    return (self.run.name, self.seed)

  @property
  def waits_for(self) -> list[tuple[str, int]]:
    return [(n, self.seed) for n in self.needs] + self.after

  @property
  def summary(self) -> pathlib.Path:
    return self.directory / "summary.json"

  @property
  def log(self) -> pathlib.Path:
    return self.directory.parent / f"{self.directory.name}.log"

  @property
  def record(self) -> pathlib.Path:
    return self.directory.parent / f"{self.directory.name}.run.json"


def load_study(name: str) -> spec.Study:
  """A registered study by name, or a JSON spec file."""
  if name in studies_lib.STUDIES:
    return studies_lib.STUDIES[name]
  path = pathlib.Path(name)
  if path.suffix == ".json" or path.is_file():
    try:
      return spec.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError) as err:
      raise StudyError(f"{path}: not a study spec ({type(err).__name__}: {err})") from None
  raise StudyError(f"no study {name!r}; known: {', '.join(studies_lib.STUDIES)} (or a .json spec file)")


def flag_args(values: dict[str, Any]) -> list[str]:
  """A run's flags as a runner's command line: --name=value, --name / --noname for a bool, lists comma-joined."""
  args = []
  for name, value in values.items():
    if value is True:
      args.append(f"--{name}")
    elif value is False:
      args.append(f"--no{name}")
    elif isinstance(value, (list, tuple)):
      args.append(f"--{name}={','.join(str(v) for v in value)}")
    else:
      args.append(f"--{name}={value}")
  return args


def _needs(values: dict[str, Any]) -> list[str]:
  """The runs a run's flags name ({run:NAME})."""
  return sorted({m for v in values.values() if isinstance(v, str) for m in _REF.findall(v)})


def _prefix(run: spec.Run) -> list[str]:
  """The command before the flags: the run's own, or `python -m <runner>`."""
  return list(run.command) if run.command else [sys.executable, "-m", run.module]


# The runners' defaults as they were when run directories last moved on purpose: a run's hash covers only the
# defaults that differ from these (and the revision), so a flag added with a default that keeps the old behaviour
# leaves finished runs where they are, while a changed default still moves them. Numerics that change without a
# flag (a kernel, an initialiser) bump the snapshot's "revision" by rewriting the file:
#   python -m experiments.reproduce --write_defaults_snapshot
DEFAULTS_SNAPSHOT = ROOT / "experiments" / "studies" / "runner_defaults.json"


def runner_defaults(run: spec.Run) -> dict[str, str]:
  """The settings a runner module uses for the flags a run leaves out: the runner `Config`'s defaults (with
  Flow-GRPO's own for experiments.flow_grpo); {} for a custom command."""
  if run.command:
    return {}
  where = ("work_dir", "compilation_cache_dir", "cpu_devices")  # where and how it runs, not what it computes
  values = {k: v for k, v in config_lib.Config().flat().items() if k not in where}
  if run.module == spec.FLOW_GRPO:
    values.update({k: v for k, v in config_lib.PRESETS["flow_grpo"].items() if k != "algo"})
  return {k: str(v) for k, v in sorted(values.items())}


def _snapshot_key(run: spec.Run) -> str:
  """Whose defaults in the snapshot a run's runner reads."""
  return spec.FLOW_GRPO if run.module == spec.FLOW_GRPO else spec.GRPO_MATH  # the others read grpo_math's Config


def read_defaults_snapshot(path: pathlib.Path | None = None) -> dict[str, Any]:
  """The committed snapshot: its revision and each runner's defaults; StudyError where it is not one."""
  path = path or DEFAULTS_SNAPSHOT
  try:
    snapshot = json.loads(path.read_text())
    if not isinstance(snapshot.get("revision"), int) or not all(
        isinstance(snapshot.get(k), dict) for k in (spec.GRPO_MATH, spec.FLOW_GRPO)):
      raise ValueError("needs an integer 'revision' and the defaults of each runner")
  except (OSError, ValueError, AttributeError) as err:
    raise StudyError(f"{path}: not a defaults snapshot ({err}); rewrite it with "
                     "python -m experiments.reproduce --write_defaults_snapshot") from None
  return snapshot


def write_defaults_snapshot(path: pathlib.Path | None = None) -> int:
  """Records today's runner defaults under the next revision: every run's hash changes once."""
  path = path or DEFAULTS_SNAPSHOT
  try:
    revision = read_defaults_snapshot(path)["revision"] + 1
  except StudyError:
    revision = 1
  snapshot = {"revision": revision}
  for module in (spec.GRPO_MATH, spec.FLOW_GRPO):
    snapshot[module] = runner_defaults(spec.Run("x", {}, module=module))
  path.write_text(json.dumps(snapshot, indent=1, sort_keys=True) + "\n")
  return revision


def hashed_defaults(run: spec.Run, snapshot: dict[str, Any]) -> dict[str, Any]:
  """What of a runner's defaults enters its runs' hash: the snapshot's revision and the defaults that differ from
  the snapshot's (a flag the snapshot does not know keeps the old behaviour at its default, by convention)."""
  if run.command:
    return {}
  recorded = snapshot[_snapshot_key(run)]
  changed = {k: v for k, v in runner_defaults(run).items() if k in recorded and recorded[k] != v}
  return {"revision": snapshot["revision"], "changed": changed}


def plan(study: spec.Study, profile: str, seeds: list[int], runs_dir: pathlib.Path, commit: str = "") -> list[Job]:
  """The study's jobs, dependencies first, each in `runs_dir/<runner>-<hash>/seed<S>` (the hash: `_digests`)."""
  runs, by_name, merged, grids = _expand(study, profile)
  hashes = _digests(study, by_name, merged, grids, commit)
  order: list[str] = []

  def visit(name: str):
    if name not in order:
      for need in _needs(merged[name]):
        visit(need)
      order.append(name)

  for name in by_name:
    visit(name)

  jobs = []
  tuning_seeds = {s for r in runs if r.tune for s in range(r.tune.seeds)}
  shared = {r.name for r in runs if r.shared}
  grid_of = {g: r for r, pairs in grids.items() for _, g in pairs}
  for seed in sorted(set(seeds) | tuning_seeds | ({0} if shared else set())):
    dirs: dict[str, pathlib.Path] = {}
    for name in order:
      run = by_name[name]
      slug = (run.module.rsplit(".", 1)[-1] if not run.command else name)
      directory = (runs_dir / f"{slug}-{hashes[name]}" / f"seed{0 if name in shared else seed}").resolve()
      dirs[name] = directory
      tuner = by_name[grid_of[name]].tune if name in grid_of else run.tune
      if name in grid_of and seed >= tuner.seeds:
        continue  # a grid runs on the tuning seeds only (which always run, with what their grid needs)
      if name in shared and seed != 0:
        continue  # one process, seed 0's, for every seed
      if name not in shared and seed not in seeds and seed not in tuning_seeds:
        continue  # seed 0 planned only for the shared runs

      def fill(value, dirs=dirs, seed=seed):
        if not isinstance(value, str):
          return value
        return _REF.sub(lambda m: str(dirs[m.group(1)]), value).replace("{seed}", str(seed))

      values = {k: fill(v) for k, v in merged[name].items()}
      argv = _prefix(run) + flag_args(values) + [f"--seed={seed}", f"--{run.output_flag}={directory}"]
      needs = _needs(merged[name])
      job = Job(run, seed, directory, argv, [n for n in needs if n not in shared or seed == 0], commit,
                after=[(n, 0) for n in needs if n in shared and seed != 0], grid=name in grid_of)
      if name in grids:
        job.after += [(g, s) for _, g in grids[name] for s in range(tuner.seeds)]
        job.alias = seed < tuner.seeds
        job.tuned = {"tune": tuner, "grid": {v: g for v, g in grids[name]}}
      jobs.append(job)
  by_key = {j.key: j for j in jobs}
  for job in jobs:  # the grid's jobs themselves, for choosing
    if job.tuned:
      job.tuned["jobs"] = {v: [by_key[(g, s)] for s in range(job.tuned["tune"].seeds)]
                           for v, g in job.tuned["grid"].items()}
  return jobs


def _expand(study: spec.Study, profile: str) -> tuple[list[spec.Run], dict[str, spec.Run], dict[str, dict],
                                                       dict[str, list[tuple[Any, str]]]]:
  """A profile's runs, then every run by name with its merged flags (a tuned run's grid values as runs of their
  own, the run's flag "{tuned}" until one is chosen) and each tuned run's grid: (value, grid run name) pairs."""
  if profile != "full" and profile not in study.profiles:
    raise StudyError(f"study {study.name} has no profile {profile!r}; it has full"
                     + "".join(f", {p}" for p in study.profiles))
  runs = study.runs_in(profile)
  merged = {r.name: study.flags_for(r, profile) for r in runs}
  by_name = {r.name: r for r in runs}
  grids: dict[str, list[tuple[Any, str]]] = {}  # tuned run -> (value, grid run name)
  for run in [r for r in runs if r.tune]:
    tune = run.tune
    if merged[run.name].get("num_validation", 0) in (0, None) and not run.command:
      raise StudyError(f"study {study.name}, run {run.name}: a tuned --{tune.flag} is chosen on a validation "
                       "split: the run needs --num_validation")
    grids[run.name] = []
    for value in tune.values:
      name = tune.grid_name(run.name, value)
      by_name[name] = dataclasses.replace(run, name=name, label=f"{run.display}, --{tune.flag}={value}", tune=None)
      merged[name] = {**merged[run.name], tune.flag: value}
      grids[run.name].append((value, name))
    merged[run.name] = {**merged[run.name], tune.flag: "{tuned}"}
  for run in by_name.values():
    for flag in ("seed", run.output_flag):
      if flag in merged[run.name]:
        raise StudyError(f"study {study.name}, run {run.name}: --{flag} is set by reproduce, leave it out")
    unknown = set(_needs(merged[run.name])) - set(merged)
    if unknown:
      raise StudyError(f"study {study.name}, run {run.name}: names runs that are not in profile {profile}: "
                       f"{sorted(unknown)}")
    per_seed = [n for n in _needs(merged[run.name]) if not by_name[n].shared]
    if run.shared and (per_seed or any("{seed}" in str(v) for v in merged[run.name].values())):
      raise StudyError(f"study {study.name}, run {run.name}: a shared run (one for every seed) cannot read a "
                       f"seed's own runs or {{seed}}: {per_seed or ['{seed}']}")
  return runs, by_name, merged, grids


def _digests(study: spec.Study, by_name: dict[str, spec.Run], merged: dict[str, dict],
             grids: dict[str, list[tuple[Any, str]]], commit: str) -> dict[str, str]:
  """Each run's directory hash.

  The hash covers the runner, the flags (before {run:..} and {seed} are filled in), the runner's defaults where
  they differ from the snapshot's (`hashed_defaults`) and, recursively, the runs they name, so equal
  configurations share a directory across studies, profiles never collide, runs made under other defaults are not
  taken for this code's, and a new flag that keeps the old behaviour does not orphan finished runs. With `commit`
  (a design profile's) it covers the commit too: no run of other code is reused.
  """
  hashes: dict[str, str] = {}
  snapshot = read_defaults_snapshot()

  def digest(name: str, visiting: tuple[str, ...] = ()) -> str:
    if name in visiting:
      raise StudyError(f"study {study.name}: runs need each other in a cycle: {' -> '.join(visiting + (name,))}")
    if name not in hashes:
      run = by_name[name]
      blob = {"command": list(run.command) or [run.module], "out_flag": run.output_flag,
              "flags": {k: str(v) for k, v in sorted(merged[name].items())},
              "defaults": hashed_defaults(run, snapshot),
              "needs": {n: digest(n, visiting + (name,)) for n in _needs(merged[name])}}
      if commit:
        blob["commit"] = commit
      if run.shared:  # seed 0's process for every seed (the key only where set: other runs' hashes stay)
        blob["shared"] = True
      if name in grids:  # the value comes from the grid: the grid's runs and the rule that chooses
        blob["tune"] = {"grid": {str(v): digest(g, visiting + (name,)) for v, g in grids[name]},
                        "seeds": run.tune.seeds, "by": run.tune.by}
      hashes[name] = hashlib.sha1(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:10]
    return hashes[name]

  for name in by_name:
    digest(name)
  return hashes
