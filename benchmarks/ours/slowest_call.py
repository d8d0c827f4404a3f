"""The slowest call of a long run of the default trainer: no call after a shape's first may stall to compile.

Each backend runs `--calls` calls of `CriticTrainer(critic).train_step` (the defaults: `jit_compile="auto"`)
on one batch shape in a fresh process, every call waited for, twice: with empty compiler caches (a new
directory for JAX's persistent cache and PyTorch inductor's) and then warm (the same directories again).
Reported per run: the first call (tracing and compiling), the slowest later call and where it was, the
median and 99th percentile of the later calls, the whole run, and the trainer's own record of its
compilations (`CriticTrainer.compilations`).

    python benchmarks/ours/slowest_call.py --json benchmarks/results/results_slowest_call.json
    python benchmarks/ours/slowest_call.py --backend torch --calls 5000 --size nano --batch 128

Times are the wall time of one call on this machine; run it with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

BACKENDS = ("jax", "torch", "tensorflow")
# The compiler caches a cold run starts without (each framework's own variable for its on-disk cache).
CACHE_VARIABLES = ("JAX_COMPILATION_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def child(size, batch, calls, seed=0):
    """In a process on one backend: the record of one run (see the module docstring)."""
    import keras
    import numpy as np

    from benchmarks.ours.train_step import _inputs, _sync
    from multicritic import CriticNetwork, CriticTrainer, get_model_dims

    backend = keras.backend.backend()
    dims = get_model_dims(size)
    data = _inputs(backend, batch, dims["gru_units"], dims["num_z_categoricals"], dims["num_z_classes"], seed=seed)
    keras.utils.set_random_seed(seed)
    trainer = CriticTrainer(CriticNetwork(model_size=size))
    times = []
    start = time.perf_counter()
    for _ in range(calls):
        t = time.perf_counter()
        _sync(backend, trainer.train_step(*data))
        times.append(time.perf_counter() - t)
    total = time.perf_counter() - start
    later = times[1:]
    slowest = int(np.argmax(later)) + 1
    return {
        "backend": backend,
        "size": size,
        "batch": batch,
        "calls": calls,
        "first_call_s": times[0],
        "slowest_later_call_s": later[slowest - 1],
        "slowest_later_call": slowest,
        "median_later_ms": statistics.median(later) * 1e3,
        "p99_later_ms": float(np.percentile(later, 99)) * 1e3,
        "total_s": total,
        "compilations": [
            {"kind": kind, "call": e.call, "form": e.form, "seconds": e.seconds}
            for kind, events in trainer.compilations.items()
            for e in events
        ],
    }


def run(backend, size, batch, calls, caches, state):
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=ROOT)
    env.update({name: os.path.join(caches, name.lower()) for name in CACHE_VARIABLES})
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    args = [sys.executable, os.path.abspath(__file__), "--child", "--size", size, "--batch", str(batch)]
    out = subprocess.run(args + ["--calls", str(calls)], env=env, capture_output=True, text=True, check=True)
    record = json.loads(out.stdout.strip().splitlines()[-1])
    record["caches"] = state
    return record


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="all", help=f"one of {BACKENDS} or all")
    parser.add_argument("--size", default="nano")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.size, args.batch, args.calls)))
        return
    backends = BACKENDS if args.backend == "all" else (args.backend,)
    records = []
    for backend in backends:
        with tempfile.TemporaryDirectory() as caches:
            for state in ("cold", "warm"):
                record = run(backend, args.size, args.batch, args.calls, caches, state)
                records.append(record)
                print(
                    f"{backend} {state}: first {record['first_call_s']:.2f} s, slowest later "
                    f"{record['slowest_later_call_s'] * 1e3:.1f} ms (call {record['slowest_later_call']}), "
                    f"median {record['median_later_ms']:.2f} ms, run {record['total_s']:.1f} s",
                    flush=True,
                )
    if args.json:
        import keras

        result = {
            "command": "python benchmarks/ours/slowest_call.py " + " ".join(argv or sys.argv[1:]),
            "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
            "keras": keras.__version__,
            "records": records,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
