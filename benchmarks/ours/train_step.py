"""Times multicritic's compiled critic train step against a hand-written native step.

For one backend (or `--backend all`: one subprocess per installed backend)
and each batch size: warm both up, then alternate timed blocks of each
(A/B, B/A, ...) and report medians; also measure the machine's float32
matmul peak in the same process and the step's FLOP utilisation.

    python benchmarks/ours/train_step.py --backend all --size XS --batch 256 4096 15360 --json out.json
    python benchmarks/ours/train_step.py --backend all --sweep --json sweep.json   # batch 64..16384, nano..L

The step: fast + EMA forward, two-hot critic loss (EMA regulariser), backward,
global-norm clip (100), Adam (lr 3e-5, eps 1e-5), EMA update. Both
implementations get the same backend tensors as input.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, ROOT)

from benchmarks import KEEP_GOING, options_for  # noqa: E402

BACKENDS = ("tensorflow", "torch", "jax")


def step_flops(in_dim, units, layers, buckets, batch):
    """Matmul FLOPs of one step: fast and EMA forward, weight grads, input grads
    (none for the network input). Elementwise work is not counted."""
    weights = in_dim * units + (layers - 1) * units * units + units * buckets
    forward = 2 * batch * weights
    input_grads = 2 * batch * (weights - in_dim * units)
    return 3 * forward + input_grads


def _sync(backend, metrics):
    """Waits for the step(s) behind `metrics` (a metrics dict, or a list of them)."""
    for m in metrics if isinstance(metrics, list) else [metrics]:
        value = m["total"]
        if backend == "jax":
            value.block_until_ready()
        elif backend == "tensorflow":
            value.numpy()
        else:
            value.item()


def _matmul_peak(backend, trials=5):
    """Best float32 GFLOP/s over a few matmul shapes (the critic's and a square one)."""
    import numpy as np

    shapes = [(4096, 1280, 256), (2048, 2048, 2048)]
    best = 0.0
    for m, k, n in shapes:
        a = np.random.default_rng(0).random((m, k), dtype=np.float32)
        b = np.random.default_rng(1).random((k, n), dtype=np.float32)
        if backend == "jax":
            import jax

            f = jax.jit(lambda x, y: x @ y)
            a, b = jax.device_put(a), jax.device_put(b)
            run = lambda: f(a, b).block_until_ready()  # noqa: E731
        elif backend == "torch":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
            a, b = torch.from_numpy(a).to(device), torch.from_numpy(b).to(device)
            sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
            run = lambda: (torch.mm(a, b), sync())  # noqa: E731
        else:
            import tensorflow as tf

            a, b = tf.constant(a), tf.constant(b)
            f = tf.function(lambda x, y: tf.matmul(x, y))
            run = lambda: f(a, b).numpy()  # noqa: E731
        run()
        for _ in range(trials):
            start = time.perf_counter()
            reps = 0
            while time.perf_counter() - start < 0.2:
                run()
                reps += 1
            best = max(best, 2 * m * k * n * reps / (time.perf_counter() - start) / 1e9)
    return best


def _inputs(backend, batch, gru, cats, classes, seed):
    import keras
    import numpy as np

    rng = np.random.default_rng(seed)
    h = np.tanh(rng.normal(size=(batch, gru))).astype(np.float32)
    z = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, size=(batch, cats))]
    targets = (rng.normal(size=batch) * 100).astype(np.float32)
    weights = rng.uniform(0.5, 1.0, size=batch).astype(np.float32)
    return tuple(keras.ops.convert_to_tensor(x) for x in (h, z, targets, weights))


def _time_block(backend, step, data, count):
    # Host time between two syncs with the device (`block_until_ready`, `.item()`): the device's time for
    # `count` queued steps when the device is the slower (a GPU), the whole cost otherwise.
    start = time.perf_counter()
    for _ in range(count):
        metrics = step(*data)
    _sync(backend, metrics)
    return (time.perf_counter() - start) / count


def host_seconds(backend, step, data, calls=11):
    """Median seconds until a call returns, the device idle before each: the host's share of a step (all of
    it when the step runs synchronously; on an accelerator, a step slower than this is bound by the device)."""
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        metrics = step(*data)
        seconds.append(time.perf_counter() - start)
        _sync(backend, metrics)
    return statistics.median(seconds)


