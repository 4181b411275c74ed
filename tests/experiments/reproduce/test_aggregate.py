"""experiments.reproduce.aggregate: cells from hand-made summaries and curves (mean ± s.e. worked out by hand),
paired contrasts, and the claims decided from their cells."""

import json
import math
import re

import pytest

from experiments.reproduce import aggregate
from experiments.reproduce import pages
from experiments.reproduce import plan as plan_lib
from experiments.studies import spec


def test_mean_se_by_hand():
  mean, se = aggregate.mean_se([0.40, 0.46, 0.43])
  assert mean == pytest.approx(0.43)
  # deviations -0.03, 0.03, 0: sample variance 0.0018 / 2 = 0.0009; s.e. = sqrt(0.0009 / 3)
  assert se == pytest.approx(math.sqrt(0.0009 / 3))
  assert aggregate.mean_se([0.5]) == (0.5, None)
  with pytest.raises(ValueError):
    aggregate.mean_se([])


def test_aggregation_of_hand_made_summaries(tmp_path):
  study = spec.Study("hand", "Hand-made", (spec.Run("grpo"), spec.Run("rft", {"algo": "rft"})),
                     (spec.Metric("final", "final_accuracy"),
                      spec.Metric("gain", "final_accuracy", minus="start_accuracy"),
                      spec.Metric("acc", "eval/accuracy", source="curve", runs=("grpo",))))
  jobs = plan_lib.plan(study, "full", [0, 1, 2, 3], tmp_path)
  finals = {"grpo": [0.40, 0.46, 0.43, None], "rft": [0.30, 0.34, 0.32, 0.36]}
  for job in jobs:
    final = finals[job.run.name][job.seed]
    if final is None:
      continue  # seed 3 of grpo did not finish: its cells have three seeds
    job.directory.mkdir(parents=True)
    job.summary.write_text(json.dumps({"final_accuracy": final, "start_accuracy": 0.30}))
    (job.directory / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"step": s, "eval/accuracy": v}) for s, v in
                  [(0, 0.30), (100, 0.1), (100, final - 0.05), (200, final)]) + "\n{\"step\": 2")
  cells = {(c["run"], c["metric"], c["step"]): c for c in aggregate.collect(study, jobs)}
  grpo = cells[("grpo", "final", None)]
  assert grpo["seeds"] == [0, 1, 2] and grpo["n"] == 3
  assert grpo["values"] == [0.40, 0.46, 0.43]
  assert grpo["mean"] == pytest.approx(0.43) and grpo["se"] == pytest.approx(math.sqrt(0.0009 / 3))
  rft = cells[("rft", "final", None)]
  assert rft["mean"] == pytest.approx(0.33)
  # (0.03^2 + 0.01^2 + 0.01^2 + 0.03^2) / 3 = 0.002 / 3; s.e. = sqrt(that / 4)
  assert rft["se"] == pytest.approx(math.sqrt(0.002 / 3 / 4))
  assert cells[("rft", "gain", None)]["values"] == pytest.approx([0.0, 0.04, 0.02, 0.06])
  # the curve: every logged step, the last record of a step that was logged twice (a resumed run)
  assert cells[("grpo", "acc", 100)]["values"] == pytest.approx([0.35, 0.41, 0.38])
  assert cells[("grpo", "acc", 0)]["se"] == pytest.approx(0.0)
  assert ("rft", "acc", 100) not in cells
  table = "\n".join(pages.tables(study, list(cells.values())))
  assert "| grpo | 43.0 ± 1.7 (3) |" in table


