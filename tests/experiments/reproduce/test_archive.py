"""experiments.reproduce.archive: a design's finished seeds kept and put back, so a study outlives its machine."""

import json
import pathlib
import shutil
import sys

from experiments.reproduce import archive as archive_lib
from experiments.reproduce import pipeline
from experiments.reproduce import plan as plan_lib
from experiments.studies import spec
from tests import reproduce_fakes as fakes

# A runner with weights: writes weights/w.txt (its level plus what it started from), a resumable checkpoint and a
# summary; --start=DIR/weights reads another run's weights; --fail_seed=S fails on seed S; counts its invocations.
RUNNER = r"""
import json, pathlib, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
work = pathlib.Path(args["work_dir"]); work.mkdir(parents=True, exist_ok=True)
with open(work.parent / "invocations.txt", "a") as f:
    f.write(args["seed"] + "\n")
if args.get("fail_seed") == args["seed"]:
    sys.exit("error: this seed fails")
start = float(pathlib.Path(args["start"], "w.txt").read_text()) if "start" in args else 0.0
value = start + float(args["level"]) + 0.1 * int(args["seed"])
(work / "weights").mkdir(exist_ok=True); (work / "weights" / "w.txt").write_text(str(value))
(work / "checkpoints" / "3").mkdir(parents=True, exist_ok=True); (work / "checkpoints" / "3" / "state").write_text("x")
(work / "metrics.jsonl").write_text(json.dumps({"step": 3, "eval/accuracy": value}) + "\n")
(work / "summary.json").write_text(json.dumps({"final_accuracy": value, "code_version": "a" * 40}))
"""
COMMIT = "a" * 40


def _study(fail_seed: int | None = None) -> spec.Study:
  """A shared start read by every seed's two runs (policy -> its follow-up), under a design of 8 seeds."""
  command = (sys.executable, "-c", RUNNER)
  extra = {"fail_seed": fail_seed} if fail_seed is not None else {}
  runs = (spec.Run("start", {"level": 1.0}, command=command, shared=True),
          spec.Run("policy", {"level": 0.5, "start": "{run:start}/weights"}, command=command),
          spec.Run("follow", {"level": 0.25, "start": "{run:policy}/weights", **extra}, command=command))
  metrics = (spec.Metric("final", "final_accuracy"),)
  claims = (spec.Claim("follow beats policy", "follow - policy", "final", margin=0.03),)
  return spec.Study("kept", "A kept study", runs, metrics, (), contrasts=(spec.Contrast("follow", "policy", "final"),),
                    designs={"full": spec.Design(claims, seeds=8, note="a test")})


def _invocations(runs_dir: pathlib.Path) -> dict[str, list[str]]:
  """Each run directory's invocations (the seeds it ran), by the run's name as the plan names it."""
  jobs = plan_lib.plan(_study(), "full", list(range(8)), runs_dir, COMMIT)
  names = {j.directory.parent.name: j.run.name for j in jobs}
  return {names[p.parent.name]: p.read_text().split() for p in runs_dir.glob("*/invocations.txt")}


def test_finished_seeds_are_kept_and_a_new_machine_runs_only_the_rest(tmp_path):
  archive, quiet = tmp_path / "archive", lambda line: None
  first = pipeline.reproduce(_study(), profile="full", seeds=[0, 1, 2], out_dir=tmp_path / "out",
                             runs_dir=tmp_path / "runs", echo=quiet, commit=COMMIT, archive=archive)
  jobs = plan_lib.plan(_study(), "full", [0, 1, 2], tmp_path / "runs", COMMIT)
  by = {j.key: j for j in jobs}
  # the shared start with the weights the others read, never its checkpoints; a seed's runs without their weights
  start = archive / by[("start", 0)].directory.parent.name / "seed0"
  assert sorted(str(p.relative_to(start)) for p in start.rglob("*") if p.is_file()) == [
      "metrics.jsonl", "summary.json", "weights/w.txt"]
  policy = archive / by[("policy", 2)].directory.parent.name
  assert sorted(p.name for p in (policy / "seed2").iterdir()) == ["metrics.jsonl", "summary.json"]
  assert json.loads((policy / "seed2.run.json").read_text())["commit"] == COMMIT  # the record, for the page
  assert not list(archive.rglob("*.partial"))

  # a new machine: nothing under --runs_dir but the archive; 4 seeds run only seed 3's two runs
  lines = []
  again = pipeline.reproduce(_study(), profile="full", seeds=[0, 1, 2, 3], out_dir=tmp_path / "out2",
                             runs_dir=tmp_path / "new", echo=lines.append, commit=COMMIT, archive=archive)
  assert _invocations(tmp_path / "new") == {"policy": ["3"], "follow": ["3"]}
  assert "kept: 7 finished runs restored from" in lines[0]
  cells = fakes.cells(again)
  assert cells[("follow", "final", None)]["values"][:3] == fakes.cells(first)[("follow", "final", None)]["values"]
  # seed 3 read the restored start's weights: 1.0 + 0.5 + 0.3
  assert cells[("policy", "final", None)]["values"][3] == 1.8
  assert cells[("follow", "final", None)]["n"] == 4


