"""experiments.reproduce.pages: the README's claims table from the committed pages, `--redecide`, `--redraw`, and
cut short."""

import dataclasses
import json
import re

import pytest

from experiments import studies
from experiments.reproduce import __main__ as reproduce_main
from experiments.reproduce import aggregate
from experiments.reproduce import pages
from experiments.reproduce import pipeline
from experiments.reproduce import plan as plan_lib
from experiments.reproduce import plots
from experiments.studies import spec
from experiments.studies import verdicts
from tests import reproduce_fakes as fakes


def test_claims_table_reads_quick_and_full_pages(tmp_path):
  """The README's table: each claim against the committed quick page and, where it exists, the full one (its
  verdict decided again from the cells); a study without pages reads "not yet"."""
  quick = json.loads((pages.PAGES / "paradigm" / "results.json").read_text())
  (tmp_path / "paradigm" / "full").mkdir(parents=True)
  (tmp_path / "paradigm" / "results.json").write_text(json.dumps(quick))
  full = [dict(c) for c in quick["cells"] if c["run"] == "grpo - rft" and c["metric"] == "final"]
  full[0].update(n=5, seeds=[0, 1, 2, 3, 4], values=[0.01, 0.03, 0.02, 0.04, 0.05], mean=0.03, se=0.007)
  (tmp_path / "paradigm" / "full" / "results.json").write_text(json.dumps({"cells": full}))
  q = {c["run"]: c for c in quick["cells"] if c["metric"] == "final" and c["step"] is None}
  rows = {line.split(" | ")[0][2:]: line for line in pages.claims_table(tmp_path).split("\n\n")[0].splitlines()[2:]}
  m, s = 100 * q["grpo - rft"]["mean"], 100 * q["grpo - rft"]["se"]
  assert rows["Fig 5: GRPO+OS > RFT"] == (f"| Fig 5: GRPO+OS > RFT | {m:.1f} ± {s:.1f} (3 seeds): **contradicted** | "
                                         "3.0 ± 0.7 (5 seeds): **reproduced** | full: 4.3 s.e. |")
  assert "** | not yet | quick: " in rows["Fig 5: GRPO+PS > GRPO+OS"]  # no full cell: the quick one speaks
  flat = "Fig 7: Pass@64 stays flat (within ±3 points)"
  assert rows[flat] == f"| {flat} | not yet | not yet | - |"
  # a no-change claim with a margin: +1.1 ± 0.1 is 19 s.e. from zero but inside ±3 points; on 2 seeds, no verdict
  (tmp_path / "majk_passk" / "full").mkdir(parents=True)
  page = lambda values: {"cells": [  # noqa: E731
      {"run": "after - before", "metric": "pass@64", "step": None, "percent": True, "n": len(values),
       "seeds": list(range(len(values))), "values": values, "mean": sum(values) / len(values),
       "se": aggregate.mean_se(values)[1]}]}
  (tmp_path / "majk_passk" / "full" / "results.json").write_text(json.dumps(page([0.010, 0.012, 0.011])))
  rows = {line.split(" | ")[0][2:]: line for line in pages.claims_table(tmp_path).split("\n\n")[0].splitlines()[2:]}
  assert rows[flat] == (f"| {flat} | not yet | 1.1 ± 0.1 (3 seeds): **consistent** | full: [+1.0, +1.2] at 2 s.e., "
                        "inside ±3.0 |")
  (tmp_path / "majk_passk" / "full" / "results.json").write_text(json.dumps(page([0.010, 0.012])))
  rows = {line.split(" | ")[0][2:]: line for line in pages.claims_table(tmp_path).split("\n\n")[0].splitlines()[2:]}
  assert rows[flat] == (f"| {flat} | not yet | 1.1 ± 0.1 (2 seeds): **undecided** | full: 2 seeds, too few to decide "
                        "(11.0 s.e.; [+0.9, +1.3] at 2 s.e.) |")


