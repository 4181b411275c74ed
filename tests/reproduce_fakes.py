"""A fake runner and a study of three tiny runs, for the tests of experiments.reproduce."""

import sys

from experiments.studies import spec

# A fake runner: writes a curve and a summary whose numbers depend on the seed and a --level flag, counts its
# invocations, and fails with a last log line when --fail is given.
FAKE_RUNNER = r"""
import json, pathlib, sys
args = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "1") for a in sys.argv[1:])
work = pathlib.Path(args["work_dir"]); work.mkdir(parents=True, exist_ok=True)
with open(work.parent / "invocations.txt", "a") as f:
    f.write(f"{args['seed']}\n")
if "fail" in args:
    print("progress 1/2\rstep 2: error: the loss is nan", file=sys.stderr); sys.exit(3)
seed, level = int(args["seed"]), float(args.get("level", 0))
start = 0.1 * seed
if "start_from" in args:
    start = json.loads((pathlib.Path(args["start_from"]) / "summary.json").read_text())["final_accuracy"]
with open(work / "metrics.jsonl", "w") as f:
    for step in (0, 5, 10):
        f.write(json.dumps({"step": step, "eval/accuracy": start + level * step}) + "\n")
    f.write(json.dumps({"step": 10, "eval/accuracy": start + level * 10 + 0.01}) + "\n")  # a resumed step again
summary = {"start_accuracy": start, "final_accuracy": start + level * 10 + 0.01, "num_eval_problems": 8,
           "maj@1": 0.1, "maj@2": 0.2}
if "num_validation" in args:  # a validation accuracy that peaks at --level=0.02
    summary["final_val_accuracy"] = 0.5 - abs(level - 0.02) * 10 + 0.001 * seed
(work / "summary.json").write_text(json.dumps(summary))
"""


def study(fail: bool = False) -> spec.Study:
  """base -> better (starts where base ended; fails with --fail) -> after, three metrics, a maj@k, three plots."""
  fake = (sys.executable, "-c", FAKE_RUNNER)
  runs = (spec.Run("base", {"level": 0.01}, command=fake, label="base method"),
          spec.Run("better", {"level": 0.02, "start_from": "{run:base}", "fail": fail or None}, command=fake),
          spec.Run("after", {"level": 0.0, "start_from": "{run:better}"}, command=fake))
  metrics = (spec.Metric("accuracy", "eval/accuracy", source="curve"),
             spec.Metric("final", "final_accuracy"),
             spec.Metric("gain", "final_accuracy", minus="start_accuracy"),
             spec.Metric("maj@{k}", "maj@{k}", ks=(1, 2), runs=("base",)))
  plots = (spec.Plot("curve.png", (spec.Panel("accuracy"),)),
           spec.Plot("k.png", (spec.Panel("maj@{k}"),), x="k"),
           spec.Plot("bars.png", (spec.Panel(("final", "gain")),), x="run"))
  return spec.Study("tiny", "Two tiny runs", runs, metrics, plots,
                    profiles={"quick": {"experiments.grpo_math": {"shorter": True}}},
                    claims=(spec.Claim("better gains", "better", "gain"),))


def cells(results: dict) -> dict:
  """A results.json's cells by (run, metric, step)."""
  return {(c["run"], c["metric"], c["step"]): c for c in results["cells"]}
