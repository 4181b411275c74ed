r"""Time per GRPO step of the main job, split into sampling / scoring / update.

  python scripts/bench_grpo_step.py                       # the embedded default's GRPO stage
  python scripts/bench_grpo_step.py --init_checkpoint=runs/grpo_math/sft_policy --steps=30

Runs `experiments.grpo_math` for `--steps` GRPO steps (no evaluation) in a temporary work dir and reports
the median of each phase over the steps after the first (which includes compilation), as seconds and as a
fraction of the whole step, and the process's peak resident host memory. `--json_out=FILE` also writes the median
of every numeric train metric there; `--work_dir=DIR` keeps the run's files (a `--profile_steps` trace). Extra flags pass through to the runner. The run goes through the runner's own
`main` (`cli.main_for`), so it sets up the process as `python -m experiments.grpo_math` does: the CPU as one
device per core for the sampler, the compilation cache, the host-memory and garbage-collector settings.
"""

import json
import pathlib
import resource
import sys
import tempfile

from absl import flags
import numpy as np

from experiments import cli


def main():
  json_out = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--json_out=")), None)
  args = [a for a in sys.argv[1:] if not a.startswith("--json_out=")]
  work_dir = next((a.split("=", 1)[1] for a in args if a.startswith("--work_dir=")), None) or \
      tempfile.mkdtemp(prefix="bench_grpo_step_")
  defaults = ["--steps=20", "--sft_steps=0", "--num_test=1", "--tensorboard=false"]
  given = {a.split("=")[0] for a in args}
  argv = ["bench", f"--work_dir={work_dir}", "--eval_every=0", "--save_every=0"]
  argv += [d for d in defaults if d.split("=")[0] not in given] + args
  flags.FLAGS(argv)
  cli.main_for("bench_grpo_step")(argv[:1])
  records = [json.loads(l) for l in (pathlib.Path(work_dir) / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if "train/time_update" in r][1:]
  phases = ["time_sampling", "time_scoring", "time_update"]
  medians = {p: float(np.median([r[f"train/{p}"] for r in train])) for p in phases}
  total = sum(medians.values())
  tokens = float(np.median([r["train/tokens_per_s"] for r in train]))
  peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
  print(f"\nGRPO step, median of {len(train)} steps (after the first): {total:.3f} s, {tokens:,.0f} generated tokens/s")
  print("| phase | seconds | fraction of the step |")
  print("|---|---|---|")
  for p in phases:
    print(f"| {p.removeprefix('time_')} | {medians[p]:.3f} | {medians[p] / total:.2f} |")
  print(f"peak host RSS {peak_rss / 2**30:.2f} GiB")
  if json_out:  # every numeric train/ metric's median, and the peak RSS: for scripts/gpu_check.py
    numeric = {k for r in train for k, v in r.items() if k.startswith("train/") and isinstance(v, (int, float))}
    out = {k: float(np.median([r[k] for r in train if k in r])) for k in sorted(numeric)}
    out.update(steps=len(train), step_s=total, peak_rss_bytes=peak_rss, work_dir=work_dir)
    pathlib.Path(json_out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
  main()
