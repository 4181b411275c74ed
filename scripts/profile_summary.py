r"""Per-program summary of a `jax.profiler` trace: runs, span and op time per run, and the op kinds of that time.

  python -m experiments.grpo_math --profile_steps=5:8 --steps=8 --work_dir=/tmp/profiled   # prints it at step 8
  python scripts/profile_summary.py /tmp/profiled/profile --steps=4                       # the table again
  python scripts/profile_summary.py /path/to/any/jax_profiler_log_dir --min_share=0

Reads the newest `*.trace.json.gz` under the directory (`experiments/runner/profiling.py` says what each column
counts). A missing or unreadable trace is one line on stderr and exit status 1.
"""

import argparse
import sys

from experiments.runner import profiling


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("trace_dir", help="a jax.profiler log directory (or one *.trace.json.gz)")
  parser.add_argument("--steps", type=int, default=0, help="steps the trace holds: adds op time per step (0: off)")
  parser.add_argument("--top", type=int, default=4, help="op kinds shown per program")
  parser.add_argument("--min_share", type=float, default=0.001,
                      help="programs below this share of the op time are summed in one line")
  args = parser.parse_args()
  try:
    programs = profiling.summarize(args.trace_dir)
  except (OSError, ValueError) as err:
    sys.exit(f"profile_summary: error: {err}")
  print(profiling.format_table(programs, steps=args.steps or None, top=args.top, min_share=args.min_share))


if __name__ == "__main__":
  main()
