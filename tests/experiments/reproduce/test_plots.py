"""experiments.reproduce.plots: a profile's page draws only its own figures, and long titles and labels wrap
instead of running into the next panel."""

import dataclasses

import matplotlib
import pytest

from experiments.reproduce import plots
from experiments.studies import spec
from tests import reproduce_fakes as fakes

matplotlib.use("Agg")

LONG = "reward model AUC within problems on fresh samples of the current policy, before each round"


def _cells() -> list[dict]:
  """Two runs' accuracy at steps 0 and 10 over two seeds (base 10% -> 20%, other 30% -> 40%)."""
  cells = []
  for run, start in (("base", 0.1), ("other", 0.3)):
    for step, mean in ((0, start), (10, start + 0.1)):
      cells.append({"run": run, "metric": "accuracy", "step": step, "k": None, "n": 2, "mean": mean, "se": 0.01,
                    "percent": True, "label": "held-out accuracy"})
  return cells


def _study() -> spec.Study:
  """`base` in every profile, `other` only in profile "b"; one figure of each, and one with a long title."""
  study = fakes.study()
  other = dataclasses.replace(study.runs[0], name="other", label="other", only_in=("b",))
  figures = (spec.Plot("base.png", (spec.Panel("accuracy", ("base",)),)),
             spec.Plot("other.png", (spec.Panel("accuracy", ("other",)),)),
             spec.Plot("long.png", (spec.Panel("accuracy", ("base",), title=LONG),
                                    spec.Panel("accuracy", ("base", "other"), title=LONG, ylabel=LONG))))
  return dataclasses.replace(study, runs=(study.runs[0], other), plots=figures, claims=())


def _saved(monkeypatch) -> dict:
  from matplotlib import figure
  saved, real = {}, figure.Figure.savefig

  def savefig(self, path, *args, **kwargs):
    saved[path.name] = self
    return real(self, path, *args, **kwargs)

  monkeypatch.setattr(figure.Figure, "savefig", savefig)
  return saved


@pytest.mark.parametrize("profile, expected", [("a", ["base.png", "long.png"]),
                                               ("b", ["base.png", "other.png", "long.png"]),
                                               ("", ["base.png", "other.png", "long.png"])])
def test_a_profile_draws_the_figures_of_its_runs(tmp_path, monkeypatch, profile, expected):
  saved = _saved(monkeypatch)
  written = plots.draw(_study(), _cells(), tmp_path, profile)
  assert [p.name for p in written] == expected == list(saved)
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(expected)
  # the long figure's right panel draws both runs' means in percent, whatever the profile
  lines = {line.get_label(): list(line.get_ydata()) for line in saved["long.png"].axes[1].get_lines()}
  assert lines == {"base method (n=2)": pytest.approx([10.0, 20.0]), "other (n=2)": pytest.approx([30.0, 40.0])}


def test_long_titles_and_labels_wrap_inside_their_panel(tmp_path, monkeypatch):
  saved = _saved(monkeypatch)
  plots.draw(_study(), _cells(), tmp_path)
  fig = saved["long.png"]
  left, right = fig.axes
  assert all(len(line) <= plots.TITLE_CHARS for line in left.get_title().split("\n"))
  assert len(right.get_ylabel().split("\n")) == 3 and all(len(line) <= plots.YLABEL_CHARS
                                                          for line in right.get_ylabel().split("\n"))
  from matplotlib.backends import backend_agg
  renderer = backend_agg.FigureCanvasAgg(fig).get_renderer()  # the closed figure, laid out as it was saved
  # nothing of the right panel's y label or title lies on the left panel, nor the left title on the right's
  left_box = left.get_window_extent(renderer)
  assert not right.yaxis.label.get_window_extent(renderer).overlaps(left_box)
  assert not right.title.get_window_extent(renderer).overlaps(left_box)
  assert not left.title.get_window_extent(renderer).overlaps(right.title.get_window_extent(renderer))
  whole = fig.get_window_extent(renderer)
  for text in (left.title, right.title, right.yaxis.label):  # and each lies inside the figure
    box = text.get_window_extent(renderer)
    assert whole.contains(*box.p0) and whole.contains(*box.p1), text.get_text()
