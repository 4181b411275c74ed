"""experiments.reproduce.design: a design's runs come from one commit, its verdicts from its rule, and its
declaration from git."""

import json
import pathlib
import subprocess

import pytest

from experiments.reproduce import design as design_lib
from experiments.reproduce import pipeline
from experiments.reproduce import plan as plan_lib
from experiments.studies import spec
from tests import reproduce_fakes as fakes

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _designed_study() -> spec.Study:
  """The fake runner's base and better under a design: better - base = level 0.02 vs 0.01 over 10 steps plus the
  start (better starts where base ended): +0.21 points on every seed."""
  study = fakes.study()
  claims = (spec.Claim("better beats base", "better - base", "final", margin=0.03),
            spec.Claim("base rises", "base", "gain"))
  return spec.Study("tiny", "Two tiny runs", study.runs[:2], study.metrics, (), profiles=study.profiles,
                    contrasts=(spec.Contrast("better", "base", "final"),), claims=study.claims,
                    designs={"quick": spec.Design(claims, seeds=8, note="a test")})


def test_a_design_runs_from_one_commit_and_is_decided_by_its_rule(tmp_path, monkeypatch):
  out, runs_dir = tmp_path / "out", tmp_path / "runs"
  study = _designed_study()
  lines = []
  results = pipeline.reproduce(study, profile="quick", seeds=list(range(6)), out_dir=out, runs_dir=runs_dir,
                                echo=lines.append, commit="a" * 40)
  # 6 of the 8 declared seeds: no verdict yet, on any claim
  assert [v["verdict"] for v in results["verdicts"]] == ["pending", "pending"]
  assert results["rule"] == "t-holm" and results["commit"] == "a" * 40
  assert results["design"]["seeds"] == 8 and results["design"]["claims"][0]["margin"] == 0.03
  records = [json.loads(p.read_text()) for p in runs_dir.glob("*/seed0.run.json")]
  assert len(records) == 2 and {r["commit"] for r in records} == {"a" * 40}
  # the commit is in the runs' hash: the full profile's runs (no design) are other directories
  assert {j.directory for j in plan_lib.plan(study, "quick", [0], runs_dir, "a" * 40)}.isdisjoint(
      {j.directory for j in plan_lib.plan(study, "quick", [0], runs_dir)})
  # 10 seeds: the verdicts read seeds 0-7 only (better - base = +0.21 and base gains +0.11 on every seed)
  results = pipeline.reproduce(study, profile="quick", seeds=list(range(10)), out_dir=out, runs_dir=runs_dir,
                                echo=lines.append, commit="a" * 40)
  v = {x["claim"]: x for x in results["verdicts"]}
  assert v["better beats base"]["n"] == 8 and v["better beats base"]["verdict"] == "reproduced"
  assert v["base rises"]["verdict"] == "reproduced"
  text = (out / "results.md").read_text()
  assert "## Design" in text and "Every run on this page comes from commit `aaaaaaaaaaaa`" in text
  assert "| better beats base | better - base, final | above zero | ±3.0 points |" in text
  assert "decided by the design's rule: Student-t p-values" in text

  # a run that reports another commit (its code changed under it): the table is refused, in one line
  job = next(j for j in plan_lib.plan(study, "quick", [3], runs_dir, "a" * 40) if j.run.name == "better")
  summary = json.loads(job.summary.read_text())
  job.summary.write_text(json.dumps({**summary, "code_version": "a" * 40 + "-dirty"}))
  with pytest.raises(plan_lib.StudyError, match=r"from one commit, aaaaaaaaaaaa, and these are not from it: "
                                                 r"aaaaaaaaaaaa-dirty: 1 run \(better seed 3\)"):
    pipeline.reproduce(study, profile="quick", seeds=list(range(8)), out_dir=out, runs_dir=runs_dir,
                        echo=lines.append, commit="a" * 40, aggregate_only=True)

  # HEAD with uncommitted changes: a design does not start
  monkeypatch.setattr(design_lib, "head_commit", lambda root=None: "b" * 40 + "-dirty")
  with pytest.raises(plan_lib.StudyError, match="changed since its last commit; commit, or run from a worktree "
                                                 "pinned to a commit"):
    pipeline.reproduce(study, profile="quick", seeds=[0], out_dir=out, runs_dir=runs_dir, echo=lines.append)


def test_declaration_names_the_commit_that_last_changed_the_spec():
  study = plan_lib.load_study("paradigm")
  files = design_lib.spec_files(study)
  assert files == ["experiments/studies/paradigm.py", "experiments/studies/common.py",
                   "experiments/studies/verdicts.py"]  # paradigm reads common's margins, task and shared start
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
  expected = subprocess.run(["git", "log", "-1", "--format=%H", head, "--", *files], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
  declared = design_lib.declaration(study, head)
  assert declared["commit"] == expected and len(expected) == 40 and declared["date"].startswith("20")