def time_side_by_side(backend, impls, data, repeats, block_seconds, first_call=False, min_steps=1):
    """Seconds per step of each implementation, `repeats` blocks each, in alternating order (A B .., .. B A).

    Each is warmed up (compiled) first; every block runs the same number of
    steps, sized so that the slowest implementation's block lasts about
    `block_seconds`, and at least `min_steps` steps. Returns `({name: [seconds per step, ...]}, steps per block)`,
    and with `first_call` also `{name: seconds of the first call}` (tracing and compilation included).
    """
    per_step, first = {}, {}
    for name, step in list(impls.items()):  # warm-up: compile, then estimate a block size
        try:
            first[name] = _time_block(backend, step, data, 1)
            _time_block(backend, step, data, 2)
            per_step[name] = _time_block(backend, step, data, 2)
            print(
                f"{name}: first call {first[name]:.1f} s, then {per_step[name] * 1e3:.2f} ms a step",
                file=sys.stderr,
                flush=True,
            )
        except Exception:
            if not KEEP_GOING:
                raise
            traceback.print_exc()
            print(f"{name}: failed in its warm-up, left out (MULTICRITIC_BENCH_KEEP_GOING)", file=sys.stderr)
            impls = {k: v for k, v in impls.items() if k != name}
    count = max(min_steps, int(block_seconds / max(per_step.values())))
    times = {name: [] for name in impls}
    for r in range(repeats):
        order = list(impls) if r % 2 == 0 else list(impls)[::-1]
        for name in order:
            times[name].append(_time_block(backend, impls[name], data, count))
    return (times, count, first) if first_call else (times, count)


# `--sweep`: step time against the batch (at XS) and against the model size (at batch 1024).
SWEEP_BATCHES = (64, 256, 1024, 4096, 16384)
SWEEP_SIZES = ("nano", "mini", "XS", "S", "M", "L")


def cases(sizes, batches, sweep):
    """The (size, batch) pairs to time: every size with every batch, or the sweep's."""
    if sweep:
        return [("XS", b) for b in SWEEP_BATCHES] + [(s, 1024) for s in SWEEP_SIZES if s != "XS"]
    return [(s, b) for s in sizes for b in batches]


# The implementations timed per backend: multicritic's compiled step (`jit_compile=True`: PyTorch's compiled
# whole, TensorFlow's XLA; JAX: jitted; what "auto" switches to on an accelerator) and its other mode (the eager /
# plain-graph step "auto" keeps on a CPU), next to the native step eager and compiled as a good engineer
# of that framework would write it.
IMPLS = {
    "torch": (
        "multicritic",
        "multicritic_core",
        "multicritic_eager",
        "native",
        "native_compiled",
        "native_cudagraphs",
        "native_cuda_graph",
    ),
    "tensorflow": ("multicritic", "multicritic_core", "multicritic_graph", "native", "native_xla"),
    "jax": ("multicritic", "multicritic_core", "native"),
}

# Timed only when `--impls` names them: the native step under CUDA graphs (`torch.compile(mode="reduce-overhead")`,
# which a CPU runs as the plain compiled step; `native_cuda_graph`: captured whole by hand, CUDA only), and the
# step with `metrics="core"`.
ON_REQUEST = ("native_cudagraphs", "native_cuda_graph", "multicritic_core")


PRECISIONS = ("float32", "bfloat16")


def make_impls(backend, size, batch, wanted, precision="float32"):
    """`{name: step}` for the names in `wanted` (see `IMPLS`), and the critic's `(in_dim, units, layers)`.
    `precision="bfloat16"`: ours under Keras's `mixed_bfloat16` policy, the native steps' bfloat16 matmuls
    (PyTorch's autocast, JAX's casts; TensorFlow's native steps have none and are left out)."""
    import keras

    from multicritic import CriticNetwork, CriticTrainer, get_model_dims

    native = __import__(f"benchmarks.native.native_{backend}", fromlist=["make_step"])
    dims = get_model_dims(size)
    gru, units, layers = dims["gru_units"], dims["dense_hidden_units"], dims["num_dense_layers"]
    in_dim = gru + dims["num_z_categoricals"] * dims["num_z_classes"]
    impls = {}
    for name in wanted:
        if name == "native_cudagraphs":
            compiled = "reduce-overhead"
        elif name == "native_cuda_graph":
            compiled = "cuda_graph"
        else:
            compiled = name.endswith(("_compiled", "_xla")) or (
                name in ("multicritic", "multicritic_core") and backend != "jax"
            )
        if name.startswith("multicritic"):
            keras.utils.set_random_seed(0)
            # "multicritic_core": the same step returning only what the native steps return (`metrics="core"`).
            metrics = "core" if name == "multicritic_core" else "all"
            keras.config.set_dtype_policy("mixed_bfloat16" if precision == "bfloat16" else "float32")
            try:
                impls[name] = CriticTrainer(
                    CriticNetwork(model_size=size), jit_compile=compiled, metrics=metrics
                ).train_step
            finally:
                keras.config.set_dtype_policy("float32")
        else:
            if precision != "float32" and backend == "tensorflow":
                continue
            kwargs = {"jit_compile": compiled} if backend in ("tensorflow", "torch") else {}
            if not (backend == "torch" and compiled):
                kwargs.update(options_for(native, batch))  # the eager baseline's fastest variant
            if precision != "float32":
                kwargs["precision"] = precision
            impls[name] = native.make_step(in_dim, units, layers, **kwargs)
    return impls, (in_dim, units, layers)


