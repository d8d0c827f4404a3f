#!/usr/bin/env bash
# The GPU benchmarks in one command, on a machine WITHOUT network access (a lent accelerator): the machine's own
# PyTorch and JAX (CUDA builds), Keras from wheels carried in the tree (`.whl/`, made beforehand with
# `bash benchmarks/gpu/wheels.sh` where there is network), TensorFlow only if it is installed there.
#
#     bash benchmarks/gpu/run.sh                       # writes benchmarks/results/results_gpu.json and gpu_log.txt
#     OUT=/some/dir BUDGET=540 bash benchmarks/gpu/run.sh
#
# What it runs, most wanted first, each part under its own time limit and all of them inside BUDGET seconds
# (default 480: the 8 minutes of issue 52), so that a slow part cannot take the others' results with it:
# the tests that need a GPU (PyTorch's compiled step and replays against eager; every native baseline, the
# hand-captured CUDA graph included, against CriticTrainer's numbers); the per-kernel launch cost (eager and
# inside a CUDA graph); the train step, ours (`multicritic`, and `multicritic_core`: `metrics="core"`) against
# the fastest native steps of its framework (PyTorch: eager, torch.compile, reduce-overhead, the whole step
# captured by hand; JAX: jit with donated state), XS and S, batch 256 / 4096 / 15360, float32 and bfloat16,
# one process per case, at least 200 steps a block, 5 alternating blocks, medians and min-max, each step's
# kernels and GPU busy time from the profiler beside its time; the forward views; a K=5 ensemble against the
# native vectorised one; TensorFlow where it is installed. The merged JSON is rewritten after every part.
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

part tests_torch_cuda 150 torch python3 -m pytest -q -p no:cacheprovider --durations=6 \
  tests/backend/test_torch_step.py tests/backend/test_torch.py tests/backend/test_torch_replay.py \
  tests/benchmarks/test_native_baselines.py
part launch_cost 20 torch python3 -c "
import json, sys
from benchmarks.device_profile import launch_costs
json.dump(launch_costs(), open(sys.argv[-1], 'w'))
print(open(sys.argv[-1]).read())"
step() {  # step BACKEND SIZE PRECISION SECONDS BATCH... (one process per case; PyTorch: per batch)
  local backend=$1 size=$2 precision=$3 limit=$4
  shift 4
  local impls=(multicritic multicritic_core native)
  [[ $backend == torch ]] && impls=(multicritic multicritic_core native native_compiled native_cuda_graph)
  [[ $backend == torch && $size == XS && $1 == 256 ]] && impls+=(native_cudagraphs)
  [[ $backend == tensorflow ]] && impls=(multicritic multicritic_core native native_xla)
  part "train_step_${backend}_${size}_${precision}_$1" "$limit" "$backend" python3 benchmarks/ours/train_step.py \
    --backend "$backend" --size "$size" --batch "$@" --precision "$precision" --repeats 5 --block-seconds 0.2 \
    --min-block-steps 200 --device-profile --impls "${impls[@]}"
}
step torch XS float32 80 256
step jax XS float32 70 256 4096 15360
part forward_views 50 torch python3 benchmarks/ours/forward_views.py --repeats 5 --block-seconds 0.1
step torch XS float32 60 4096
step torch XS float32 50 15360
step jax XS bfloat16 60 256 4096 15360
step torch XS bfloat16 60 256
part ensemble_jax 45 jax python3 benchmarks/ours/ensemble.py --backend jax --size XS \
  --batch 256 4096 --members 5 --impls single ensemble native --repeats 5 --block-seconds 0.4
part ensemble_torch 50 torch python3 benchmarks/ours/ensemble.py --backend torch --size XS \
  --batch 256 4096 --members 5 --impls single ensemble native --repeats 5 --block-seconds 0.4 --jit-compile
step jax S float32 50 256 4096 15360
step torch S float32 50 4096
step torch XS bfloat16 50 4096
if python3 -c "import tensorflow" 2>/dev/null; then
  step tensorflow XS float32 80 256 4096 15360
fi
part step_kernels_jax 40 jax python3 benchmarks/ours/step_kernels.py --backend jax --batch 256 4096 --by-source
echo "wrote $out/results_gpu.json and $log" | tee -a "$log"
