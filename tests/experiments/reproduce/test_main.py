"""`python -m experiments.reproduce`: a JSON spec from the command line, and bad input in one line."""

import json
import pathlib
import subprocess
import sys

import pytest

from experiments.reproduce import __main__ as reproduce_main
from tests import reproduce_fakes as fakes

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_json_spec_from_the_command_line(tmp_path):
  """`--study=file.json`: the same study as data, through the CLI; --dry_run runs nothing."""
  study = {"name": "tiny_json", "title": "From JSON",
           "runs": [{"name": "only", "flags": {"level": 0.03}, "command": [sys.executable, "-c", fakes.FAKE_RUNNER]}],
           "metrics": [{"name": "final", "key": "final_accuracy"}],
           "plots": [{"file": "bars.png", "x": "run", "panels": [{"metric": ["final"]}]}]}
  path = tmp_path / "study.json"
  path.write_text(json.dumps(study))
  base = [sys.executable, "-m", "experiments.reproduce", f"--study={path}", "--seeds=2", "--profile=full",
          f"--out_dir={tmp_path / 'out'}", f"--runs_dir={tmp_path / 'runs'}"]
  dry = subprocess.run(base + ["--dry_run"], cwd=ROOT, capture_output=True, text=True)
  assert dry.returncode == 0, dry.stderr
  assert "--level=0.03 --seed=1" in dry.stdout and not (tmp_path / "out").exists()
  done = subprocess.run(base, cwd=ROOT, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr
  results = json.loads((tmp_path / "out" / "results.json").read_text())
  assert results["cells"][0]["values"] == pytest.approx([0.31, 0.41]) and (tmp_path / "out" / "bars.png").is_file()


def test_an_out_dir_it_cannot_write_is_one_line(tmp_path, main_in_process):
  """Issue 55's sweep: `--aggregate_only --out_dir=<a directory that cannot be made>` ended in a traceback."""
  blocked = tmp_path / "file"
  blocked.write_text("")  # a file where the directory's parent should be
  error = main_in_process(reproduce_main.main, ["reproduce", "--study=paradigm", "--aggregate_only",
                                           f"--runs_dir={tmp_path / 'runs'}", f"--out_dir={blocked / 'out'}"])
  assert error.startswith("reproduce: error: ") and str(blocked / "out") in error and "\n" not in error, error


def test_a_runs_dir_it_cannot_write_is_one_line_before_any_run(tmp_path, main_in_process):
  """Issue 55's sweep: an unwritable --runs_dir failed every run in turn, one report each; now one line first."""
  blocked = tmp_path / "file"
  blocked.write_text("")
  error = main_in_process(reproduce_main.main, ["reproduce", "--study=paradigm", "--profile=quick",
                                                f"--runs_dir={blocked / 'runs'}", f"--out_dir={tmp_path / 'out'}"])
  assert error.startswith(f"reproduce: error: --runs_dir={blocked / 'runs'} cannot be written: "), error
  assert "\n" not in error and not (tmp_path / "out").exists()
