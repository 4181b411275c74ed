"""The studies of `python -m experiments.reproduce`, by name. A study is data: see `spec.Study`.

To add one, write a module with `STUDY = Study(...)` (runs, metrics, plots, a quick profile) and list it
below, or pass a JSON file of the same fields as `--study=path.json`.
"""

from experiments.studies import flow_grpo
from experiments.studies import headline
from experiments.studies import iterative
from experiments.studies import majk_passk
from experiments.studies import paradigm
from experiments.studies import variants
from experiments.studies.spec import Metric, Panel, Plot, Run, Study

STUDIES = {s.name: s for s in (paradigm.STUDY, majk_passk.STUDY, iterative.STUDY, variants.STUDY,
                                flow_grpo.STUDY, headline.STUDY)}

__all__ = ["STUDIES", "Metric", "Panel", "Plot", "Run", "Study"]
