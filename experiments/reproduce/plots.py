"""A study's plots: each run's mean ± standard error over seeds, by step, by K or as bars (matplotlib, Agg)."""

import pathlib
import textwrap

from experiments.studies import spec

TITLE_CHARS = 55  # a panel's title wraps at this many characters (a panel is 5.2 inches wide, 10 pt)
YLABEL_CHARS = 42  # its y label at this many (the axes are about 3 inches high)


def draw(study: spec.Study, cells: list[dict], out_dir: pathlib.Path, profile: str = "") -> list[pathlib.Path]:
  """The study's plots as PNGs; a panel with nothing to draw says so. With `profile`, a plot whose panels all
  name only runs outside that profile (another profile's figure) is not drawn."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  by_metric: dict[str, list[dict]] = {}
  for c in cells:
    by_metric.setdefault(c["metric"], []).append(c)
  written = []
  for plot in figures(study, profile):
    fig, axes = plt.subplots(1, len(plot.panels), figsize=(5.2 * len(plot.panels), 4.0), squeeze=False)
    for ax, panel in zip(axes[0], plot.panels):
      runs = [study.run(n) for n in panel.runs] if panel.runs else list(study.runs)
      if plot.x == "run":
        percent, drawn, label = _bars(ax, panel, runs, by_metric)
      else:
        percent, drawn, label = _curves(ax, study, plot, panel, runs, cells, by_metric)
      if not drawn:
        ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)
      ax.set_title(textwrap.fill(panel.title or (panel.metric if isinstance(panel.metric, str) else ""),
                                 TITLE_CHARS), fontsize=10)
      ax.set_xlabel(plot.xlabel or {"step": "training step", "k": "K", "run": ""}[plot.x])
      label = label.replace("{k}", "K")
      ax.set_ylabel(textwrap.fill(panel.ylabel or (f"{label} (%)" if percent else label), YLABEL_CHARS))
      ax.grid(alpha=0.3)
    title = plot.title or study.title
    fig.suptitle(f"{title}\nmean ± standard error over seeds", fontsize=10)
    fig.tight_layout()
    path = out_dir / plot.file
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
  return written


def figures(study: spec.Study, profile: str = "") -> list[spec.Plot]:
  """The study's plots that a profile's page draws: all but those whose panels all name only runs outside it."""
  in_profile = {r.name for r in study.runs_in(profile)} if profile else {r.name for r in study.runs}
  return [plot for plot in study.plots
          if not all(panel.runs and not in_profile.intersection(panel.runs) for panel in plot.panels)]


def _bars(ax, panel: spec.Panel, runs: list[spec.Run], by_metric: dict[str, list[dict]]) -> tuple[bool, bool, str]:
  """Each run's bars of the panel's metrics side by side; returns (percent, drawn, the y label)."""
  percent, drawn, label = True, False, panel.metrics[0]
  metrics = panel.metrics
  groups = [r for r in runs if any(c["run"] == r.name for m in metrics for c in by_metric.get(m, ()))]
  width = 0.8 / max(1, len(metrics))
  for j, m in enumerate(metrics):
    found = {c["run"]: c for c in by_metric.get(m, ()) if c["step"] is None}
    xs = [i for i, r in enumerate(groups) if r.name in found]
    if not xs:
      continue
    cs = [found[groups[i].name] for i in xs]
    percent = cs[0]["percent"]
    scale = 100.0 if percent else 1.0
    label = cs[0]["label"]
    ax.bar([x + (j - (len(metrics) - 1) / 2) * width for x in xs], [scale * c["mean"] for c in cs], width,
           yerr=[scale * (c["se"] or 0.0) for c in cs], capsize=3, label=label)
    drawn = True
  counts = {r.name: min((c["n"] for m in metrics for c in by_metric.get(m, ())
                         if c["run"] == r.name and c["step"] is None), default=0) for r in groups}
  ax.set_xticks(range(len(groups)))
  ax.set_xticklabels([f"{r.display} (n={counts[r.name]})" for r in groups], rotation=20, ha="right", fontsize=8)
  if len(metrics) > 1:
    ax.legend(fontsize=8)
  return percent, drawn, label


def _curves(ax, study: spec.Study, plot: spec.Plot, panel: spec.Panel, runs: list[spec.Run], cells: list[dict],
            by_metric: dict[str, list[dict]]) -> tuple[bool, bool, str]:
  """Each run's line by step (or by K) with its band of ± one standard error; returns (percent, drawn, the y
  label)."""
  percent, drawn, label = True, False, panel.metrics[0]
  for run in runs:
    if plot.x == "step":
      cs = sorted((c for c in by_metric.get(panel.metric, ()) if c["run"] == run.name and c["step"] is not None),
                  key=lambda c: c["step"])
      xs = [c["step"] for c in cs]
    else:
      cs = sorted((c for c in cells if c["run"] == run.name and c["k"] is not None
                   and c["metric"] == panel.metric.format(k=c["k"])), key=lambda c: c["k"])
      xs = [c["k"] for c in cs]
    if not cs:
      continue
    percent, label = cs[0]["percent"], cs[0]["label"]
    scale = 100.0 if percent else 1.0
    mean = [scale * c["mean"] for c in cs]
    se = [scale * (c["se"] or 0.0) for c in cs]
    n = min(c["n"] for c in cs)
    color = f"C{[r.name for r in study.runs].index(run.name) % 10}"  # a run's colour in every panel
    line, = ax.plot(xs, mean, marker="o", markersize=3, color=color, label=f"{run.display} (n={n})")
    ax.fill_between(xs, [m - s for m, s in zip(mean, se)], [m + s for m, s in zip(mean, se)],
                    color=line.get_color(), alpha=0.2, linewidth=0)
    drawn = True
  if plot.x == "k":
    ax.set_xscale("log", base=2)
    ks = sorted({c["k"] for c in cells if c["k"] is not None})
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks])
  if drawn:
    ax.legend(fontsize=8)
  return percent, drawn, label
