r"""On-policy distillation against GRPO on the embedded default task: the same updates from the same SFT start.

  python scripts/distill_vs_grpo.py --out_dir=runs/distill --seeds=4 --parallel=2

The runs, each `python -m experiments.grpo_math` in `--out_dir/<name>`:

  teacher_sft   a larger tiny model (`--teacher_hidden_size`, `--teacher_layers`; default 6 layers of width 128,
                the student 4) SFT-trained on more solutions for longer (`--teacher_sft_examples`,
                `--teacher_sft_steps`: 18,000 for 2,000 steps, the student 2,000 for 600), seed 0
  teacher       GRPO from it (`--teacher_steps` steps of TEACHER_RL); its final_policy is the teacher, an HF
                checkpoint with the embedded tokenizer
  sft           the default student's stage 1 on seed 0 (the studies' `sft` run: the runner's defaults, no RL)
  grpo/SETTING/seedS     `--algo=grpo` from sft/sft_policy on seed S
  distill/SETTING/seedS  `--algo=distill --teacher_checkpoint=teacher/final_policy` from the same start with the
                         same steps, prompts per step, samples per prompt and learning rate

SETTING names those four (`steps40-batch16-group8-lr0.0001`), so other settings reuse the teacher and the start.
Every student run starts from the one SFT policy: the seeds vary the RL runs only (sampling, data order), and the
start accuracy is one number. Written: results-SETTING.md (held-out greedy accuracy per seed, mean ± s.e. over
seeds, the paired difference distill − GRPO seed by seed) and results-SETTING.json. A run whose summary.json exists
is skipped (one made with other flags is refused), one that left a checkpoint resumes: the same command continues.
SIGTERM or Ctrl-C stops the runs in flight, each saving its step.
"""

import argparse
import dataclasses
import json
import math
import pathlib
import shutil
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


# The teacher's GRPO stage: the studies' quick settings, whatever the students' (so every setting shares a teacher)
TEACHER_RL = dict(batch_size=16, group_size=8, learning_rate=1e-4)


@dataclasses.dataclass
class Run:
  name: str  # also its directory under --out_dir
  flags: dict
  needs: tuple = ()


def plan(args) -> list[Run]:
  """The runs, each after the runs it needs."""
  out = pathlib.Path(args.out_dir).resolve()
  at = lambda *parts: str(out.joinpath(*parts).resolve())  # noqa: E731  (a linked run: where it lies)
  quiet = dict(eval_every=0, num_test=args.num_test, tensorboard=False)
  rl = dict(steps=args.steps, batch_size=args.batch_size, group_size=args.group_size,
            learning_rate=args.learning_rate, save_every=10, **quiet)
  runs = [
      Run("teacher_sft", dict(tiny_hidden_size=args.teacher_hidden_size, tiny_layers=args.teacher_layers,
                              sft_examples=args.teacher_sft_examples, sft_steps=args.teacher_sft_steps, steps=0,
                              seed=0, **quiet)),
      Run("teacher", dict(init_checkpoint=at("teacher_sft", "sft_policy"), sft_examples=args.teacher_sft_examples,
                          **TEACHER_RL, steps=args.teacher_steps, save_every=10, **quiet, seed=0), ("teacher_sft",)),
      Run("sft", dict(steps=0, seed=0, **quiet)),
  ]
  for seed in range(args.seeds):
    start = dict(init_checkpoint=at("sft", "sft_policy"), **rl, seed=seed)
    runs.append(Run(f"grpo/{setting(args)}/seed{seed}", dict(algo="grpo", **start), ("sft",)))
    runs.append(Run(f"distill/{setting(args)}/seed{seed}",
                    dict(algo="distill", teacher_checkpoint=at("teacher", "final_policy"), **start),
                    ("sft", "teacher")))
  return runs


def setting(args) -> str:
  """The student runs' directory under their method's: one per setting, so settings share the teacher and start."""
  return f"steps{args.steps}-batch{args.batch_size}-group{args.group_size}-lr{args.learning_rate:g}"


def argv(run: Run, out_dir: pathlib.Path) -> list[str]:
  flags = [f"--{k}" if v is True else f"--no{k}" if v is False else f"--{k}={v}" for k, v in run.flags.items()]
  return [sys.executable, "-m", "experiments.grpo_math", *flags, f"--work_dir={out_dir.resolve() / run.name}"]


