r"""Peak host memory of the two writes that end a run: the train-state checkpoint and the HF export.

  python scripts/bench_save_memory.py                    # Qwen2.5-0.5B shapes, bf16 params and AdamW moments
  python scripts/bench_save_memory.py --size=0.2b        # the same widths, 4 layers
  python scripts/bench_save_memory.py --host_transfer_gb=0  # the checkpoint as orbax saves by default (on a GPU: A/B)

Each write runs in a fresh process: it draws the bf16 params (and, for the checkpoint, AdamW's moments, bf16 like
the params: the runner's train state), resets the kernel's peak-RSS counter (/proc/self/clear_refs), writes, and
reports the peak over the RSS before it, in GiB and as a multiple of the bytes written. On a CPU the arrays already
live in host memory, so the figures are the writers' own copies; on a GPU they include the copies from the device.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

SIZES = {"0.5b": {}, "0.2b": {"num_hidden_layers": 4}}  # Qwen2.5-0.5B's sizes (random weights), or with 4 layers
PARTS = ("checkpoint", "export")


def _status() -> dict:
  out = {}
  for line in pathlib.Path("/proc/self/status").read_text().splitlines():
    key, value = line.split(":", 1)
    if key in ("VmRSS", "VmHWM"):
      out[key] = int(value.split()[0]) * 1024
  return out


def measure(part: str, size: str, out: pathlib.Path, host_transfer_gb: float | None) -> dict:
  """This process: the write's peak RSS over the RSS before it (bytes), and the bytes it writes."""
  import gc  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  from experiments.runner import policy as policy_lib  # pylint: disable=import-outside-toplevel
  from grpo_jax import models, training  # pylint: disable=import-outside-toplevel
  from grpo_jax.models import presets  # pylint: disable=import-outside-toplevel
  config = models.tiny_config(**{**presets.sizes("qwen2.5-0.5b"), **SIZES[size]}, param_dtype="bfloat16",
                              dtype="bfloat16")
  params = models.init_params(config, jax.random.key(0))
  weights = sum(x.nbytes for x in jax.tree.leaves(params))
  if part == "checkpoint":
    tree = {"train": training.init_train_state(params, optax.adamw(1e-6))}
    written = sum(x.nbytes for x in jax.tree.leaves(tree))
    ckpt = training.Checkpointer(out / "checkpoints", host_transfer_gb=host_transfer_gb)
    write = lambda: ckpt.save(1, tree, {"step": 1})
  else:
    tree, written = params, weights
    write = lambda: policy_lib.export(params, config, out, out / "final_policy")
  jax.block_until_ready(jax.tree.leaves(tree))
  gc.collect()
  before = _status()["VmRSS"]
  pathlib.Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
  write()
  after = _status()
  return {"part": part, "size": size, "backend": jax.default_backend(), "weight_bytes": weights,
          "written_bytes": written, "rss_before": before, "peak_over_before": after["VmHWM"] - before,
          "rss_after_over_before": after["VmRSS"] - before}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--size", choices=sorted(SIZES), default="0.5b")
  parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated: " + ", ".join(PARTS))
  parser.add_argument("--host_transfer_gb", type=float, default=1.0,
                      help="the checkpoint's device -> host batch (GB); 0: orbax's default, the whole state at once")
  parser.add_argument("--child", choices=PARTS, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    with tempfile.TemporaryDirectory(prefix="bench_save_memory_") as tmp:
      print(json.dumps(measure(args.child, args.size, pathlib.Path(tmp), args.host_transfer_gb or None)))
    return
  rows = []
  for part in args.parts.split(","):
    if part not in PARTS:
      sys.exit(f"bench_save_memory: error: unknown part {part!r} (one of {', '.join(PARTS)})")
    done = subprocess.run([sys.executable, __file__, f"--size={args.size}", f"--child={part}",
                           f"--host_transfer_gb={args.host_transfer_gb}"], check=True, stdout=subprocess.PIPE, text=True)
    rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
  gib = 2**30
  print(f"{args.size} shapes, bf16 weights {rows[0]['weight_bytes'] / gib:.2f} GiB, backend {rows[0]['backend']}, "
        f"checkpoint batches {args.host_transfer_gb or 'unbounded'} GB")
  print("| write | bytes written | RSS before | peak over it | x the bytes written | left after |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['part']} | {r['written_bytes'] / gib:.2f} GiB | {r['rss_before'] / gib:.2f} GiB | "
          f"{r['peak_over_before'] / gib:.2f} GiB | {r['peak_over_before'] / r['written_bytes']:.2f} | "
          f"{r['rss_after_over_before'] / gib:.2f} GiB |")


if __name__ == "__main__":
  main()
