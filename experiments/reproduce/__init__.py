"""Reproduces a paper's ablation over seeds: `python -m experiments.reproduce --study=NAME` (see `__main__`).

One idea a module, each importing only those above it:

  plan      a study in a profile -> its jobs (a run and a seed each), in directories named by a hash; the runners'
            defaults snapshot
  design    a design profile's one commit, and the commit that declared it
  aggregate finished runs -> cells (mean ± standard error over seeds) -> the claims' verdicts
  tune      a tuned run's value, chosen on the validation split
  execute   the processes: skip what finished, resume what was interrupted, stop on SIGTERM
  plots     the PNGs
  pages     results.json and results.md; the README's claims table and `--redecide` over the committed pages
  pipeline  one invocation: plan, execute, pages
"""

from experiments.reproduce.execute import Stopped
from experiments.reproduce.pages import claims_table
from experiments.reproduce.pipeline import reproduce
from experiments.reproduce.plan import StudyError
from experiments.reproduce.plan import load_study
