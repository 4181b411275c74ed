"""experiments.reproduce.pipeline: a study of three tiny runs end to end: cells, pages, plots, skip on rerun,
another seed, another profile."""

import json
import pathlib

import numpy as np
import pytest

from experiments.reproduce import pipeline
from experiments.reproduce import plan as plan_lib
from experiments.studies import spec
from tests import reproduce_fakes as fakes


def _recorded_figures(monkeypatch) -> dict:
  """Every figure `plots.draw` saves, by file name (its axes keep the drawn data after it is closed)."""
  from matplotlib import figure
  figures, real = {}, figure.Figure.savefig

  def savefig(self, path, *args, **kwargs):
    figures[pathlib.Path(path).name] = self
    return real(self, path, *args, **kwargs)

  monkeypatch.setattr(figure.Figure, "savefig", savefig)
  return figures


def test_study_end_to_end_skip_on_rerun_and_failures(tmp_path, monkeypatch):
  out, runs_dir = tmp_path / "out", tmp_path / "runs"
  lines = []
  figures = _recorded_figures(monkeypatch)
  results = pipeline.reproduce(fakes.study(), profile="full", seeds=[0, 1], out_dir=out, runs_dir=runs_dir,
                                echo=lines.append)
  assert results["invocation"]["ran"] == 6 and not results["failures"]
  cells = fakes.cells(results)
  assert cells[("base", "accuracy", 10)]["values"] == pytest.approx([0.11, 0.21])  # the step's last record
  assert cells[("base", "accuracy", 10)]["se"] == pytest.approx(0.05)
  # "better" starts where "base" ended, seed by seed; "after" where "better" ended
  assert cells[("better", "final", None)]["values"] == pytest.approx([0.32, 0.42])
  assert cells[("after", "gain", None)]["values"] == pytest.approx([0.01, 0.01])
  assert cells[("base", "maj@2", None)]["k"] == 2 and ("better", "maj@2", None) not in cells
  for name in ("results.json", "results.md", "curve.png", "k.png", "bars.png"):
    assert (out / name).is_file() and (out / name).stat().st_size > 0
  assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  # The plots draw the cells' means, in percent: each run's curve over steps 0, 5, 10, base's maj@k over k = 1, 2,
  # and bars of final then gain for base, better, after.
  pct = lambda key: 100 * cells[key]["mean"]  # noqa: E731
  curve = {line.get_label(): line for line in figures["curve.png"].axes[0].get_lines()}
  assert sorted(curve) == ["after (n=2)", "base method (n=2)", "better (n=2)"]
  for run, label in (("base", "base method"), ("better", "better"), ("after", "after")):
    np.testing.assert_allclose(curve[f"{label} (n=2)"].get_xdata(), [0, 5, 10])
    np.testing.assert_allclose(curve[f"{label} (n=2)"].get_ydata(), [pct((run, "accuracy", s)) for s in (0, 5, 10)])
  assert pct(("base", "accuracy", 10)) == pytest.approx(16.0)  # (0.11 + 0.21) / 2
  k_lines = figures["k.png"].axes[0].get_lines()
  assert len(k_lines) == 1 and list(k_lines[0].get_xdata()) == [1, 2]
  np.testing.assert_allclose(k_lines[0].get_ydata(), [pct(("base", "maj@1", None)), pct(("base", "maj@2", None))])
  heights = [bar.get_height() for bar in figures["bars.png"].axes[0].patches]
  runs = ("base", "better", "after")
  np.testing.assert_allclose(heights, [pct((r, m, None)) for m in ("final", "gain") for r in runs])
  on_disk = json.loads((out / "results.json").read_text())
  assert on_disk["cells"] == json.loads(json.dumps(results["cells"]))
  assert {"study", "run", "metric", "step", "seeds", "values", "mean", "se"} <= set(on_disk["cells"][0])
  text = (out / "results.md").read_text()
  assert "base method" in text and "![curve](curve.png)" in text and "| step 0 | step 5 | step 10 |" in text
  # better gains 0.21 on both seeds (from base's 0.11 and 0.21 to 0.32 and 0.42)
  assert ("| better gains | better, gain | 21.0 ± 0.0 (2) | **undecided** (every seed alike on 2 seeds: 3 or more "
          "decide; 2 s.e. interval [+21.0, +21.0]) |") in text
  assert (out / "runs" / "better" / "seed1" / "summary.json").is_file()

  # Rerun: every summary exists, nothing runs; a third seed runs only seed 2.
  invocations = lambda: sorted(p.read_text().split() for p in runs_dir.glob("*/invocations.txt"))
  before = invocations()
  results = pipeline.reproduce(fakes.study(), profile="full", seeds=[0, 1], out_dir=out, runs_dir=runs_dir,
                                echo=lines.append)
  assert results["invocation"]["ran"] == 0 and results["invocation"]["cached"] == 6
  assert invocations() == before
  results = pipeline.reproduce(fakes.study(), profile="full", seeds=[0, 1, 2], out_dir=out, runs_dir=runs_dir,
                                echo=lines.append)
  assert results["invocation"]["ran"] == 3 and fakes.cells(results)[("base", "final", None)]["n"] == 3

  # Another profile adds flags, so other directories: nothing is reused by mistake.
  quick = plan_lib.plan(fakes.study(), "quick", [0], runs_dir)
  assert "--shorter" in quick[0].argv and quick[0].argv[-2:] == ["--seed=0", f"--work_dir={quick[0].directory}"]
  assert not any(j.summary.is_file() for j in quick)


def test_a_shared_run_runs_once_and_every_seed_starts_from_it(tmp_path):
  fake = fakes.study().runs[0].command
  runs = (spec.Run("start", {"level": 0.01}, command=fake, shared=True),
          spec.Run("rl", {"level": 0.02, "start_from": "{run:start}"}, command=fake))
  study = spec.Study("s", "x", runs, (spec.Metric("start", "start_accuracy"), spec.Metric("final", "final_accuracy")))
  results = pipeline.reproduce(study, profile="full", seeds=[0, 1, 2], out_dir=tmp_path / "out",
                               runs_dir=tmp_path / "runs", parallel=2, echo=lambda line: None)
  cells = fakes.cells(results)
  assert cells[("start", "final", None)]["n"] == 1  # one process
  start = cells[("start", "final", None)]["values"][0]
  assert start == pytest.approx(0.0 + 0.01 * 10 + 0.01)  # seed 0's: the fake runner starts at 0.1 x seed
  assert cells[("rl", "start", None)]["n"] == 3
  assert cells[("rl", "start", None)]["values"] == pytest.approx([start] * 3)  # every seed from seed 0's start
  invocations = [p.read_text().split() for p in (tmp_path / "runs").glob("*/invocations.txt")]
  assert sorted(len(i) for i in invocations) == [1, 3]