def test_a_seed_cut_short_is_not_kept_and_runs_again_whole(tmp_path):
  archive, quiet = tmp_path / "archive", lambda line: None
  pipeline.reproduce(_study(fail_seed=1), profile="full", seeds=[0, 1], out_dir=tmp_path / "out",
                     runs_dir=tmp_path / "runs", echo=quiet, commit=COMMIT, archive=archive)
  jobs = {j.key: j for j in plan_lib.plan(_study(fail_seed=1), "full", [0, 1], tmp_path / "runs", COMMIT)}
  assert archive_lib.is_kept(jobs[("policy", 0)], archive) and archive_lib.is_kept(jobs[("follow", 0)], archive)
  # seed 1's policy finished but its follow-up failed: the policy is not kept (its weights would be missing)
  assert jobs[("policy", 1)].summary.is_file() and not archive_lib.is_kept(jobs[("policy", 1)], archive)

  # a copy cut short is not a kept run, and a restore replaces what an interrupted attempt left
  partial = archive / jobs[("follow", 1)].directory.parent.name / "seed1.partial"
  partial.mkdir(parents=True)
  (partial / "summary.json").write_text("{}")
  assert not archive_lib.is_kept(jobs[("follow", 1)], archive)
  shutil.rmtree(tmp_path / "runs")
  leftover = jobs[("follow", 0)].directory / "checkpoints" / "1"
  leftover.mkdir(parents=True)
  assert sorted(archive_lib.restore(list(jobs.values()), archive)) == ["follow seed 0", "policy seed 0",
                                                                        "start seed 0"]
  assert not leftover.exists() and jobs[("follow", 0)].summary.is_file()
  assert not jobs[("policy", 1)].directory.exists()


def test_a_dry_run_says_which_runs_the_archive_holds(tmp_path):
  archive, lines = tmp_path / "archive", []
  pipeline.reproduce(_study(), profile="full", seeds=[0], out_dir=tmp_path / "out", runs_dir=tmp_path / "runs",
                     echo=lambda line: None, commit=COMMIT, archive=archive)
  pipeline.reproduce(_study(), profile="full", seeds=[0, 1], out_dir=tmp_path / "out", runs_dir=tmp_path / "new",
                     echo=lines.append, commit=COMMIT, archive=archive, dry_run=True)
  states = [line.split("\n")[0] for line in lines if line.startswith("# ")]
  assert states == ["# start seed 0: skip (kept in the archive)", "# policy seed 0: skip (kept in the archive)",
                    "# follow seed 0: skip (kept in the archive)", "# policy seed 1: run", "# follow seed 1: run"]
  assert not (tmp_path / "new").exists()  # a dry run restores nothing


def test_the_default_archive_is_beside_the_profiles_page():
  assert archive_lib.default_dir("iterative", "paths") == plan_lib.ROOT / "docs/reproduce/iterative/paths/runs"


def test_the_archive_flag_chooses_none_a_path_or_the_designs_default(tmp_path):
  """`--archive_dir`: `none` turns keeping off even for a design, a path wins, and empty keeps only a declared
  design's runs (a quick or full profile has nothing to keep)."""
  assert archive_lib.chosen_dir("none", "iterative", "paths", declared=True) is None
  assert archive_lib.chosen_dir(str(tmp_path), "iterative", "paths", declared=True) == tmp_path
  assert archive_lib.chosen_dir(str(tmp_path), "paradigm", "quick", declared=False) == tmp_path
  assert archive_lib.chosen_dir("", "iterative", "paths", declared=True) == archive_lib.default_dir("iterative", "paths")
  assert archive_lib.chosen_dir("", "paradigm", "quick", declared=False) is None


def test_an_archive_it_cannot_write_is_one_line_before_any_run(tmp_path):
  """Not after the first seed's runs have finished (their copies would fail then, with the runs in flight)."""
  blocked = tmp_path / "file"
  blocked.write_text("")  # a file where the archive's parent should be
  try:
    pipeline.reproduce(_study(), profile="full", seeds=[0], out_dir=tmp_path / "out", runs_dir=tmp_path / "runs",
                       echo=lambda line: None, commit=COMMIT, archive=blocked / "archive")
  except OSError as err:
    assert str(err).startswith(f"--archive_dir={blocked / 'archive'} cannot be written: "), err
  else:
    raise AssertionError("an archive that cannot be written was taken")
  assert not list((tmp_path / "runs").rglob("invocations.txt"))  # no run started
