#!/usr/bin/env bash
# Issue #41's checks on one GPU (H100 or H200), with what the device image has (jax CUDA,
# flax, optax, orbax, transformers, torch; no tensorboardX: the runs pass --tensorboard=false).
#
#   OUT=/tmp/gpu_check bash scripts/gpu_check.sh            # from the repository root
#   OUT=/tmp/gpu_check bash scripts/gpu_check.sh --smoke    # tiny shapes: the script itself, on a CPU
#
#   PARTS="roofline grpo fixture default variants" OUT=... bash scripts/gpu_check.sh   # some parts (default: all)
#
# On an H100 the parts took: roofline 15 s, init 10 s, grpo 165 s, fixture 35 s, sampler 70 s, the default run
# 55-140 s (cold), variants 85-100 s each: all of them overrun a 540-s lease command, so name what is needed.
#
# Writes under $OUT (at most 8 files come back from a lease): gpu_check.md (the table, also printed), gpu_check.log (every part's output and the
# tail of `python -m experiments.grpo_math`), <part>.json for each part, trace.json.gz (the profile of the 0.5B
# GRPO step's last step) and trace_small.json.gz (a tiny step's profile: tests/data's fixture). Each part has its own
# time limit; one that fails or runs out is a line in the table and the others still run.
set -u
OUT=${OUT:-/tmp/gpu_check}
SMOKE=${1:-}
# Time limits x SCALE (a CPU's smoke run compiles the runner's programs slowly: 5x there by default).
if [ -n "$SMOKE" ]; then SCALE=${SCALE:-5}; else SCALE=${SCALE:-1}; fi
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
LOG="$OUT/gpu_check.log"
: > "$LOG"
FAILED=""

PARTS=${PARTS:-roofline init grpo sampler engine layout default variants fixture}
wanted() { case " $PARTS " in *" $1 "*) return 0;; *) return 1;; esac; }

part() {  # part NAME SECONDS [extra env]
  local name=$1 limit=$2
  shift 2
  wanted "$name" || return 0
  echo "== $name ($(date -u +%T))" >> "$LOG"
  if ! env "$@" timeout -k 10 $(( limit * SCALE )) "$PY" scripts/gpu_check.py "$name" --out="$OUT" $SMOKE >> "$LOG" 2>&1; then
    FAILED="$FAILED $name"
  fi
}

"$PY" -c "import jax; print('devices:', jax.devices())" >> "$LOG" 2>&1
part roofline 45
part init 90
# The grpo and variants parts' own JAX (the checkpoint, shapes) on the CPU: their child runs get the whole GPU.
# The grpo part right after the quick ones: its profile and RSS timeline are what a lease most needs to bring back.
part grpo 240 JAX_PLATFORMS=cpu
# A real trace of this backend at tiny shapes, for tests/data (the grpo part's trace.json.gz is tens of MB).
part fixture 60 JAX_PLATFORMS=cpu
# JAX and torch share the GPU in this part: JAX takes half of its memory, not its default 75%.
part sampler 120 XLA_PYTHON_CLIENT_MEM_FRACTION=0.45
# The rollout engine beside the static sampler at the 0.5B step's shapes, equal and long-tail lengths (#52).
part engine 150
# π_ref scoring and the update, padded and in length buckets, at the 0.5B step's shapes (#53).
part layout 150
default_run() {
echo "== default run ($(date -u +%T))" >> "$LOG"
if [ -n "$SMOKE" ]; then DEFAULT_FLAGS="--steps=2 --sft_steps=2 --num_test=4 --eval_every=0"; else DEFAULT_FLAGS=""; fi
START=$(date +%s)
timeout -k 10 $(( 200 * SCALE )) "$PY" -m experiments.grpo_math --tensorboard=false --work_dir=/tmp/gpu_check_scratch/default \
    $DEFAULT_FLAGS > /tmp/gpu_check_default.log 2>&1
STATUS=$?
DEFAULT_RESULT="exit $STATUS after $(( $(date +%s) - START )) s; $(grep -a -E '^greedy accuracy|^peak host' /tmp/gpu_check_default.log | sed 's/  */ /g' | paste -sd ';')"
tail -n 15 /tmp/gpu_check_default.log >> "$LOG"
echo "$DEFAULT_RESULT" >> "$LOG"
[ $STATUS -eq 0 ] || FAILED="$FAILED default_run"
echo "| default run (python -m experiments.grpo_math) | $DEFAULT_RESULT | - |" > "$OUT/default_run.md"
}
wanted default && default_run
# Last, so that it is what a short lease cuts: the grpo part's step once more per variant, 100 s each at most.
part variants 160 JAX_PLATFORMS=cpu
"$PY" scripts/gpu_check.py table --out="$OUT" $SMOKE >> "$LOG" 2>&1
[ -f "$OUT/default_run.md" ] && cat "$OUT/default_run.md" >> "$OUT/gpu_check.md" && rm "$OUT/default_run.md"
[ -z "$FAILED" ] || echo "failed or out of time:$FAILED (see gpu_check.log)" >> "$OUT/gpu_check.md"
cat "$OUT/gpu_check.md"