_UNCHECKED = ("tensorboard", "save_every")  # flags that change no number


def finished(run: Run, out_dir: pathlib.Path) -> dict | None:
  """The run's summary if it exists; ValueError if the run was made with other flags."""
  path = out_dir / run.name / "summary.json"
  if not path.exists():
    return None
  summary = json.loads(path.read_text())
  config = summary.get("config", {})
  other = {k: (config.get(k), v) for k, v in run.flags.items()
           if k in config and k not in _UNCHECKED and str(config[k]) != str(v)}
  if other:
    flags = ", ".join(f"--{k}={a} not {b}" for k, (a, b) in other.items())
    raise ValueError(f"{path}: made with other flags ({flags}); use another --out_dir")
  return summary


def execute(runs: list[Run], out_dir: pathlib.Path, parallel: int) -> dict[str, str]:
  """Runs what is not finished, `parallel` at a time, each after its needs; name -> 'done', 'cached', 'failed' or
  'blocked'."""
  status = {r.name: "cached" for r in runs if finished(r, out_dir)}
  pending = [r for r in runs if r.name not in status]
  running: dict[str, tuple[subprocess.Popen, object]] = {}
  try:
    while pending or running:
      for name, (proc, log) in list(running.items()):
        if proc.poll() is not None:
          log.close()
          status[name] = "done" if proc.returncode == 0 else "failed"
          print(f"{time.strftime('%H:%M:%S')} {name}: {status[name]}", flush=True)
          del running[name]
      for run in list(pending):
        if any(status.get(n) in ("failed", "blocked") for n in run.needs):
          status[run.name] = "blocked"
          pending.remove(run)
        elif len(running) < parallel and all(status.get(n) in ("done", "cached") for n in run.needs):
          work = out_dir / run.name
          cmd = argv(run, out_dir)
          if work.exists():
            if any((work / d).is_dir() and any((work / d).iterdir()) for d in ("checkpoints", "sft_checkpoints")):
              cmd.append("--resume")
            else:
              shutil.rmtree(work)
          work.parent.mkdir(parents=True, exist_ok=True)
          log = open(out_dir / f"{run.name}.log", "a", encoding="utf-8")  # pylint: disable=consider-using-with
          print(f"{time.strftime('%H:%M:%S')} {run.name}: {' '.join(cmd[1:])}", flush=True)
          running[run.name] = (subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), log)
          pending.remove(run)
      time.sleep(2)
  finally:  # stopped (SIGTERM, Ctrl-C): the runs in flight save their step and exit; the same command resumes them
    for proc, log in running.values():
      proc.terminate()
      proc.wait()
      log.close()
  return status


def run_plan(runs: list[Run], out_dir: pathlib.Path, parallel: int, dry_run: bool) -> dict[str, str] | int:
  """`execute(runs)` as a script's `main` runs it: the runs' status, or an exit status (0: `dry_run`, the commands
  printed; 2: a plan that cannot start, in one line). SIGTERM ends the script with 143 (the runs keep what they
  saved; a rerun skips the finished ones)."""
  if dry_run:
    for run in runs:
      print(" ".join(argv(run, out_dir)[1:]))
    return 0
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
  try:
    return execute(runs, out_dir, parallel)
  except ValueError as err:
    print(err, file=sys.stderr)
    return 2


def unfinished(status: dict[str, str], out_dir: pathlib.Path) -> int:
  """The script's exit status: 1, with a line naming them, when runs failed or were blocked; else 0."""
  bad = [n for n, s in status.items() if s in ("failed", "blocked")]
  if bad:
    print(f"not finished: {', '.join(bad)} (logs in {out_dir})", file=sys.stderr)
  return 1 if bad else 0


def mean_se(values: list[float]) -> tuple[float, float]:
  """Mean and standard error s / √n (s with n − 1; NaN for one value)."""
  n = len(values)
  mean = sum(values) / n
  se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else float("nan")
  return mean, se


