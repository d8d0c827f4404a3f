#!/usr/bin/env bash
# The GPU benchmarks in one command, on a machine WITHOUT network access (a lent accelerator): the machine's own
# PyTorch and JAX (CUDA builds), Keras from wheels carried in the tree (`.whl/`, made beforehand with
# `bash benchmarks/gpu/wheels.sh` where there is network), TensorFlow only if it is installed there.
#
#     bash benchmarks/gpu/run.sh                       # writes benchmarks/results/results_gpu.json
#     OUT=/some/dir bash benchmarks/gpu/run.sh         # writes $OUT/results_gpu.json
#
# What it times (each part under its own time limit, so a slow part cannot take the others' results with it):
# the train step at XS and S, batch 256 / 4096 / 15360, ours (compiled: CUDA graphs; and eager) against the
# native step (eager and torch.compile'd) on PyTorch, ours against native on JAX (and TensorFlow); a K=5
# ensemble against the native vectorised ensemble at 256 and 4096; the forward passes a host calls in its
# loops. About 8 minutes on one H200.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-benchmarks/results}"
parts="$(mktemp -d)"
if ! python3 -c "import keras" 2>/dev/null; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "keras is not installed here and .whl/ holds no wheels: run 'bash benchmarks/gpu/wheels.sh' where pip can download" >&2
    exit 2
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/multicritic-site .whl/*.whl || exit 2
  export PYTHONPATH="/tmp/multicritic-site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" TF_CPP_MIN_LOG_LEVEL=3 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$parts/gpu.txt"
python3 -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__)" | tee -a "$parts/gpu.txt"

part() {  # part NAME SECONDS BACKEND COMMAND...
  local name=$1 limit=$2 backend=$3
  shift 3
  echo "== $name ($backend, at most ${limit}s)"
  KERAS_BACKEND=$backend timeout "$limit" "$@" --json "$parts/$name.json" || echo "== $name: failed or timed out" >&2
}

backends=(torch jax)
python3 -c "import tensorflow" 2>/dev/null && backends+=(tensorflow)
for backend in "${backends[@]}"; do
  part "train_step_$backend" 200 "$backend" python3 benchmarks/ours/train_step.py --backend "$backend" \
    --size XS S --batch 256 4096 15360 --repeats 5 --block-seconds 0.5
  compiled=()
  [ "$backend" = torch ] && compiled=(--jit-compile)  # the step "auto" settles on there
  part "ensemble_$backend" 90 "$backend" python3 benchmarks/ours/ensemble.py --backend "$backend" --size XS \
    --batch 256 4096 --members 5 --impls single ensemble native --repeats 5 --block-seconds 0.5 "${compiled[@]}"
done
part forward_views 60 torch python3 benchmarks/ours/forward_views.py --repeats 5 --block-seconds 0.2
python3 - "$parts" "$out/results_gpu.json" <<'PY'
import json, pathlib, sys
parts, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
merged = {"machine": (parts / "gpu.txt").read_text().strip().splitlines()}
for f in sorted(parts.glob("*.json")):
    merged[f.stem] = json.loads(f.read_text())
target.parent.mkdir(parents=True, exist_ok=True)
target.write_text(json.dumps(merged, indent=1))
print("wrote", target, "with", sorted(k for k in merged if k != "machine"))
PY