def test_contrasts_and_changes_are_paired_by_seed(tmp_path):
  """A contrast is a − b seed by seed on the seeds both have; since_start subtracts each seed's first step."""
  study = spec.Study("pairs", "Paired", (spec.Run("a", {"x": 1}), spec.Run("b", {"x": 2})),
                     (spec.Metric("final", "final_accuracy"),
                      spec.Metric("change", "eval/accuracy", source="curve", since_start=True)),
                     contrasts=(spec.Contrast("a", "b", "final"),))
  jobs = plan_lib.plan(study, "full", [0, 1, 2], tmp_path)
  finals = {"a": [0.50, 0.80, 0.61], "b": [0.40, 0.75, None]}  # b's seed 2 is missing
  for job in jobs:
    final = finals[job.run.name][job.seed]
    if final is None:
      continue
    job.directory.mkdir(parents=True)
    job.summary.write_text(json.dumps({"final_accuracy": final}))
    (job.directory / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "eval/accuracy": final - 0.1}) + "\n" + json.dumps({"step": 5, "eval/accuracy": final}))
  cells = {(c["run"], c["metric"], c["step"]): c for c in aggregate.collect(study, jobs)}
  diff = cells[("a - b", "final", None)]
  assert diff["seeds"] == [0, 1] and diff["values"] == pytest.approx([0.10, 0.05]) and diff["contrast"]
  assert diff["mean"] == pytest.approx(0.075) and diff["se"] == pytest.approx(0.025)
  assert cells[("a", "change", 5)]["values"] == pytest.approx([0.1, 0.1, 0.1])
  assert cells[("a", "change", 0)]["values"] == [0.0, 0.0, 0.0]
  assert "| a - b | final | end | 7.5 ± 2.5 (2) |" in "\n".join(pages.tables(study, list(cells.values())))


def test_claims_are_decided_from_their_cells(tmp_path):
  """a - b = 10, 5 and 9 points over 3 seeds, +8.0 ± 1.5: 5.2 s.e. above zero (a claimed rise: reproduced; a
  claimed non-change: contradicted); a's change at its last step is +10 ± 0 (every seed alike); a claim on a run
  nobody ran: not run."""
  claims = (spec.Claim("a beats b", "a - b", "final"), spec.Claim("a equals b", "a - b", "final", "="),
            spec.Claim("a rises", "a", "change"), spec.Claim("b falls", "b", "change", "<"))
  study = spec.Study("pairs", "Paired", (spec.Run("a", {"x": 1}), spec.Run("b", {"x": 2})),
                     (spec.Metric("final", "final_accuracy"),
                      spec.Metric("change", "eval/accuracy", source="curve", since_start=True)),
                     contrasts=(spec.Contrast("a", "b", "final"),), claims=claims)
  jobs = plan_lib.plan(study, "full", [0, 1, 2], tmp_path)
  for job in jobs:
    if job.run.name == "a":
      final = [0.50, 0.80, 0.61][job.seed]
      job.directory.mkdir(parents=True)
      job.summary.write_text(json.dumps({"final_accuracy": final}))
      (job.directory / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/accuracy": final - 0.1}) + "\n"
                                                   + json.dumps({"step": 5, "eval/accuracy": final}))
  for job in jobs:  # b: finals only
    if job.run.name == "b":
      job.directory.mkdir(parents=True)
      job.summary.write_text(json.dumps({"final_accuracy": [0.40, 0.75, 0.52][job.seed]}))
  out = aggregate.decide_claims(study, aggregate.collect(study, jobs))
  assert [(v["verdict"], v.get("cell")) for v in out] == [
      ("reproduced", "8.0 ± 1.5 (3)"), ("contradicted", "8.0 ± 1.5 (3)"), ("reproduced", "10.0 ± 0.0 (3)"),
      ("not run", None)]
  assert out[0]["detail"] == "5.2 s.e.; 2 s.e. interval [+4.9, +11.1]" and out[2]["step"] == 5
  with pytest.raises(ValueError, match="claim 'x'"):
    spec.Study("s", "x", (spec.Run("a", {}),), (spec.Metric("final", "final_accuracy"),),
               claims=(spec.Claim("x", "a - b", "final"),))


def test_a_runs_summary_cut_short_is_named(tmp_path):
  """A run's summary.json cut short: aggregation stops with one line naming it (was: the JSON error alone)."""
  study = spec.Study("hand", "Hand-made", (spec.Run("grpo"),), (spec.Metric("final", "final_accuracy"),))
  (job,) = plan_lib.plan(study, "full", [0], tmp_path)
  job.directory.mkdir(parents=True)
  job.summary.write_text('{"final_accuracy": 0.4, "start_')
  with pytest.raises(plan_lib.StudyError, match=rf"^{re.escape(str(job.summary))}: cannot read a run's summary"):
    aggregate.collect(study, [job])