def run_backend(
    backend, pairs, repeats, block_seconds, wanted=None, precision="float32", min_steps=1, device_profile=False
):
    native = __import__(f"benchmarks.native.native_{backend}", fromlist=["make_step"])  # noqa: F841 (fails early)
    wanted = [n for n in IMPLS[backend] if (n in wanted if wanted else n not in ON_REQUEST)]
    peak = _matmul_peak(backend)
    records = [{"backend": backend, "impl": "matmul_peak", "gflops": peak}]
    for size, batch in pairs:
        impls, (in_dim, units, layers) = make_impls(backend, size, batch, wanted, precision)
        from multicritic import get_model_dims

        dims = get_model_dims(size)
        data = _inputs(backend, batch, dims["gru_units"], dims["num_z_categoricals"], dims["num_z_classes"], seed=batch)
        times, count, first = time_side_by_side(
            backend, impls, data, repeats, block_seconds, first_call=True, min_steps=min_steps
        )
        host = {name: host_seconds(backend, impls[name], data) for name in times}
        device = {}
        if device_profile:
            from benchmarks.device_profile import profile_step

            device = {name: profile_step(backend, impls[name], data) for name in times}
        flops = step_flops(in_dim, units, layers, 255, batch)
        for name, values in times.items():
            ms = statistics.median(values) * 1e3
            records.append(
                {
                    "backend": backend,
                    "impl": name,
                    "size": size,
                    "batch": batch,
                    "step_ms": ms,
                    "step_ms_min": min(values) * 1e3,
                    "step_ms_max": max(values) * 1e3,
                    "precision": precision,
                    "samples_per_s": batch / (ms / 1e3),
                    "gflop_per_step": flops / 1e9,
                    "utilization": flops / (ms / 1e3) / (peak * 1e9),
                    "repeats": repeats,
                    "first_call_s": first[name],
                    "host_ms": host[name] * 1e3,
                    "steps_per_block": count,
                }
            )
            if device.get(name):
                records[-1]["device"] = device[name]
    return records


def run_per_backend(script, child_args):
    """Runs `script --backend B --child ARGS` for every installed backend; returns their records."""
    import importlib.util

    records = []
    for backend in BACKENDS:
        if importlib.util.find_spec(backend) is None:
            print(f"skipping {backend}: not installed", file=sys.stderr)
            continue
        cmd = [sys.executable, script, "--backend", backend, "--child", *child_args]
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(out.stderr[-2000:], file=sys.stderr)
            raise SystemExit(f"benchmark failed on {backend}")
        records += json.loads(out.stdout.strip().splitlines()[-1])
    return records


def dispatch(script, args, child_args, run_this_backend, table):
    """The benchmarks' command line: `--backend all` runs `script` per installed backend with `child_args`;
    one backend runs `run_this_backend()` here (a child prints its records as JSON). Prints the table and
    writes `--json`."""
    if args.backend == "all":
        records = run_per_backend(script, child_args)
    else:
        os.environ["KERAS_BACKEND"] = args.backend
        records = run_this_backend()
        if args.child:
            print(json.dumps(records))
            return
    print(table(records))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


