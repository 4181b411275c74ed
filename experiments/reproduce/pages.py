"""A study's pages: results.json and results.md (verdicts, tables, plots, runs) and, over the committed pages under
docs/reproduce, the README's claims table, `--redecide` and `--redraw`."""

import dataclasses
import json
import pathlib
import re
import shlex
import sys
import tempfile

from experiments import studies as studies_lib
from experiments.reproduce import aggregate
from experiments.reproduce import design as design_lib
from experiments.reproduce import execute
from experiments.reproduce import plan as plan_lib
from experiments.reproduce import plots
from experiments.reproduce import tune
from experiments.studies import spec
from experiments.studies import verdicts

PAGES = plan_lib.ROOT / "docs" / "reproduce"  # committed pages: <study>/results.json (quick), <study>/full/...


def report(study: spec.Study, profile: str, seeds: list[int], jobs: list[plan_lib.Job],
           outcomes: dict[tuple[str, int], execute.Outcome], out_dir: pathlib.Path, invocation: dict) -> dict:
  """Writes results.json, results.md and the plots; returns the results. A design profile's table takes every run
  from one commit (`check_one_commit`)."""
  if profile in study.designs:
    design_lib.check_one_commit(jobs, next((j.commit for j in jobs if j.commit), ""))
  out_dir.mkdir(parents=True, exist_ok=True)
  tuning = _tuning(jobs)
  grid_jobs = [j for j in jobs if j.grid]
  jobs = [j for j in jobs if not j.grid and not (j.alias and j.tuned.get("value") is None)]
  cells = aggregate.collect(study, jobs)
  drawn = plots.draw(study, cells, out_dir, profile)
  runs = _runs(study, profile, jobs, outcomes)
  failures = [{"run": k[0], "seed": k[1], "status": o.status, "message": o.message}
              for k, o in sorted(outcomes.items()) if o.status in ("failed", "blocked")]
  compute = sum(t for r in runs.values() for t in r["wall_time_s"].values() if t is not None)
  shown = {j.directory for j in jobs}  # a grid run that is also a tuned run's (its chosen value) counts once
  compute += sum(execute.recorded_time(g) or 0.0 for g in grid_jobs if g.directory not in shown)
  results = {"study": study.name, "title": study.title, "profile": profile, "seeds": seeds,
             **_rule(study, profile, jobs),
             "verdicts": aggregate.decide_claims(study, cells, profile),
             "profile_flags": {m: dict(f) for m, f in study.profiles.get(profile, {}).items()},
             "note": study.notes.get(profile, ""), "invocation": invocation, "invocations": _history(out_dir, profile),
             "compute_time_s": round(compute, 1), "runs": runs, "failures": failures, "tuning": tuning,
             "cells": cells,
             "plots": [p.name for p in drawn]}
  (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
  (out_dir / "results.md").write_text(markdown(study, results, cells, drawn))
  return results


def _tuning(jobs: list[plan_lib.Job]) -> dict[str, dict]:
  """Each tuned run's flag, grid (each value's validation mean ± s.e.) and chosen value (None until the grid has
  finished); a tuning seed's job takes the chosen grid run's directory."""
  tuning = {}
  for job in jobs:
    if job.tuned:
      value, table = tune.choose(job)
      if job.alias and value is not None:
        tune.resolve_tuned(job)
      tuning[job.run.name] = {"flag": job.tuned["tune"].flag, "by": job.tuned["tune"].by,
                              "seeds": job.tuned["tune"].seeds, "chosen": value,
                              "grid": [{"value": v, **table.get(v, {"mean": None, "se": None, "n": 0})}
                                       for v in job.tuned["grid"]]}
  return tuning


def _runs(study: spec.Study, profile: str, jobs: list[plan_lib.Job],
          outcomes: dict[tuple[str, int], execute.Outcome]) -> dict[str, dict]:
  """Each run of the profile: its label, flags, seed 0's command, directories, status, wall times, held-out set
  sizes and code versions by seed."""
  runs = {}
  for run in study.runs_in(profile):
    own = [j for j in jobs if j.run.name == run.name]
    times = {j.seed: (outcomes[j.key].wall_time_s if j.key in outcomes else execute.recorded_time(j)) for j in own}
    held_out, versions = set(), {}
    for j in own:
      if j.summary.is_file():
        summary = aggregate.read_json(j.summary, "a run's summary")
        if summary.get("num_eval_problems") is not None:
          held_out.add(summary["num_eval_problems"])
        versions[j.seed] = summary.get("code_version") or execute.recorded_commit(j) or "not recorded"
    runs[run.name] = {
        "label": run.display, "module": run.module, "flags": study.flags_for(run, profile),
        "command_seed0": _shown(shlex.join(own[0].argv)) if own else "",
        "directories": {j.seed: _shown(str(j.directory)) for j in own},
        "status": {j.seed: (outcomes[j.key].status if j.key in outcomes
                            else ("cached" if j.summary.is_file() else "missing")) for j in own},
        "wall_time_s": times, "num_eval_problems": sorted(held_out), "code_versions": versions}
  return runs


def _history(out_dir: pathlib.Path, profile: str) -> list[dict]:
  """The profile's invocations that ran something, from out_dir/invocations.jsonl (a line cut short is skipped)."""
  history = []
  if (out_dir / "invocations.jsonl").is_file():
    for line in (out_dir / "invocations.jsonl").read_text().splitlines():
      try:
        record = json.loads(line)
      except ValueError:
        continue
      if record.get("profile") == profile and record.get("ran"):
        history.append(record)
  return history


def _rule(study: spec.Study, profile: str, jobs: list[plan_lib.Job]) -> dict:
  """How the page's verdicts are decided: a design's (t, Holm; with its commit, declaration and claims), else the
  rule of 2 standard errors."""
  design = study.designs.get(profile)
  if design is None:
    return {"rule": "2se"}
  commit = next((j.commit for j in jobs if j.commit), "")
  return {"rule": "t-holm", "commit": commit, "declared": design_lib.declaration(study, commit),
          "design": {"seeds": design.seeds, "alpha": design.alpha, "note": design.note,
                     "claims": [dataclasses.asdict(c) for c in design.claims],
                     "shared": [r.name for r in study.runs_in(profile) if r.shared]}}


def markdown(study: spec.Study, results: dict, cells: list[dict], figures: list[pathlib.Path]) -> str:
  """results.md: the study and its profile, the design, the verdicts, the tuning, the tables, the plots, the runs."""
  lines = [f"# {study.title}", ""]
  if study.description:
    lines += [study.description.strip(), ""]
  held_out = sorted({n for r in results["runs"].values() for n in r["num_eval_problems"]})
  lines.append(f"Study `{study.name}`, profile `{results['profile']}`, seeds {', '.join(map(str, results['seeds']))}; "
               f"held-out problems per evaluation: {', '.join(map(str, held_out)) or 'n/a'}. Each cell is the mean "
               "± standard error over seeds (s / √n), with the number of seeds in parentheses.")
  if results["note"]:
    lines += ["", f"Profile `{results['profile']}`: {results['note']}"]
  for module, values in results["profile_flags"].items():
    lines.append(f"Flags it adds to every `{module}` run: `{' '.join(plan_lib.flag_args(values))}`.")
  lines.append("")
  lines += _design_lines(results)
  lines += _verdict_lines(results["verdicts"], results.get("rule", "2se"))
  lines += _tuning_lines(study, results)
  lines += tables(study, cells)
  for p in figures:
    lines += [f"![{p.stem}]({p.name})", ""]
  lines += ["## Runs", "",
            f"Run time of all runs, summed over runs and seeds as recorded when each ran (runs shared with another "
            f"study count here too): {results['compute_time_s'] / 60:.1f} min.", ""]
  if results["invocations"]:
    total = sum(i["wall_time_s"] for i in results["invocations"])
    lines.append(f"Invocations that ran something ({total / 60:.1f} min wall in all):")
    lines += [f"- {i['started']}: {i['wall_time_s'] / 60:.1f} min wall, {i['ran']} runs ran, {i['cached']} done "
              f"already, {i['failed']} failed; --parallel={i['parallel']}, load average (1, 5, 15 min) "
              f"{i['loadavg_start']} at the start, {i['loadavg_end']} at the end, {i['cpu_count']} CPUs"
              for i in results["invocations"]]
    lines.append("")
  lines += ["| run | wall time per seed (min) | status | command (seed 0) |", "|---|---|---|---|"]
  for name, r in results["runs"].items():
    times = ", ".join("-" if t is None else f"{t / 60:.1f}" for t in r["wall_time_s"].values())
    status = ", ".join(sorted(set(r["status"].values())))
    command = r["command_seed0"].replace("\n", " ")
    lines.append(f"| {r['label']} | {times} | {status} | `{command}` |")
  versions = sorted({v for r in results["runs"].values() for v in r.get("code_versions", {}).values()})
  if versions:
    lines += ["", f"Code versions of the runs aggregated ({len(versions)}): "
              + ", ".join(f"`{v[:12] + v[40:] if len(v) >= 40 else v}`" for v in versions)
              + (". A run's directory is named by its runner and flags, not its code: runs of other code versions "
                 "are reused until their directories are removed." if len(versions) > 1 else ".")]
  if results["failures"]:
    lines += ["", "## Failures", ""]
    lines += [f"- {f['run']} seed {f['seed']}: {f['status']}: {f['message']}" for f in results["failures"]]
  return "\n".join(lines) + "\n"


def _shown(text: str) -> str:
  """Paths inside the repository relative to it, the interpreter as `python`."""
  return text.replace(sys.executable, "python").replace(str(plan_lib.ROOT) + "/", "")


def _verdict_lines(verdict_list: list[dict], rule: str = "2se") -> list[str]:
  """The page's "Verdicts" section: the rule, then each claim's cell and verdict."""
  if not verdict_list:
    return []
  if rule == "t-holm":
    said = ("Each of the paper's findings against its cell (mean ± s.e. (seeds) on the declared seeds, at the last "
            "step), decided by the design's rule: Student-t p-values on the paired per-seed values, Holm-corrected "
            "across the claims at the declared α; reproduced or contradicted when the test against zero rejects, "
            "equal within the declared margin when the equivalence test (two one-sided t tests) rejects, else "
            "undecided; pending until every claim has all its declared seeds "
            "(`experiments/studies/verdicts.py`, `decide_family`).")
  else:
    said = (f"Decided by the rule these runs were made under, before the designs of issue 56 (labelled so: it is "
            f"looser than it reads): each finding against its cell (mean ± s.e. (seeds), at the last step); with "
            f"{verdicts.MIN_SEEDS} or more seeds, reproduced or contradicted when the {verdicts.Z:g}-standard-error "
            "interval lies on one side of zero (an 82% interval at 3 seeds, 88% at 5), no correction across the "
            "claims; equal when a claimed ordering's interval holds zero but lies inside its margin (a margin set "
            "after the quick pages); consistent when a claimed non-change stays inside its margin (or, with none, "
            "the interval holds zero); else undecided.")
  lines = ["## Verdicts", "", said, "",
           "| the paper | cell | value | verdict |", "|---|---|---|---|"]
  lines += [f"| {v['claim']} | {v['run']}, {v['metric']} | {v.get('cell') or '-'} | **{v['verdict']}** "
            f"({v['detail']}) |" for v in verdict_list]
  return lines + [""]


def _design_lines(results: dict) -> list[str]:
  """A design page's "Design" section: what was declared, in which commit, and the commit the runs come from."""
  if results.get("rule") != "t-holm":
    return []
  design, declared, commit = results["design"], results["declared"], results["commit"]
  when = (f"commit `{declared['commit'][:12]}` ({declared['date']}), the last commit at or before the runs' to "
          f"change {', '.join(f'`{f}`' for f in declared['files'])}" if declared.get("commit")
          else "a commit git could not name")
  lines = ["## Design", "",
           f"Declared before the runs in {when}. Every run on this page comes from commit `{commit[:12]}` "
           f"(reproduce refuses a table that mixes commits). Seeds per arm: {design['seeds']} (seeds 0 to "
           f"{design['seeds'] - 1}; more are left out of the verdicts); family-wise error rate α = "
           f"{design['alpha']:g} over the claims below (Holm)." + (f" {design['note']}" if design["note"] else "")
           + (f" Shared by every seed (one process, seed 0's): {', '.join(f'`{n}`' for n in design['shared'])}; "
              "the seeds vary what follows it, so the verdicts hold for that start."
              if design.get("shared") else ""),
           "", "| claim | cell | expected | margin |", "|---|---|---|---|"]
  words = {">": "above zero", "<": "below zero", "=": "no change", "": "no ordering (reported)"}
  for c in design["claims"]:
    margin = f"±{100 * c['margin']:.1f} points" if c["margin"] else "-"
    lines.append(f"| {c['text']} | {c['run']}, {c['metric']} | {words[c['expect']]} | {margin} |")
  return lines + [""]


def _tuning_lines(study: spec.Study, results: dict) -> list[str]:
  """The "chosen on the validation split" section: each tuned run's grid, its validation means, the choice."""
  tuning = results.get("tuning") or {}
  if not tuning:
    return []
  lines = ["## Hyperparameters chosen on the validation split", "",
           "Each tuned run was made at every value of its grid on the tuning seeds, with `--num_validation` "
           "problems of the training pool held out; the value with the best mean validation accuracy is the run's "
           "on every seed (the tuning seeds' runs at that value are its runs there). The test set chose nothing.",
           "", "| run | flag | value: validation accuracy, mean ± s.e. (seeds) | chosen |", "|---|---|---|---|"]
  label = {r.name: r.display for r in study.runs}
  for name, t in tuning.items():
    grid = "; ".join(f"{g['value']:g}: " + ("-" if g["mean"] is None else aggregate.format_cell(
        {"mean": g["mean"], "se": g["se"], "n": g["n"], "percent": True})) for g in t["grid"])
    chosen = "not yet (the grid has not finished)" if t["chosen"] is None else f"**{t['chosen']:g}**"
    lines.append(f"| {label.get(name, name)} | --{t['flag']} | {grid} | {chosen} |")
  return lines + [""]


def tables(study: spec.Study, cells: list[dict]) -> list[str]:
  """Markdown tables: a curve metric by step, a templated metric by k, the scalar metrics side by side."""
  index = {(c["run"], c["metric"], c["step"]): c for c in cells}
  runs = [r for r in study.runs if any(c["run"] == r.name for c in cells)]
  out = []
  scalars = []
  for metric in study.metrics:
    if metric.source == "curve" and not metric.reduce:
      out += _by_step(metric, runs, cells, index)
    elif metric.ks:
      out += _by_k(metric, runs, index)
    else:
      scalars.append(metric)
  if study.contrasts:
    out += _contrasts(study, cells)
  if scalars:
    out += _scalars(scalars, runs, cells, index)
  return out


def _by_step(metric: spec.Metric, runs: list[spec.Run], cells: list[dict], index: dict) -> list[str]:
  """A curve metric: a row a run, a column a step."""
  steps = sorted({c["step"] for c in cells if c["metric"] == metric.name})
  rows = [r for r in runs if any((r.name, metric.name, s) in index for s in steps)]
  if not rows:
    return []
  out = [f"**{metric.display}** by step (mean ± s.e. (seeds))\n"]
  out.append("| run | " + " | ".join(f"step {s}" for s in steps) + " |")
  out.append("|---|" + "---|" * len(steps))
  for r in rows:
    out.append(f"| {r.display} | "
               + " | ".join(aggregate.format_cell(index.get((r.name, metric.name, s))) for s in steps) + " |")
  return out + [""]


def _by_k(metric: spec.Metric, runs: list[spec.Run], index: dict) -> list[str]:
  """A templated metric (maj@{k}): a row a run, a column a K."""
  names = [(n, k) for n, _, _, k in metric.expand()]
  rows = [r for r in runs if any((r.name, n, None) in index for n, _ in names)]
  if not rows:
    return []
  out = [f"**{metric.display.format(k='K')}** by K (mean ± s.e. (seeds))\n"]
  out.append("| run | " + " | ".join(f"K={k}" for _, k in names) + " |")
  out.append("|---|" + "---|" * len(names))
  for r in rows:
    out.append(f"| {r.display} | "
               + " | ".join(aggregate.format_cell(index.get((r.name, n, None))) for n, _ in names) + " |")
  return out + [""]


def _contrasts(study: spec.Study, cells: list[dict]) -> list[str]:
  """Each contrast's paired differences, a row a metric and step."""
  label = {r.name: r.display for r in study.runs}
  metrics = {m.name: m for m in study.metrics}
  out = ["Paired differences, run a minus run b seed by seed (mean ± s.e. (seeds)); a difference more than "
         "about two standard errors from zero is unlikely to be noise\n"]
  out.append("| a - b | metric | step | difference |")
  out.append("|---|---|---|---|")
  for c in study.contrasts:
    for cell in (x for x in cells if x["run"] == c.run and x["metric"] == c.metric):
      step = "end" if cell["step"] is None else str(cell["step"])
      out.append(f"| {label[c.a]} - {label[c.b]} | {metrics[c.metric].display if c.metric in metrics else c.metric}"
                 f" | {step} | {aggregate.format_cell(cell)} |")
  return out + [""]


def _scalars(scalars: list[spec.Metric], runs: list[spec.Run], cells: list[dict], index: dict) -> list[str]:
  """The scalar metrics side by side (mean ± s.e.), then every seed's value."""
  rows = [r for r in runs if any((r.name, m.name, None) in index for m in scalars)]
  cols = [m for m in scalars if any((r.name, m.name, None) in index for r in rows)]
  if not (rows and cols):
    return []
  out = ["Mean ± s.e. (seeds)\n"]
  out.append("| run | " + " | ".join(m.display for m in cols) + " |")
  out.append("|---|" + "---|" * len(cols))
  for r in rows:
    out.append(f"| {r.display} | "
               + " | ".join(aggregate.format_cell(index.get((r.name, m.name, None))) for m in cols) + " |")
  out.append("")
  seeds = sorted({s for c in cells for s in c["seeds"]})
  out.append("Per seed\n")
  out.append("| run | metric | " + " | ".join(f"seed {s}" for s in seeds) + " |")
  out.append("|---|---|" + "---|" * len(seeds))
  for r in rows:
    for m in cols:
      cell = index.get((r.name, m.name, None))
      if cell is None:
        continue
      by_seed = dict(zip(cell["seeds"], cell["values"]))
      scale, digits = (100.0, 1) if cell["percent"] else (1.0, 3)
      out.append(f"| {r.display} | {m.display} | " + " | ".join(
          f"{scale * by_seed[s]:.{digits}f}" if s in by_seed else "-" for s in seeds) + " |")
  return out + [""]


# THE COMMITTED PAGES: docs/reproduce/<study>/results.json (quick), <study>/full/, <study>/<design profile>/


def claims_table(pages: pathlib.Path = PAGES) -> str:
  """The Markdown table of every registered study's claims against its committed quick and full pages (verdicts
  decided again from the pages' cells): what the README's "What reproduces" shows."""

  def read(path: pathlib.Path) -> dict | None:
    return aggregate.read_json(path, "a study's results page", need=("cells",)) if path.is_file() else None

  def column(study, page, claim):
    if page is None:
      return "not yet", None
    v = next(v for v in aggregate.decide_claims(study, page["cells"]) if v["claim"] == claim.text)
    if v["verdict"] == "not run":
      return "not yet", None
    word = "" if v["verdict"] == "reported" else f": **{v['verdict']}**"
    return f"{v['cell'].rsplit(' (', 1)[0]} ({v['n']} seed{'s' if v['n'] != 1 else ''}){word}", v

  def says(v, profile):
    return "-" if v is None else f"{profile}: {v['short']}"

  lines = ["| the paper (old rule: 2 s.e., no correction) | quick profile (40 RL steps) | full profile (the "
           "runners' settings) | in short |", "|---|---|---|---|"]
  for name, study in studies_lib.STUDIES.items():
    quick, full = read(pages / name / "results.json"), read(pages / name / "full" / "results.json")
    for claim in study.claims:
      (q_text, q), (f_text, f) = column(study, quick, claim), column(study, full, claim)
      lines.append(f"| {claim.text} | {q_text} | {f_text} | {says(f, 'full') if f else says(q, 'quick')} |")
  designed = [(name, study, profile) for name, study in studies_lib.STUDIES.items() for profile in study.designs]
  if designed:
    lines += ["", "| the paper (a declared design: t, Holm) | study, profile | value (seeds) | verdict |",
              "|---|---|---|---|"]
  for name, study, profile in designed:
    page = read(pages / name / profile / "results.json")
    decided = aggregate.decide_claims(study, page["cells"], profile) if page else None
    for i, claim in enumerate(study.designs[profile].claims):
      v = decided[i] if decided else None
      value = f"{v['cell'].rsplit(' (', 1)[0]} ({v['n']} seeds)" if v and v["cell"] else "not yet"
      verdict = f"**{v['verdict']}**: {v['short']}" if v else "not yet run"
      lines.append(f"| {claim.text} | {name}, {profile} | {value} | {verdict} |")
  return "\n".join(lines) + "\n"


def page_dirs(pages: pathlib.Path, name: str, study: spec.Study) -> list[pathlib.Path]:
  """Where a study's committed pages live: <name>/ (quick), <name>/full/, <name>/<profile>/ for each design."""
  return [pages / name, pages / name / "full"] + [pages / name / p for p in study.designs if p != "full"]


def redecide_pages(pages: pathlib.Path = PAGES) -> list[pathlib.Path]:
  """Rewrites the verdicts of every committed page (results.json and the Verdicts section of results.md) from its
  own cells under today's claims and rules; the runs need not exist, and the rest of the page stays as it ran.
  Returns the pages it changed."""
  changed = []
  read = {path: aggregate.read_json(path, "a study's results page", need=("cells",))  # all read before any is written
          for name, study in studies_lib.STUDIES.items() for path in (d / "results.json" for d in
                                                                      page_dirs(pages, name, study)) if path.is_file()}
  for name, study in studies_lib.STUDIES.items():
    for page_dir in page_dirs(pages, name, study):
      path, md = page_dir / "results.json", page_dir / "results.md"
      if not path.is_file():
        continue
      results = read[path]
      verdicts_now = json.loads(json.dumps(aggregate.decide_claims(study, results["cells"], results.get("profile")),
                                           default=str))
      lines = md.read_text().split("\n")
      if "## Verdicts" in lines:
        start = lines.index("## Verdicts")
        end = start + 4  # the heading, a blank line, the rule, a blank line, then the table
        while end < len(lines) and lines[end].startswith("|"):
          end += 1
        end += 1  # the blank line after the table
      else:  # a page from before verdicts: the section goes before the first table
        start = end = next((i for i, line in enumerate(lines) if line.startswith(("**", "## Runs"))), len(lines))
      section = _verdict_lines(verdicts_now, results.get("rule", "2se"))
      if verdicts_now == results.get("verdicts", []) and lines[start:end] == section:
        continue
      results["verdicts"] = verdicts_now
      path.write_text(json.dumps(results, indent=2, default=str) + "\n")
      lines[start:end] = section
      md.write_text("\n".join(lines))
      changed.append(page_dir)
  return changed


FIGURE_LINK = re.compile(r"!\[[^\]]*\]\(([^)/]+\.png)\)")  # a page's figure: ![stem](file.png), alone on its line


def redraw_pages(pages: pathlib.Path = PAGES) -> list[pathlib.Path]:
  """Brings every committed page's figures in line with today's profiles: a figure that is not its profile's (older
  code drew other profiles' figures, empty) goes with its file and its link, and a figure of its profile that the
  page lacks is drawn from its own cells. Figures already there stay as they ran, like the tables, verdicts and runs
  (today's plot may have panels for runs the page never had); the runs need not exist. Returns the pages it changed;
  a page it cannot read stops it before any is written."""
  changed = []
  read = {path: aggregate.read_json(path, "a study's results page", need=("cells",))
          for name, study in studies_lib.STUDIES.items() for path in (d / "results.json" for d in
                                                                      page_dirs(pages, name, study)) if path.is_file()}
  for name, study in studies_lib.STUDIES.items():
    for page_dir in page_dirs(pages, name, study):
      path, md = page_dir / "results.json", page_dir / "results.md"
      if not (path.is_file() and md.is_file()):
        continue
      results = read[path]
      lines = md.read_text().split("\n")
      linked = [i for i, line in enumerate(lines) if FIGURE_LINK.fullmatch(line)]
      old = [FIGURE_LINK.fullmatch(lines[i]).group(1) for i in linked]
      profile = results.get("profile", "")
      new = {p.file: None for p in plots.figures(study, profile)}
      if any(not (page_dir / f).is_file() for f in new):
        with tempfile.TemporaryDirectory() as tmp:
          drawn = plots.draw(study, results["cells"], pathlib.Path(tmp), profile)
          new.update({p.name: p.read_bytes() for p in drawn if not (page_dir / p.name).is_file()})
      stale = [f for f in dict.fromkeys(old + list(results.get("plots", []))) if f not in new]
      added = [f for f, data in new.items() if data is not None]
      if not stale and not added and old == list(new) and results.get("plots") == list(new):
        continue
      for f in added:
        (page_dir / f).write_bytes(new[f])
      at = linked[0] if linked else next((i for i, line in enumerate(lines) if line == "## Runs"), len(lines))
      for i in reversed(linked):  # each link and the blank line after it
        del lines[i:i + 2 if i + 1 < len(lines) and not lines[i + 1] else i + 1]
      lines[at:at] = [line for f in new for line in (f"![{pathlib.Path(f).stem}]({f})", "")]
      md.write_text("\n".join(lines))
      results["plots"] = list(new)
      path.write_text(json.dumps(results, indent=2, default=str) + "\n")
      for f in stale:
        (page_dir / f).unlink(missing_ok=True)
      changed.append(page_dir)
  return changed
