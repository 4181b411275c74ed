r"""Wall-clock of a whole job at two revisions of this repository, back to back on this machine (issue #16).

  python scripts/bench_before_after.py                              # the default run: f5a4965 then HEAD
  python scripts/bench_before_after.py --job=ci                     # `.ci/run` on clean clones of both
  python scripts/bench_before_after.py --baseline=HEAD~3 -- --steps=20 --sft_steps=100   # runner flags for both
  python scripts/bench_before_after.py --baseline=HEAD~1 -- --steps=0       # SFT only: are training's bits kept?
  python scripts/bench_before_after.py --job=ci --pairs=3                     # mean ± s.e. over three pairs
  python scripts/bench_before_after.py --job=ci --logs=/tmp/ci_logs            # keep each run's whole output
  python scripts/bench_before_after.py --cache=warm             # the default run with its programs cached

Each revision is cloned from this repository into a temporary directory (the working tree is not touched):

  default_run  `python -m experiments.grpo_math` from that tree (this interpreter and its installed packages, the
               tree first on PYTHONPATH), its own work dir and, where the revision has `--compilation_cache_dir`,
               an empty compilation cache (`--cache=warm`: one filled by an untimed run of that revision first,
               as a user's second run finds it), plus any runner flags given after `--`; reports the wall-clock, the
               held-out accuracy before and after RL from the run's summary.json, and whether the SFT and final
               policies' weights are byte for byte the baseline's (a speed-up should keep them: a change of
               rounding in training can turn the tiny run into another trajectory, which a short check misses),
               the mean seconds of a stage-2 step's sampling, scoring and update after the first step (its
               metrics.jsonl) and the run's peak host memory (summary.json).
  ci           `.ci/run` in that tree, which builds its own virtual environment and runs the README's test
               command; the tests' on-disk XLA cache (tests/conftest.py) is deleted first, as on a fresh machine.
               A revision whose run fails has its FAILED/ERROR lines (or its last lines) printed under the table.

With `--pairs=n` the two revisions run n times each, in the order AB, BA, AB, ... (a drift of the machine's speed
reaches both), each run from a fresh clone; the table then gives every run, and the summary the mean ± standard
error of each revision's seconds and of the n paired ratios candidate / baseline. With `--logs=DIR` each run's
standard output and error are kept in DIR as `<pair>_<baseline|candidate>_<commit>.log`, a failed run's too (the
tables keep only the last lines).

The machine's float32 matmul GFLOP/s ([1024, 1024] products, the fastest of 15) is measured before and after,
and the load average printed, since machines of one kind differ by 2x: read the ratio, measured in one sitting.
"""

import argparse
import contextlib
import hashlib
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

import grpo_jax  # noqa: F401  pylint: disable=unused-import  (on a machine without a TPU, JAX does not start libtpu)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def matmul_gflops(n: int = 1024, repeats: int = 15) -> float:
  """Float32 [n, n] @ [n, n] GFLOP/s, the fastest of `repeats` after a warm-up."""
  a = jnp.ones((n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  dot(a, a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    dot(a, a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * n ** 3 / best / 1e9


def load_average() -> str:
  return " ".join(f"{x:.1f}" for x in os.getloadavg())


def resolve(revision: str) -> str:
  """The commit a revision names (one line of error if it names none)."""
  done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"], cwd=ROOT,
                        capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise SystemExit(f"bench_before_after: error: {revision!r} names no commit of {ROOT}")
  return done.stdout.strip()


def checkout(commit: str, directory: pathlib.Path) -> pathlib.Path:
  """A clean clone of this repository at `commit` in `directory` (as CI gets it: committed files only)."""
  subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(directory)], check=True)
  subprocess.run(["git", "checkout", "--quiet", "--detach", commit], cwd=directory, check=True)
  return directory


@contextlib.contextmanager
def fresh_clone(commit: str, directory: pathlib.Path):
  """`(tree, scratch)`: a clean clone at `commit` and an empty scratch directory under `directory`, both removed
  afterwards."""
  tree, scratch = checkout(commit, directory / "tree"), directory / "scratch"
  scratch.mkdir()
  try:
    yield tree, scratch
  finally:
    shutil.rmtree(directory)


def keep_log(log: pathlib.Path | None, done: subprocess.CompletedProcess) -> None:
  """Writes a finished run's standard output and error to `log` (nothing without one)."""
  if log is not None:
    log.write_text(done.stdout + done.stderr)


def has_compilation_cache(tree: pathlib.Path) -> bool:
  """Whether the runner at `tree` has `--compilation_cache_dir` (f5a4965 has none: every run compiles)."""
  return any("compilation_cache_dir" in p.read_text() for p in (tree / "experiments").rglob("*.py"))


def run_default(tree: pathlib.Path, scratch: pathlib.Path, runner_flags: list[str], log: pathlib.Path | None,
                cache: pathlib.Path | None = None) -> dict:
  """The default run from `tree`: wall-clock seconds and the summary's accuracies. Its compilation cache is `cache`
  (default: an empty one in `scratch`, so the revision's own cache is not used)."""
  work_dir = scratch / "run"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])))
  # The work dir after the runner's flags, so that a --flagfile's own --work_dir does not move the run elsewhere
  cmd = [sys.executable, "-m", "experiments.grpo_math", *runner_flags, f"--work_dir={work_dir}"]
  if has_compilation_cache(tree):
    cmd.append(f"--compilation_cache_dir={cache or scratch / 'xla_cache'}")
  start = time.perf_counter()
  done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
  seconds = time.perf_counter() - start
  keep_log(log, done)
  if done.returncode != 0:
    lines = [l for l in done.stderr.strip().splitlines() if not l.startswith("Pass --help")] or ["(no output)"]
    raise SystemExit(f"bench_before_after: error: the run from {tree} failed: {lines[-1]}")
  if not (work_dir / "summary.json").is_file():
    raise SystemExit(f"bench_before_after: error: the run from {tree} wrote no {work_dir / 'summary.json'}")
  summary = json.loads((work_dir / "summary.json").read_text())
  weights = {d: work_dir / d / "model.safetensors" for d in ("sft_policy", "final_policy")}
  return {"seconds": seconds, "start": summary.get("start_accuracy"), "final": summary.get("final_accuracy"),
          "weights": {d: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
                      for d, p in weights.items()},
          "later_step": later_step(work_dir / "metrics.jsonl"), "peak_rss_mib": summary.get("peak_rss_mib")}