def test_claims_table_reads_a_design_page(tmp_path):
  """The README's second table: the fair design's claims against a committed <study>/fair page, decided by the
  design's rule on its declared 8 seeds; a family with a claim short of its seeds is pending throughout."""
  design = plan_lib.load_study("paradigm").designs["fair"]

  def cell(run, metric, values):
    mean, se = aggregate.mean_se(values)
    return {"run": run, "metric": metric, "step": None, "percent": True, "n": len(values),
            "seeds": list(range(len(values))), "values": values, "mean": mean, "se": se}

  big = [0.10, 0.12, 0.11, 0.13, 0.09, 0.10, 0.12, 0.11]  # +11.0 ± 0.5 points: far from zero
  flat = [0.001, -0.002, 0.0, 0.002, -0.001, 0.001, 0.0, -0.001]  # +0.0 ± 0.0: inside ±3 points
  cells = [cell(c.run, c.metric, flat if c.run == "fair_grpo_ps - fair_grpo" else big) for c in design.claims]
  (tmp_path / "paradigm" / "fair").mkdir(parents=True)
  (tmp_path / "paradigm" / "fair" / "results.json").write_text(json.dumps({"profile": "fair", "cells": cells}))
  table = pages.claims_table(tmp_path).split("\n\n")[1]
  rows = {line.split(" | ")[0][2:]: line for line in table.splitlines()[2:] if "| paradigm, fair |" in line}
  assert rows["Fig 5: GRPO+OS > Online RFT"].startswith(
      "| Fig 5: GRPO+OS > Online RFT | paradigm, fair | 11.0 ± 0.5 (8 seeds) | **reproduced**: [+9.9, +12.1] (95% t)")
  assert f"| **{verdicts.EQUAL}**: " in rows["Fig 5: GRPO+PS > GRPO+OS"]
  assert "| **reported**: no ordering claimed" in rows["Pooled RFT beside RFT (Table 10's)"]
  cells[1] = cell(cells[1]["run"], "final", big[:7])  # one claim at 7 of its 8 seeds
  (tmp_path / "paradigm" / "fair" / "results.json").write_text(json.dumps({"profile": "fair", "cells": cells}))
  table = pages.claims_table(tmp_path).split("\n\n")[1]
  words = [line.split("| **")[1].split("**")[0] for line in table.splitlines()[2:]
           if "| **" in line and "| paradigm, fair |" in line]
  assert words == ["pending"] * 5 + ["reported"] * 3


def test_redecide_rewrites_only_the_verdicts(tmp_path):
  """`--redecide`: a page whose stored verdict is stale gets today's, in results.json and in its Verdicts section;
  the rest of results.md stays as it ran; a page from before verdicts gets the section before its first table."""
  src = pages.PAGES / "paradigm" / "full"
  (tmp_path / "paradigm" / "full").mkdir(parents=True)
  page = json.loads((src / "results.json").read_text())
  today = aggregate.decide_claims(plan_lib.load_study("paradigm"), page["cells"])
  stale = json.loads(json.dumps(today, default=str))
  stale[0].update(verdict="reproduced", detail="a stale verdict")
  md = (src / "results.md").read_text().replace(f"**{today[0]['verdict']}** ({today[0]['detail']})",
                                                "**reproduced** (a stale verdict)")
  assert "a stale verdict" in md
  (tmp_path / "paradigm" / "full" / "results.json").write_text(json.dumps({**page, "verdicts": stale}))
  (tmp_path / "paradigm" / "full" / "results.md").write_text(md)
  old_page = {k: v for k, v in page.items() if k != "verdicts"}  # the quick page's layout, before verdicts
  (tmp_path / "paradigm" / "results.json").write_text(json.dumps(old_page))
  (tmp_path / "paradigm" / "results.md").write_text("# t\n\nintro\n\n**held-out** by step\n\n| a |\n")
  assert pages.redecide_pages(tmp_path) == [tmp_path / "paradigm", tmp_path / "paradigm" / "full"]
  assert (tmp_path / "paradigm" / "full" / "results.md").read_text() == (src / "results.md").read_text()
  assert json.loads((tmp_path / "paradigm" / "full" / "results.json").read_text())["verdicts"] == json.loads(
      json.dumps(today, default=str))
  lines = (tmp_path / "paradigm" / "results.md").read_text().split("\n")
  assert lines[:5] == ["# t", "", "intro", "", "## Verdicts"] and lines[-4:] == ["**held-out** by step", "", "| a |", ""]
  assert len(lines) == 4 + 4 + 2 + len(today) + 1 + 4
  assert pages.redecide_pages(tmp_path) == []  # nothing stale now