def timed_command(script, doc, argv, run_backend, table, batches, repeats, block_seconds, flags=()):
    """The command line of a benchmark timed per backend and batch (`--backend`, `--size`, `--batch`,
    `--repeats`, `--block-seconds`, `--json`): `run_backend(backend, size, batches, repeats, block_seconds)`
    through `dispatch`; the other arguments are the defaults. `flags`: `(name, help)` of switches the
    benchmark adds, passed to `run_backend` as keyword arguments."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "all"), help=f"one of {BACKENDS} or all")
    parser.add_argument("--size", default="XS")
    parser.add_argument("--batch", type=int, nargs="+", default=list(batches))
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--block-seconds", type=float, default=block_seconds, help="length of one timed block")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name, text in flags:
        parser.add_argument(f"--{name}", action="store_true", help=text)
    args = parser.parse_args(argv)
    switches = {name: getattr(args, name) for name, _ in flags}
    child = [
        "--size",
        args.size,
        "--repeats",
        str(args.repeats),
        "--block-seconds",
        str(args.block_seconds),
        "--batch",
        *map(str, args.batch),
    ] + [f"--{name}" for name, on in switches.items() if on]
    dispatch(
        script,
        args,
        child,
        lambda: run_backend(args.backend, args.size, args.batch, args.repeats, args.block_seconds, **switches),
        table,
    )


# Each row's ratios: native time / ours (above 1: ours is faster), for these pairs where both were timed.
RATIOS = (
    ("native", "multicritic"),
    ("native_compiled", "multicritic"),
    ("native_cudagraphs", "multicritic"),
    ("native", "multicritic_eager"),
    ("native_xla", "multicritic"),
    ("native", "multicritic_graph"),
)


def table(records):
    peaks = {r["backend"]: r["gflops"] for r in records if r["impl"] == "matmul_peak"}
    rows = {}
    for r in records:
        if r["impl"] != "matmul_peak":
            rows.setdefault((r["backend"], r["size"], r["batch"]), {})[r["impl"]] = r
    lines = [
        "| backend | size | batch | step ms (first call s) | native / ours | multicritic util | matmul peak GFLOP/s |",
        "|---|---|---:|---|---|---:|---:|",
    ]
    for (backend, size, batch), impls in sorted(rows.items()):
        times = ", ".join(
            f"{n} {r['step_ms']:.2f} ({r.get('first_call_s', float('nan')):.1f})" for n, r in impls.items()
        )
        ratios = ", ".join(
            f"{a}/{b} {impls[a]['step_ms'] / impls[b]['step_ms']:.3f}" for a, b in RATIOS if a in impls and b in impls
        )
        util = impls["multicritic"]["utilization"] if "multicritic" in impls else float("nan")
        lines.append(
            f"| {backend} | {size} | {batch} | {times} | {ratios} | {100 * util:.1f}% | {peaks[backend]:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "all"), help=f"one of {BACKENDS} or all")
    parser.add_argument("--size", nargs="+", default=["XS"])
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 4096, 15360])
    parser.add_argument(
        "--sweep",
        action="store_true",
        help=f"batches {SWEEP_BATCHES} at XS and sizes {SWEEP_SIZES} at batch 1024 instead",
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=1.0, help="length of one timed block")
    parser.add_argument("--impls", nargs="+", help="a subset of the backend's implementations (see IMPLS)")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="float32",
        help="bfloat16: ours under mixed_bfloat16, the native steps' bfloat16 matmuls",
    )
    parser.add_argument("--min-block-steps", type=int, default=1, help="steps a timed block runs at least")
    parser.add_argument(
        "--device-profile",
        action="store_true",
        help="also profile each step on the GPU: kernels a step and busy time a step",
    )
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    child = [
        "--size",
        *args.size,
        "--repeats",
        str(args.repeats),
        "--block-seconds",
        str(args.block_seconds),
        "--batch",
        *map(str, args.batch),
        "--precision",
        args.precision,
        "--min-block-steps",
        str(args.min_block_steps),
    ] + (["--impls", *args.impls] if args.impls else [])
    child += ["--sweep"] if args.sweep else []
    child += ["--device-profile"] if args.device_profile else []
    pairs = cases(args.size, args.batch, args.sweep)
    dispatch(
        __file__,
        args,
        child,
        lambda: run_backend(
            args.backend,
            pairs,
            args.repeats,
            args.block_seconds,
            args.impls,
            args.precision,
            args.min_block_steps,
            args.device_profile,
        ),
        table,
    )


if __name__ == "__main__":
    main()