def aggregate(summaries: dict[str, dict], seeds: int, tag: str) -> dict:
  """Accuracies in points: the teacher's, the start's, and per method the final per seed with mean ± s.e.; the
  paired difference distill − GRPO on the seeds both have."""
  pts = lambda s, k: 100 * s[k]  # noqa: E731
  result = {"teacher_sft": pts(summaries["teacher_sft"], "final_accuracy") if "teacher_sft" in summaries else None,
            "teacher": pts(summaries["teacher"], "final_accuracy") if "teacher" in summaries else None,
            "start": pts(summaries["sft"], "final_accuracy") if "sft" in summaries else None, "methods": {}}
  for method in ("grpo", "distill"):
    per_seed = {s: pts(summaries[f"{method}/{tag}/seed{s}"], "final_accuracy") for s in range(seeds)
                if f"{method}/{tag}/seed{s}" in summaries}
    result["methods"][method] = {"per_seed": per_seed,
                                 "mean_se": mean_se(list(per_seed.values())) if per_seed else None}
  both = sorted(set(result["methods"]["grpo"]["per_seed"]) & set(result["methods"]["distill"]["per_seed"]))
  diff = {s: result["methods"]["distill"]["per_seed"][s] - result["methods"]["grpo"]["per_seed"][s] for s in both}
  result["difference"] = {"per_seed": diff, "mean_se": mean_se(list(diff.values())) if diff else None}
  return result


def markdown(result: dict, seeds: int) -> str:
  def cell(x):
    return "" if x is None else f"{x:.1f}"

  def ms(m):
    return "" if m is None else f"{m[0]:.1f}" if math.isnan(m[1]) else f"{m[0]:.1f} ± {m[1]:.1f}"

  head = "| | " + " | ".join(f"seed {s}" for s in range(seeds)) + " | mean ± s.e. |\n|---|" + "---|" * (seeds + 1)
  rows = [("GRPO", result["methods"]["grpo"]), ("distill", result["methods"]["distill"]),
          ("distill − GRPO (paired)", result["difference"])]
  lines = [f"teacher: {cell(result['teacher'])}% held-out greedy accuracy (after its SFT: "
           f"{cell(result['teacher_sft'])}%); the student's SFT start: {cell(result['start'])}%", "", head]
  for label, r in rows:
    cells = " | ".join(cell(r["per_seed"].get(s)) for s in range(seeds))
    lines.append(f"| {label} | {cells} | {ms(r['mean_se'])} |")
  return "\n".join(lines) + "\n"


def main(argv_=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out_dir", default="runs/distill", help="where the runs and results go")
  p.add_argument("--seeds", type=int, default=4, help="seeds 0..N-1 of each method")
  p.add_argument("--steps", type=int, default=40, help="RL steps of each student run")
  p.add_argument("--batch_size", type=int, default=16, help="prompts per step")
  p.add_argument("--group_size", type=int, default=8, help="samples per prompt")
  p.add_argument("--learning_rate", type=float, default=1e-4, help="both methods' peak learning rate")
  p.add_argument("--num_test", type=int, default=500, help="held-out problems per evaluation")
  p.add_argument("--teacher_hidden_size", type=int, default=128, help="the teacher's width (the student's: 128)")
  p.add_argument("--teacher_layers", type=int, default=6, help="the teacher's layers (the student's: 4)")
  p.add_argument("--teacher_sft_examples", type=int, default=18000, help="the teacher's SFT demonstrations")
  p.add_argument("--teacher_sft_steps", type=int, default=2000, help="the teacher's SFT steps")
  p.add_argument("--teacher_steps", type=int, default=20, help="the teacher's GRPO steps")
  p.add_argument("--parallel", type=int, default=1, help="runs at once")
  p.add_argument("--dry_run", action="store_true", help="print the commands only")
  args = p.parse_args(argv_)
  for name in ("seeds", "steps", "batch_size", "group_size", "num_test", "teacher_hidden_size", "teacher_layers",
               "teacher_sft_steps", "teacher_steps", "parallel"):
    if getattr(args, name) < 1:
      print(f"--{name}={getattr(args, name)}: must be at least 1", file=sys.stderr)
      return 2
  out_dir = pathlib.Path(args.out_dir)
  runs = plan(args)
  status = run_plan(runs, out_dir, args.parallel, args.dry_run)
  if isinstance(status, int):
    return status
  summaries = {r.name: finished(r, out_dir) for r in runs if status[r.name] in ("done", "cached")}
  result = aggregate(summaries, args.seeds, setting(args))
  table = markdown(result, args.seeds)
  (out_dir / f"results-{setting(args)}.json").write_text(json.dumps({"args": vars(args), "status": status, **result},
                                                                    indent=1))
  (out_dir / f"results-{setting(args)}.md").write_text(table)
  print(table)
  return unfinished(status, out_dir)


if __name__ == "__main__":
  sys.exit(main())