def test_redecide_reads_a_design_page(tmp_path):
  """A design profile's page (<study>/fair/) is decided again by the design's rule, t and Holm over its 8 claims; it
  was left out of the pages read first, and `--redecide` ended in a KeyError."""
  design = plan_lib.load_study("paradigm").designs["fair"]
  big = [0.10, 0.12, 0.11, 0.13, 0.09, 0.10, 0.12, 0.11]  # +11.0 ± 0.5 points: far from zero
  flat = [0.001, -0.002, 0.0, 0.002, -0.001, 0.001, 0.0, -0.001]  # +0.0 ± 0.0: inside ±3 points
  cells = []
  for c in design.claims:
    values = flat if c.run == "fair_grpo_ps - fair_grpo" else big
    mean, se = aggregate.mean_se(values)
    cells.append({"run": c.run, "metric": c.metric, "step": None, "percent": True, "n": 8, "seeds": list(range(8)),
                  "values": values, "mean": mean, "se": se})
  page = tmp_path / "paradigm" / "fair"
  page.mkdir(parents=True)
  (page / "results.json").write_text(json.dumps({"profile": "fair", "rule": "t-holm", "cells": cells}))
  (page / "results.md").write_text("# t\n\nintro\n\n**held-out** by step\n\n| a |\n")
  assert pages.redecide_pages(tmp_path) == [page]
  words = [v["verdict"] for v in json.loads((page / "results.json").read_text())["verdicts"]]
  assert words == [verdicts.EQUAL] + ["reproduced"] * 4 + ["reported"] * 3
  text = (page / "results.md").read_text()
  assert "decided by the design's rule: Student-t p-values" in text
  assert ("| Fig 5: GRPO+OS > Online RFT | fair_grpo - fair_online_rft, final | 11.0 ± 0.5 (8) | **reproduced** ("
          in text)
  assert pages.redecide_pages(tmp_path) == []  # nothing stale now


def test_committed_pages_carry_todays_verdicts():
  """Each committed page's verdicts are its cells decided by today's claims and rules (`reproduce --redecide`)."""
  for name, study in studies.STUDIES.items():
    for page_dir in pages.page_dirs(pages.PAGES, name, study):
      if (page_dir / "results.json").is_file():
        page = json.loads((page_dir / "results.json").read_text())
        today = json.loads(json.dumps(aggregate.decide_claims(study, page["cells"], page.get("profile")),
                                      default=str))
        assert page.get("verdicts", []) == today, f"{page_dir}: stale verdicts; run `reproduce --redecide`"
        for v in today:
          assert f"| **{v['verdict']}** ({v['detail']}) |" in (page_dir / "results.md").read_text(), page_dir