STEP_PARTS = ("sampling", "scoring", "update")  # a step's `train/time_*` records


def later_step(metrics: pathlib.Path) -> dict:
  """The mean seconds of each of a stage-2 step's parts (`STEP_PARTS`) over its steps after the first (which
  compiles), from the run's metrics.jsonl; {} without two such steps."""
  if not metrics.is_file():
    return {}
  records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
  steps = [r for r in records if "train/time_update" in r][1:]
  if not steps:
    return {}
  return {part: sum(r.get(f"train/time_{part}", 0.0) for r in steps) / len(steps) for part in STEP_PARTS}


def run_ci(tree: pathlib.Path, scratch: pathlib.Path, runner_flags: list[str], log: pathlib.Path | None,
           cache: pathlib.Path | None = None) -> dict:
  """`.ci/run` in `tree` after deleting the tests' on-disk XLA cache: wall-clock seconds and its exit status."""
  del scratch, cache  # always cold: `--cache=warm` is refused for this job
  if runner_flags:
    raise SystemExit("bench_before_after: error: runner flags after -- apply to --job=default_run only")
  tests_cache = pathlib.Path(tempfile.gettempdir()) / f"grpo_jax_tests_xla_cache_{os.getuid()}"
  shutil.rmtree(tests_cache, ignore_errors=True)
  start = time.perf_counter()
  done = subprocess.run(["bash", ".ci/run"], cwd=tree, capture_output=True, text=True, check=False)
  seconds = time.perf_counter() - start
  keep_log(log, done)
  last = done.stdout.strip().splitlines()[-1:] or [""]
  failed = [l for l in done.stdout.splitlines() if l.startswith(("FAILED ", "ERROR "))]  # pytest's summary lines
  if done.returncode != 0 and not failed:  # it failed before or outside pytest (the install, the collection)
    failed = (done.stderr.strip() or done.stdout.strip() or "(no output)").splitlines()[-3:]
  return {"seconds": seconds, "rc": done.returncode, "last": last[0], "failed": failed}


JOBS = {"default_run": run_default, "ci": run_ci}


def same_weights(result: dict, baseline: dict) -> str:
  """Per saved policy, whether its safetensors bytes equal the baseline run's ("SFT yes, final no")."""
  cells = []
  for directory, label in (("sft_policy", "SFT"), ("final_policy", "final")):
    mine, theirs = result["weights"][directory], baseline["weights"][directory]
    cells.append(f"{label} {'n/a' if mine is None or theirs is None else 'yes' if mine == theirs else 'no'}")
  return ", ".join(cells)


