#!/usr/bin/env bash
# The train-step sweep (batch 64..16384 at XS, sizes nano..L at batch 1024, multicritic next to the native
# steps) on a machine with an NVIDIA GPU, one backend per virtualenv (their CUDA wheels pin different
# libraries). Writes benchmarks/results_gpu_<backend>.json and prints each table.
#
#     bash benchmarks/gpu.sh                 # all three backends
#     bash benchmarks/gpu.sh torch jax       # some of them
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$#" -gt 0 ]; then backends=("$@"); else backends=(jax torch tensorflow); fi
declare -A wheels=(
  [jax]="jax[cuda12]"
  [torch]="torch==2.13.0"
  [tensorflow]="tensorflow[and-cuda]"
)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
for backend in "${backends[@]}"; do
  venv="${VENV_ROOT:-/tmp}/multicritic-gpu-$backend"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q -e . "${wheels[$backend]}"
  KERAS_BACKEND=$backend TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/python" benchmarks/train_step.py \
    --backend "$backend" --sweep --repeats "${REPEATS:-5}" --json "benchmarks/results_gpu_$backend.json"
done
