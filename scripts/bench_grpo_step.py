r"""Time per GRPO step of the main job, split into sampling / scoring / update.

  python scripts/bench_grpo_step.py                       # the embedded default's GRPO stage
  python scripts/bench_grpo_step.py --init_checkpoint=runs/grpo_math/sft_policy --steps=30

Runs `experiments.grpo_math` for `--steps` GRPO steps (no evaluation) in a temporary work dir and reports
the median of each phase over the steps after the first (which includes compilation), as seconds and as a
fraction of the whole step. Extra flags pass through to the runner. The run goes through the runner's own
`main` (`cli.main_for`), so it sets up the process as `python -m experiments.grpo_math` does: the CPU as one
device per core for the sampler, the compilation cache, the host-memory and garbage-collector settings.
"""

import json
import pathlib
import sys
import tempfile

from absl import flags
import numpy as np

from experiments import cli


def main():
  work_dir = tempfile.mkdtemp(prefix="bench_grpo_step_")
  args = [a for a in sys.argv[1:]]
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
  print(f"\nGRPO step, median of {len(train)} steps (after the first): {total:.3f} s, {tokens:,.0f} generated tokens/s")
  print("| phase | seconds | fraction of the step |")
  print("|---|---|---|")
  for p in phases:
    print(f"| {p.removeprefix('time_')} | {medians[p]:.3f} | {medians[p] / total:.2f} |")


if __name__ == "__main__":
  main()
