"""experiments.reproduce.tune: a tuned flag chosen on the validation split of the tuning seeds, end to end."""

import dataclasses
import json
import sys

import pytest

from experiments.reproduce import pipeline
from experiments.reproduce import plan as plan_lib
from experiments.studies import spec
from tests import reproduce_fakes as fakes


def test_a_tuned_flag_is_chosen_on_the_validation_split_of_the_tuning_seeds(tmp_path):
  """base's --level over the grid 0.01, 0.02, 0.03 on tuning seeds 0 and 1, each with --num_validation: the fake's
  validation accuracy peaks at 0.02 (0.4, 0.5, 0.4 plus 0.001 x seed), so 0.02 is base's level on seeds 2 and 3
  (which wait for the whole grid), and the grid's 0.02 runs are base's on seeds 0 and 1; better, which starts
  from base, runs from those."""
  fake = (sys.executable, "-c", fakes.FAKE_RUNNER)
  runs = (spec.Run("base", {"num_validation": 5}, command=fake, tune=spec.Tune((0.01, 0.02, 0.03), flag="level")),
          spec.Run("better", {"level": 0.02, "start_from": "{run:base}"}, command=fake))
  study = spec.Study("tuned", "A tuned run", runs, (spec.Metric("final", "final_accuracy"),),
                     contrasts=(spec.Contrast("better", "base", "final"),))
  out, runs_dir, lines = tmp_path / "out", tmp_path / "runs", []
  jobs = plan_lib.plan(study, "full", [0, 1, 2, 3], runs_dir)
  assert sorted(j.run.name for j in jobs if j.grid) == sorted(["base@0.01", "base@0.02", "base@0.03"] * 2)
  main = {j.seed: j for j in jobs if j.run.name == "base"}
  assert main[0].alias and main[1].alias and not main[2].alias and "--level={tuned}" in main[2].argv
  assert sorted(main[3].after) == sorted((f"base@{v}", s) for v in ("0.01", "0.02", "0.03") for s in (0, 1))
  results = pipeline.reproduce(study, profile="full", seeds=[0, 1, 2, 3], out_dir=out, runs_dir=runs_dir,
                                echo=lines.append)
  assert results["invocation"]["ran"] == 6 + 2 + 4 and not results["failures"]  # grid, base 2-3, better 0-3
  t = results["tuning"]["base"]
  assert t["chosen"] == 0.02 and [g["n"] for g in t["grid"]] == [2, 2, 2]
  assert [g["mean"] for g in t["grid"]] == pytest.approx([0.4005, 0.5005, 0.4005])  # 50.05 prints as 50.0
  argv = json.loads(next(j for j in jobs if j.key == ("base", 3)).record.read_text())["argv"]
  assert "--level=0.02" in argv
  cells = fakes.cells(results)
  # base at 0.02 on every seed: 0.1 x seed + 0.2 + 0.01; seeds 0, 1 from the grid's runs, 2, 3 from its own
  assert cells[("base", "final", None)]["values"] == pytest.approx([0.21, 0.31, 0.41, 0.51])
  assert cells[("better - base", "final", None)]["values"] == pytest.approx([0.21] * 4)
  grid_dir = next(j for j in jobs if j.key == ("base@0.02", 0)).directory
  for again in (False, True):  # as run, and aggregated again by a later invocation that runs nothing
    if again:
      (out / "runs" / "base" / "seed0").unlink()
      results = pipeline.reproduce(study, profile="full", seeds=[0, 1, 2, 3], out_dir=out, runs_dir=runs_dir,
                                    echo=lines.append, aggregate_only=True)
    assert (out / "runs" / "base" / "seed0").resolve() == grid_dir  # the tuning seed's run: the grid's at 0.02
    assert "--level=0.02" in results["runs"]["base"]["command_seed0"], results["runs"]["base"]["command_seed0"]
  text = (out / "results.md").read_text()
  assert "| base | --level | 0.01: 40.1 ± 0.1 (2); 0.02: 50.0 ± 0.1 (2); 0.03: 40.1 ± 0.1 (2) | **0.02** |" in text
  # no validation split: refused in one line
  bad = spec.Study("t", "t", (spec.Run("base", {}, command=fake, tune=spec.Tune((1, 2), flag="level")),),
                   (spec.Metric("final", "final_accuracy"),))
  bad = dataclasses.replace(bad, runs=(dataclasses.replace(bad.runs[0], command=()),))
  with pytest.raises(plan_lib.StudyError, match="needs --num_validation"):
    plan_lib.plan(bad, "full", [0], runs_dir)
