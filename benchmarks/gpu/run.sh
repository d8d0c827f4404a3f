#!/usr/bin/env bash
# The GPU benchmarks in one command, on a machine WITHOUT network access (a lent accelerator): the machine's own
# PyTorch and JAX (CUDA builds), Keras from wheels carried in the tree (`.whl/`, made beforehand with
# `bash benchmarks/gpu/wheels.sh` where there is network), TensorFlow only if it is installed there.
#
#     bash benchmarks/gpu/run.sh                       # writes benchmarks/results/results_gpu.json and gpu_log.txt
#     OUT=/some/dir BUDGET=540 bash benchmarks/gpu/run.sh
#
# What it runs, most wanted first, each part under its own time limit and all of them inside BUDGET seconds
# (default 540), so that a slow part cannot take the others' results with it: the PyTorch compiled-step tests
# on the GPU (CUDA-graph replay against eager); the forward passes a host calls in its loops; the kernels of
# JAX's step and the native one (XLA's dump; each kernel's time from jax.profiler, summed by source op); the
# train step at XS, batch 256 / 4096 / 15360, ours (compiled: CUDA graphs; and eager) against the native step
# (eager, torch.compile'd, CUDA graphs), one process per batch, and JAX's; a K=5 ensemble against the native
# vectorised ensemble at 256 and 4096; size S. The merged JSON is rewritten after every part.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-benchmarks/results}"
deadline=$((SECONDS + ${BUDGET:-540}))
parts="$(mktemp -d)"
mkdir -p "$out"
log="$out/gpu_log.txt"
: >"$log"
if ! python3 -c "import keras" 2>/dev/null; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "keras is not installed here and .whl/ holds no wheels: run 'bash benchmarks/gpu/wheels.sh' where pip can download" >&2
    exit 2
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/multicritic-site .whl/*.whl || exit 2
  export PYTHONPATH="/tmp/multicritic-site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" TF_CPP_MIN_LOG_LEVEL=3 PYTHONUNBUFFERED=1 MULTICRITIC_BENCH_KEEP_GOING=1
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  KERAS_BACKEND=torch python3 -c "import torch, jax, keras; print('torch', torch.__version__, 'jax', jax.__version__, 'keras', keras.__version__, 'cuda devices', torch.cuda.device_count())"
} 2>&1 | tee "$parts/gpu.txt" | tee -a "$log"

merge() {
  python3 - "$parts" "$out/results_gpu.json" <<'PY'
import json, pathlib, sys
parts, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
merged = {"machine": (parts / "gpu.txt").read_text().strip().splitlines()}
for f in sorted(parts.glob("*.json")):
    try:
        merged[f.stem] = json.loads(f.read_text())
    except ValueError:
        pass
target.write_text(json.dumps(merged, indent=1))
PY
}

part() {  # part NAME SECONDS BACKEND COMMAND... (COMMAND gets `--json PATH` unless NAME starts with "tests")
  local name=$1 limit=$2 backend=$3 left=$((deadline - SECONDS - 5))
  shift 3
  ((left < limit)) && limit=$left
  if ((limit < 15)); then
    echo "== $name: skipped, ${left}s left of the budget" | tee -a "$log"
    return
  fi
  local json=(--json "$parts/$name.json")
  [[ $name == tests* ]] && json=()
  echo "== $name ($backend, at most ${limit}s)" | tee -a "$log"
  local start=$SECONDS
  KERAS_BACKEND=$backend timeout -k 5 "$limit" "$@" "${json[@]}" 2>&1 | tee -a "$log" | tail -15
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - start))s" | tee -a "$log"
  merge
}

part tests_torch_cuda 120 torch python3 -m pytest -q -p no:cacheprovider --durations=6 \
  tests/backend/test_torch_step.py tests/backend/test_torch.py tests/backend/test_torch_replay.py
torch_step() {  # torch_step SIZE BATCH SECONDS
  local impls=(multicritic multicritic_eager native native_compiled)
  (($2 < 15360)) && impls+=(native_cudagraphs)
  part "train_step_torch_$1_$2" "$3" torch python3 benchmarks/ours/train_step.py --backend torch \
    --size "$1" --batch "$2" --repeats 5 --block-seconds 0.4 --impls "${impls[@]}"
}
part forward_views 70 torch python3 benchmarks/ours/forward_views.py --repeats 5 --block-seconds 0.1
part step_kernels_jax 60 jax python3 benchmarks/ours/step_kernels.py --backend jax --batch 256 4096 \
  --by-source --profile
torch_step XS 256 70
part train_step_jax 80 jax python3 benchmarks/ours/train_step.py --backend jax \
  --size XS --batch 256 4096 15360 --repeats 5 --block-seconds 0.3
part ensemble_jax 60 jax python3 benchmarks/ours/ensemble.py --backend jax --size XS \
  --batch 256 4096 --members 5 --impls single ensemble native --repeats 5 --block-seconds 0.4
torch_step XS 4096 65
torch_step XS 15360 55
part ensemble_torch 60 torch python3 benchmarks/ours/ensemble.py --backend torch --size XS \
  --batch 256 4096 --members 5 --impls single ensemble native --repeats 5 --block-seconds 0.4 --jit-compile
if python3 -c "import tensorflow" 2>/dev/null; then
  part train_step_tensorflow 90 tensorflow python3 benchmarks/ours/train_step.py --backend tensorflow \
    --size XS --batch 256 4096 15360 --repeats 5 --block-seconds 0.4
fi
torch_step S 4096 60
part train_step_jax_S 60 jax python3 benchmarks/ours/train_step.py --backend jax \
  --size S --batch 256 4096 15360 --repeats 5 --block-seconds 0.3
echo "wrote $out/results_gpu.json and $log" | tee -a "$log"
