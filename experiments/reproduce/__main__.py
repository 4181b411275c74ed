r"""Reproduces a paper's ablation with one command: runs over seeds, mean ± standard error, tables, plots.

  python -m experiments.reproduce --study=paradigm                  # DeepSeekMath Fig 5 / Table 10
  python -m experiments.reproduce --study=majk_passk --profile=quick --parallel=2
  python -m experiments.reproduce --study=path/to/my_study.json --seeds=5
  python -m experiments.reproduce --list                            # the studies and their runs

A study (`experiments/studies/`) is data: a list of runs (flag sets of the runners `experiments.grpo_math`,
`experiments.flow_grpo`, `experiments.train_reward_model`), the metrics to read from what they write, and
the plots to draw. Each run and seed is its own process, `python -m <runner> <flags> --seed=S
--work_dir=DIR`, in a directory named by a hash of its runner, its flags and those of the runner's defaults that
differ from `studies/runner_defaults.json` (under --runs_dir), so a run that two studies share (the SFT policy,
plain GRPO) runs once, a change of a default starts new runs instead of reusing old ones (a new flag that keeps
the old behaviour does not), and a run whose `summary.json` exists is skipped:
a study stopped halfway continues where it was, and `--seeds=5` after `--seeds=3` runs only seeds 3 and 4.
A run interrupted after a checkpoint continues with the runner's `--resume`. A failed run is reported with
its log's last line and does not stop the others (only the runs that need its output).

Output in --out_dir (default runs/reproduce/NAME): `results.json` (one entry per cell: study, run, metric,
step, the seeds, their values, mean and standard error), `results.md` (the tables, the plots, the commands,
each run's wall time), the PNG plots, `runs/<run>/seed<S>` links to the run directories and `logs/`.
A design profile's finished runs are also kept in the repository (`--archive_dir`, by default
docs/reproduce/<study>/<profile>/runs: summaries, metrics and records, a seed once all its runs have finished) and
put back from there, so a study that takes several sessions goes on from a fresh clone where the last one stopped.
Profiles: `full` runs the runners' own settings, `quick` the study's shortened ones (fewer steps, a smaller
held-out set; `results.md` lists the flags it adds).
"""

import pathlib
import sys

from absl import app
from absl import flags

from experiments import studies as studies_lib
from experiments.reproduce import archive as archive_lib
from experiments.reproduce import execute
from experiments.reproduce import pages
from experiments.reproduce import pipeline
from experiments.reproduce import plan as plan_lib

flags.DEFINE_string("study", None, "A study name (--list shows them) or a JSON file of a study spec.")
flags.DEFINE_integer("seeds", 3, "Seeds 0..N-1 of every run (model init, data order and sampling change with "
                     "it); default: the study's own (3, headline 5).")
flags.DEFINE_string("profile", "quick", "quick: the study's shortened settings; full: the runners' own settings.")
flags.DEFINE_string("out_dir", "", "Results, plots, logs and run links; default runs/reproduce/<study>.")
flags.DEFINE_string("runs_dir", "runs/reproduce/runs", "Where run directories live (shared by all studies: a "
                    "run with the same runner and flags is reused).")
flags.DEFINE_string("archive_dir", "", "Where a design profile's finished runs are kept (summaries, metrics, "
                    "records; commit them) and put back from, so that a study outlives its machine; default "
                    "docs/reproduce/<study>/<profile>/runs of this checkout; 'none': keep nothing.")
flags.DEFINE_integer("parallel", 1, "Runs at once (each process uses every core it finds).")
flags.DEFINE_list("only", [], "Run only these runs (and what they need); aggregate all that exist.")
flags.DEFINE_bool("dry_run", False, "Print the commands and which would run or be skipped, run nothing.")
flags.DEFINE_bool("aggregate_only", False, "Run nothing; aggregate, tabulate and plot what exists.")
flags.DEFINE_bool("list", False, "List the studies, their runs and profiles, and exit.")
flags.DEFINE_bool("claims_table", False, "Print the table of every study's claims against its committed pages "
                  "(docs/reproduce/<study>/results.json, quick, and <study>/full/results.json) and exit.")
flags.DEFINE_bool("redecide", False, "Decide the committed pages' claims again from their cells (after a change of "
                  "the claims or the verdict rules) and rewrite each page's results.json and the Verdicts section of "
                  "its results.md; run nothing, and exit.")
flags.DEFINE_bool("redraw", False, "Bring the committed pages' figures in line with today's profiles: a figure of "
                  "another profile's runs goes, with its link in results.md, and one of its own that a page lacks is "
                  "drawn from its cells (the others stay as they ran); run nothing, and exit.")
flags.DEFINE_bool("write_defaults_snapshot", False, "Record the runners' defaults under a new revision in "
                  "experiments/studies/runner_defaults.json (every run directory moves once), and exit.")

FLAGS = flags.FLAGS


def _list() -> None:
  """--list: each registered study, its profiles and its runs' flags."""
  for study in studies_lib.STUDIES.values():
    print(f"{study.name}: {study.title}")
    print(f"  profiles: full, {', '.join(study.profiles)}")
    for run in study.runs:
      tuned = (f" (--{run.tune.flag} from {', '.join(f'{v:g}' for v in run.tune.values)} on a validation split)"
               if run.tune else "")
      print(f"  - {run.name} ({run.module}): {' '.join(plan_lib.flag_args(dict(run.flags)))}{tuned}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.list:
    _list()
    return
  try:
    if FLAGS.claims_table:
      print(pages.claims_table(), end="")
      return
    if FLAGS.redecide:
      for page_dir in pages.redecide_pages():
        print(f"reproduce: new verdicts in {page_dir}/results.md")
      return
    if FLAGS.redraw:
      for page_dir in pages.redraw_pages():
        print(f"reproduce: new figures in {page_dir}")
      return
  except plan_lib.StudyError as err:
    sys.exit(f"reproduce: error: {err}")
  if FLAGS.write_defaults_snapshot:
    revision = plan_lib.write_defaults_snapshot()
    print(f"reproduce: {plan_lib.DEFAULTS_SNAPSHOT} now holds revision {revision} of the runners' defaults")
    return
  if not FLAGS.study:
    sys.exit("reproduce: error: --study is required (--list shows the studies)")
  if FLAGS.seeds < 1 or FLAGS.parallel < 1:
    sys.exit("reproduce: error: --seeds and --parallel must be >= 1")
  try:
    study = plan_lib.load_study(FLAGS.study)
    out_dir = pathlib.Path(FLAGS.out_dir or f"runs/reproduce/{study.name}")
    design = study.designs.get(FLAGS.profile)
    seeds = FLAGS.seeds if FLAGS["seeds"].present else design.seeds if design else study.seeds
    archive = archive_lib.chosen_dir(FLAGS.archive_dir, study.name, FLAGS.profile, declared=design is not None)
    results = pipeline.reproduce(study, profile=FLAGS.profile, seeds=list(range(seeds)), out_dir=out_dir,
                                 runs_dir=pathlib.Path(FLAGS.runs_dir), parallel=FLAGS.parallel, only=FLAGS.only,
                                 dry_run=FLAGS.dry_run, aggregate_only=FLAGS.aggregate_only, archive=archive)
  except (plan_lib.StudyError, ValueError, OSError) as err:  # OSError: an --out_dir or --runs_dir it cannot write
    sys.exit(f"reproduce: error: {err}")
  except execute.Stopped as err:
    print(f"reproduce: {err}", file=sys.stderr)
    sys.exit(128 + err.signum)
  if results and results["failures"]:
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
