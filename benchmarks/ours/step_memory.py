"""Peak memory of one critic train step: multicritic's `CriticTrainer.train_step` against the native step.

Each implementation runs in a fresh process (Linux): it builds its step and the inputs, takes two warm-up
steps (compiling where the backend compiles), hands freed memory back to the kernel (`malloc_trim`),
resets the process's peak-RSS counter (`/proc/self/clear_refs`), then takes three steps. Its step memory
is the peak RSS over those steps minus the RSS before them: the transient memory of a step (activations,
gradients, temporaries). TensorFlow keeps freed memory where `malloc_trim` cannot reach it (its RSS
peaks were noise: a native step at batch 15360 "using" 3 MiB), so there the measure is its own
allocator's: TensorFlow's BFC CPU allocator (`TF_CPU_ALLOCATOR_USE_BFC`), peak minus current bytes.

    python benchmarks/ours/step_memory.py --backend all --batch 256 4096 15360 --json out.json
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, ROOT)

from benchmarks import options_for  # noqa: E402
from benchmarks.ours.train_step import _inputs, _sync, dispatch  # noqa: E402


def _kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(backend, impl, size, batch):
    """Step memory of `impl` ("multicritic" or "native") in this process, in MiB."""
    import keras

    from multicritic import CriticNetwork, CriticTrainer, get_model_dims

    dims = get_model_dims(size)
    gru, cats, classes = dims["gru_units"], dims["num_z_categoricals"], dims["num_z_classes"]
    data = _inputs(backend, batch, gru, cats, classes, seed=batch)
    keras.utils.set_random_seed(0)
    if impl == "multicritic":
        step = CriticTrainer(CriticNetwork(model_size=size)).train_step
    else:
        native = __import__(f"benchmarks.native.native_{backend}", fromlist=["make_step"])
        options = options_for(native, batch)
        step = native.make_step(gru + cats * classes, dims["dense_hidden_units"], dims["num_dense_layers"], **options)
    for _ in range(2):
        _sync(backend, step(*data))
    if backend == "tensorflow":  # its own allocator's statistics (the BFC allocator, see run_backend)
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        for _ in range(3):
            _sync(backend, step(*data))
        return (tf.config.experimental.get_memory_info("CPU:0")["peak"] - before) / 2**20
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _kib("VmRSS")
    for _ in range(3):
        _sync(backend, step(*data))
    return (_kib("VmHWM") - before) / 1024


def run_backend(backend, size, batches):
    records = []
    for batch in batches:
        for impl in ("multicritic", "native"):
            code = (
                f"import sys; sys.path.insert(0, {ROOT!r}); "
                "from benchmarks.ours.step_memory import measure; "
                f"print(measure({backend!r}, {impl!r}, {size!r}, {batch}))"
            )
            # TensorFlow keeps freed CPU memory out of reach of `malloc_trim`; its BFC allocator counts a peak.
            env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", TF_CPU_ALLOCATOR_USE_BFC="true")
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(out.stderr[-2000:], file=sys.stderr)
                raise SystemExit(f"step_memory failed: {backend} {impl} {batch}")
            mib = float(out.stdout.strip().splitlines()[-1])
            records.append({"backend": backend, "impl": impl, "size": size, "batch": batch, "step_mib": mib})
    return records


def table(records):
    rows = {}
    for r in records:
        rows.setdefault((r["backend"], r["size"], r["batch"]), {})[r["impl"]] = r["step_mib"]
    lines = [
        "| backend | size | batch | multicritic MiB | native MiB | ratio (ours / native) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (backend, size, batch), pair in sorted(rows.items()):
        ours, theirs = pair["multicritic"], pair["native"]
        lines.append(f"| {backend} | {size} | {batch} | {ours:.1f} | {theirs:.1f} | {ours / max(theirs, 1e-9):.2f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "all"))
    parser.add_argument("--size", default="XS")
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 4096, 15360])
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    child = ["--size", args.size, "--batch", *map(str, args.batch)]
    dispatch(__file__, args, child, lambda: run_backend(args.backend, args.size, args.batch), table)


if __name__ == "__main__":
    main()