def mean_se(values: list[float]) -> str:
  """"m ± s.e." of `values` (the standard error of the mean; "m" alone for one value)."""
  m = sum(values) / len(values)
  if len(values) < 2:
    return f"{m:.3f}"
  se = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1) / len(values))
  return f"{m:.3f} ± {se:.3f}"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--job", choices=sorted(JOBS), default="default_run")
  parser.add_argument("--baseline", default="f5a4965", help="revision measured first (default: before #16)")
  parser.add_argument("--candidate", default="HEAD", help="revision measured second")
  parser.add_argument("--pairs", type=int, default=1, help="runs of each revision, alternating AB, BA, ...")
  parser.add_argument("--logs", default="", help="a directory to keep each run's output in (created if missing)")
  parser.add_argument("--cache", choices=("cold", "warm"), default="cold",
                      help="default_run: an empty compilation cache for every run, or one per revision filled by an "
                           "untimed run first (a revision without the cache stays cold)")
  parser.add_argument("runner_flags", nargs="*", help="after --: runner flags for both default runs")
  args = parser.parse_args()
  if args.pairs < 1:
    parser.error(f"--pairs must be >= 1, got {args.pairs}")
  if args.cache == "warm" and args.job != "default_run":
    parser.error("--cache=warm applies to --job=default_run only (CI runs from a clean clone are cold)")
  logs = pathlib.Path(args.logs) if args.logs else None
  if logs is not None:
    if logs.exists() and not logs.is_dir():
      parser.error(f"--logs={logs} is a file, not a directory")
    try:
      logs.mkdir(parents=True, exist_ok=True)
    except OSError as e:
      parser.error(f"--logs={logs}: cannot create it ({e.strerror})")
  revisions = dict((name, resolve(rev)) for name, rev in (("baseline", args.baseline), ("candidate", args.candidate)))
  peaks = [matmul_gflops()]
  print(f"jax {jax.__version__} ({jax.default_backend()}), {os.cpu_count()} cores; float32 matmul 1024^3 "
        f"{peaks[0]:.0f} GFLOP/s; load average {load_average()}", flush=True)
  runs = []  # (pair, name, result) in the order run
  with tempfile.TemporaryDirectory(prefix="bench_before_after_") as tmp:
    caches = {name: None for name in revisions}
    if args.cache == "warm":
      for name in revisions:
        with fresh_clone(revisions[name], pathlib.Path(tmp) / f"warm_{name}") as (tree, scratch):
          if not has_compilation_cache(tree):
            print(f"{name} {revisions[name][:12]}: no compilation cache at this revision; its runs compile",
                  flush=True)
            continue
          caches[name] = pathlib.Path(tmp) / f"xla_cache_{name}"
          log = None if logs is None else logs / f"0_{name}_{revisions[name][:9]}_warm-up.log"
          result = run_default(tree, scratch, args.runner_flags, log, caches[name])
          print(f"{name} {revisions[name][:12]}: the cache filled by an untimed run ({result['seconds']:.1f} s)",
                flush=True)
    for pair in range(args.pairs):
      for name in ("baseline", "candidate") if pair % 2 == 0 else ("candidate", "baseline"):
        with fresh_clone(revisions[name], pathlib.Path(tmp) / f"{pair}_{name}") as (tree, scratch):
          print(f"{name} {revisions[name][:12]}: {args.job} ...", flush=True)
          log = None if logs is None else logs / f"{pair + 1}_{name}_{revisions[name][:9]}.log"
          result = JOBS[args.job](tree, scratch, args.runner_flags, log, caches[name])
        runs.append((pair, name, result))
        print(f"  {result['seconds']:.1f} s (load average {load_average()})", flush=True)
  peaks.append(matmul_gflops())
  first = {name: r for pair, name, r in runs if pair == 0}
  seconds = lambda pair, name: next(r["seconds"] for p, n, r in runs if p == pair and n == name)
  print(f"\n## {args.job}: {' '.join(args.runner_flags) or 'no flags'}; compilation cache {args.cache}; float32 "
        f"matmul {peaks[0]:.0f} GFLOP/s before, {peaks[1]:.0f} after\n")
  if args.job == "default_run":
    print("| pair | revision | wall-clock s | vs baseline | held-out accuracy, start -> after RL | weights as the "
          "baseline's | a later step: " + " / ".join(STEP_PARTS) + " s | peak RSS GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for pair, name, r in runs:
      later = " / ".join(f"{r['later_step'][part]:.3f}" for part in STEP_PARTS) if r["later_step"] else "n/a"
      rss = "n/a" if r["peak_rss_mib"] is None else f"{r['peak_rss_mib'] / 1024:.2f}"
      print(f"| {pair + 1} | {name} {revisions[name][:9]} | {r['seconds']:.1f} | "
            f"{r['seconds'] / seconds(pair, 'baseline'):.2f}x | {100 * r['start']:.1f}% -> {100 * r['final']:.1f}% | "
            f"{same_weights(r, first['baseline'])} | {later} | {rss} |")
  else:
    print("| pair | revision | wall-clock s | vs baseline | exit status | pytest's last line |")
    print("|---|---|---|---|---|---|")
    for pair, name, r in runs:
      print(f"| {pair + 1} | {name} {revisions[name][:9]} | {r['seconds']:.1f} | "
            f"{r['seconds'] / seconds(pair, 'baseline'):.2f}x | {r['rc']} | {r['last']} |")
    for pair, name, r in runs:
      for line in r["failed"]:
        print(f"{name} {revisions[name][:9]} (pair {pair + 1}): {line}")
  if args.pairs > 1:
    ratios = [seconds(p, "candidate") / seconds(p, "baseline") for p in range(args.pairs)]
    each = {name: mean_se([seconds(p, name) for p in range(args.pairs)]) for name in revisions}
    print(f"\nover {args.pairs} pairs (mean ± s.e.): baseline {each['baseline']} s, candidate {each['candidate']} s, "
          f"candidate / baseline {mean_se(ratios)}")


if __name__ == "__main__":
  main()