def test_a_page_cut_short_is_named_and_nothing_is_rewritten(tmp_path, monkeypatch, main_in_process):
  """Issue 55: `--redecide` and `--claims_table` over a results.json cut short ended in a JSONDecodeError traceback.
  Now one line names the page, and `--redecide` rewrites no page (the stale one beside it included)."""
  src = pages.PAGES / "paradigm" / "full"
  (tmp_path / "paradigm" / "full").mkdir(parents=True)
  page = json.loads((src / "results.json").read_text())
  stale = [dict(v, verdict="reproduced", detail="a stale verdict") for v in page["verdicts"]]
  (tmp_path / "paradigm" / "full" / "results.json").write_text(json.dumps({**page, "verdicts": stale}))
  (tmp_path / "paradigm" / "full" / "results.md").write_text((src / "results.md").read_text())
  cut = tmp_path / "paradigm" / "results.json"
  text = (pages.PAGES / "paradigm" / "results.json").read_text()
  for damaged, message in ((text[:len(text) // 2], "cannot read a study's results page"),
                           ("[1, 2]", "not a study's results page"),
                           ('{"runs": {}}', "not a study's results page (needs cells)")):
    cut.write_text(damaged)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(plan_lib.StudyError, match=rf"^{re.escape(str(cut))}: {re.escape(message)}"):
      pages.redecide_pages(tmp_path)
    with pytest.raises(plan_lib.StudyError, match=rf"^{re.escape(str(cut))}: "):
      pages.claims_table(tmp_path)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
  # the command line: one line, exit status 1
  redecide = pages.redecide_pages
  monkeypatch.setattr(pages, "redecide_pages", lambda: redecide(tmp_path))
  error = main_in_process(reproduce_main.main, ["reproduce", "--redecide"])
  assert error.startswith(f"reproduce: error: {cut}: ") and "\n" not in error, error


def test_a_design_page_names_the_runs_every_seed_shares(tmp_path):
  """A shared run (one process, seed 0's) narrows what the verdicts hold for: the Design section says which."""
  study = fakes.study()
  base = dataclasses.replace(study.runs[0], shared=True)
  designed = spec.Study("tiny", "Two tiny runs", (base, study.runs[1]), study.metrics, (),
                        designs={"full": spec.Design((spec.Claim("better rises", "better", "gain"),), seeds=8)})
  results = pipeline.reproduce(designed, profile="full", seeds=list(range(8)), out_dir=tmp_path / "out",
                               runs_dir=tmp_path / "runs", echo=lambda line: None, commit="c" * 40)
  assert results["design"]["shared"] == ["base"]
  assert [v["verdict"] for v in results["verdicts"]] == ["reproduced"]  # +0.21 on every seed, from seed 0's base
  text = (tmp_path / "out" / "results.md").read_text()
  assert "Shared by every seed (one process, seed 0's): `base`; the seeds vary what follows it" in text
  # the fake runner's summaries do not name their code: the page reads the commit reproduce ran them from
  assert {v for r in results["runs"].values() for v in r["code_versions"].values()} == {"c" * 40}
  assert "Code versions of the runs aggregated (1): `cccccccccccc`." in text
  plain = dataclasses.replace(designed, runs=study.runs[:2], name="plain")
  results = pipeline.reproduce(plain, profile="full", seeds=list(range(8)), out_dir=tmp_path / "plain",
                               runs_dir=tmp_path / "runs", echo=lambda line: None, commit="c" * 40)
  assert results["design"]["shared"] == [] and "Shared by every seed" not in (tmp_path / "plain" /
                                                                             "results.md").read_text()


def test_redraw_drops_another_profiles_figure_and_keeps_the_rest(tmp_path, main_in_process, monkeypatch):
  """`--redraw`: the fair flow_grpo page was written by code that drew the full profile's figure too, empty ("no
  finished runs"); redrawn, that file and its link go, its own figure stays as it ran, and every other line of
  results.md stays; a page without links gets them before its runs; a figure it lacks is drawn from its cells; a
  second pass changes nothing."""
  src = pages.PAGES / "flow_grpo" / "fair"
  page = tmp_path / "flow_grpo" / "fair"
  page.mkdir(parents=True)
  results = json.loads((src / "results.json").read_text())
  md = (src / "results.md").read_text()
  md = md if "![agentflow](agentflow.png)" in md else md.replace(  # as committed before it was redrawn
      "![agentflow_fair](agentflow_fair.png)", "![agentflow](agentflow.png)\n\n![agentflow_fair](agentflow_fair.png)")
  (page / "results.json").write_text(json.dumps({**results, "plots": ["agentflow.png", "agentflow_fair.png"]}))
  (page / "results.md").write_text(md)
  (page / "agentflow.png").write_bytes(b"an empty figure")
  (page / "agentflow_fair.png").write_bytes(b"an old figure")
  redraw = pages.redraw_pages
  monkeypatch.setattr(pages, "redraw_pages", lambda: redraw(tmp_path))
  assert main_in_process(reproduce_main.main, ["reproduce", "--redraw"]) is None
  assert sorted(p.name for p in page.iterdir()) == ["agentflow_fair.png", "results.json", "results.md"]
  assert (page / "agentflow_fair.png").read_bytes() == b"an old figure"  # its own figure stays as it ran
  assert json.loads((page / "results.json").read_text())["plots"] == ["agentflow_fair.png"]
  assert (page / "results.md").read_text() == md.replace("![agentflow](agentflow.png)\n\n", "")
  assert redraw(tmp_path) == []
  # a page from before figures were linked: its figure goes before "## Runs"
  (page / "results.md").write_text(md.replace("![agentflow](agentflow.png)\n\n", "").replace(
      "![agentflow_fair](agentflow_fair.png)\n\n", ""))
  assert redraw(tmp_path) == [page]
  assert (page / "results.md").read_text() == md.replace("![agentflow](agentflow.png)\n\n", "")
  # a figure of its profile that the page lacks is drawn from its cells
  (page / "agentflow_fair.png").unlink()
  assert redraw(tmp_path) == [page]
  assert (page / "agentflow_fair.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert redraw(tmp_path) == []
  # a page it cannot read (the hard profile's, after this one) stops it with one line before any page is written
  (page / "results.md").write_text(md)
  (tmp_path / "flow_grpo" / "hard").mkdir()
  cut = tmp_path / "flow_grpo" / "hard" / "results.json"
  cut.write_text((src / "results.json").read_text()[:100])
  before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
  with pytest.raises(plan_lib.StudyError, match=rf"^{re.escape(str(cut))}: cannot read a study's results page"):
    redraw(tmp_path)
  assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_committed_pages_link_their_profiles_figures():
  """Each committed page links, lists and holds the figures its profile draws today (`reproduce --redraw`), and no
  other profile's."""
  for name, study in studies.STUDIES.items():
    for page_dir in pages.page_dirs(pages.PAGES, name, study):
      if (page_dir / "results.json").is_file():
        page = json.loads((page_dir / "results.json").read_text())
        expected = [p.file for p in plots.figures(study, page.get("profile", ""))]
        linked = [m.group(1) for line in (page_dir / "results.md").read_text().split("\n")
                  if (m := pages.FIGURE_LINK.fullmatch(line))]
        assert linked == page["plots"] == expected, f"{page_dir}: run `reproduce --redraw`"
        assert sorted(p.name for p in page_dir.glob("*.png")) == sorted(expected), page_dir
