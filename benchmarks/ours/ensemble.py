"""Times a K-member critic ensemble's train step against one critic, a Python loop of K critics, and a native ensemble.

For one backend (or `--backend all`: one subprocess per installed backend)
and each batch size, side by side in one process:

1. `single`: multicritic, one critic (`ensemble_size=1`), `CriticTrainer.train_step`;
2. `ensemble`: multicritic, `ensemble_size=K` (stacked members, one batched matmul per layer);
3. `loop`: K separate single critics, each with its own `CriticTrainer`, one `train_step` each;
4. `native`: the framework's own vectorised ensemble written by hand
   (`benchmarks/native/native_ensemble_{jax,torch,tensorflow}.py`: `jax.vmap`,
   `torch.func.stack_module_state` + `vmap`, stacked `tf.einsum` / batched
   matmul); on TensorFlow also `native_xla`, the same step under XLA. The
   table compares with the faster of the two.

Each is warmed up (compiled), then timed in alternating blocks (A B C D,
D C B A, ...); the medians are reported, with the ratios `ensemble/single`
(the target: <= 2.5 at K=5), `loop/single` and `ensemble/native`.

    python benchmarks/ours/ensemble.py --backend all --size XS --batch 4096 --members 5 --json out.json

The step: fast + EMA forward, two-hot critic loss (EMA regulariser), backward,
global-norm clip (100), Adam (lr 3e-5, eps 1e-5), EMA update (0.98); an
ensemble's loss is the mean of its members' (targets shared). Every
implementation gets the same backend tensors (h `[B, 256]`, z `[B, 32, 32]`,
real-space targets `[B]`, weights `[B]`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, ROOT)

from benchmarks.ours.train_step import _inputs, _matmul_peak, dispatch, step_flops, time_side_by_side  # noqa: E402
from benchmarks.render_tables import fastest_native  # noqa: E402

BACKENDS = ("tensorflow", "torch", "jax")
IMPLS = ("single", "ensemble", "loop", "native", "native_xla")


def make_impls(backend, size, members, jit_compile, native_kwargs):
    import keras

    from multicritic import CriticNetwork, CriticTrainer, get_model_dims

    dims = get_model_dims(size)
    in_dim = dims["gru_units"] + dims["num_z_categoricals"] * dims["num_z_classes"]
    units, layers = dims["dense_hidden_units"], dims["num_dense_layers"]

    def trainer(k, seed):
        keras.utils.set_random_seed(seed)
        return CriticTrainer(CriticNetwork(model_size=size, ensemble_size=k), jit_compile=jit_compile)

    loop = [trainer(1, seed) for seed in range(1, members + 1)]

    def loop_step(h, z, targets, weights):
        return [t.train_step(h, z, targets, weights) for t in loop]

    native = __import__(f"benchmarks.native.native_ensemble_{backend}", fromlist=["make_step"])
    impls = {
        "single": trainer(1, 0).train_step,
        "ensemble": trainer(members, 0).train_step,
        "loop": loop_step,
        "native": native.make_step(members, in_dim, units, layers, **native_kwargs),
    }
    if backend == "tensorflow":  # the plain graph and XLA: either may be the faster
        impls["native_xla"] = native.make_step(members, in_dim, units, layers, **{**native_kwargs, "jit_compile": True})
    return impls, (in_dim, units, layers)


def run_backend(backend, size, batches, members, repeats, block_seconds, jit_compile, native_kwargs, impls_wanted):
    dims = __import__("multicritic", fromlist=["get_model_dims"]).get_model_dims(size)
    peak = _matmul_peak(backend)
    records = [{"backend": backend, "impl": "matmul_peak", "gflops": peak}]
    for batch in batches:
        data = _inputs(backend, batch, dims["gru_units"], dims["num_z_categoricals"], dims["num_z_classes"], seed=batch)
        impls, (in_dim, units, layers) = make_impls(backend, size, members, jit_compile, native_kwargs)
        impls = {k: v for k, v in impls.items() if k in impls_wanted}
        times, count = time_side_by_side(backend, impls, data, repeats, block_seconds)
        one = step_flops(in_dim, units, layers, 255, batch)
        for name, values in times.items():
            ms = statistics.median(values) * 1e3
            flops = one if name == "single" else members * one
            records.append(
                {
                    "backend": backend,
                    "impl": name,
                    "size": size,
                    "batch": batch,
                    "members": 1 if name == "single" else members,
                    "step_ms": ms,
                    "step_ms_all": [v * 1e3 for v in values],
                    "gflop_per_step": flops / 1e9,
                    "utilization": flops / (ms / 1e3) / (peak * 1e9),
                    "repeats": repeats,
                    "steps_per_block": count,
                    "jit_compile": jit_compile,
                    "native_kwargs": native_kwargs,
                }
            )
    return records


def table(records):
    peaks = {r["backend"]: r["gflops"] for r in records if r["impl"] == "matmul_peak"}
    rows = {}
    for r in records:
        if r["impl"] in IMPLS:
            rows.setdefault((r["backend"], r["size"], r["batch"]), {})[r["impl"]] = r
    lines = [
        "| backend | size | batch | K | single ms | ensemble ms | loop ms | native ms | native | "
        "ensemble/single (<= 2.5) | loop/single | ensemble/native | ensemble util | native util | "
        "matmul peak GFLOP/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]

    def ms(row, name):
        return f"{row[name]['step_ms']:.1f}" if name in row else "-"

    def ratio(row, a, b):
        return f"{row[a]['step_ms'] / row[b]['step_ms']:.2f}" if a in row and b in row else "-"

    def util(row, name):
        return f"{100 * row[name]['utilization']:.0f}%" if name in row else "-"

    for (backend, size, batch), row in sorted(rows.items()):
        k = max(r["members"] for r in row.values())
        native = fastest_native(row) or "native"
        lines.append(
            f"| {backend} | {size} | {batch} | {k} | {ms(row, 'single')} | {ms(row, 'ensemble')} | {ms(row, 'loop')} | "
            f"{ms(row, native)} | {native} | {ratio(row, 'ensemble', 'single')} | {ratio(row, 'loop', 'single')} | "
            f"{ratio(row, 'ensemble', native)} | {util(row, 'ensemble')} | {util(row, native)} | "
            f"{peaks[backend]:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "all"), help=f"one of {BACKENDS} or all")
    parser.add_argument("--size", default="XS")
    parser.add_argument("--batch", type=int, nargs="+", default=[4096])
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=2.0, help="length of one timed block")
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS, help="rows to time")
    parser.add_argument(
        "--jit-compile", action="store_true", help="multicritic's jit_compile (XLA on TF, compiled update on PyTorch)"
    )
    parser.add_argument(
        "--native-kwargs",
        default="{}",
        metavar="JSON",
        help="options of the native ensemble, e.g. '{\"jit_compile\": false}' (TF) or '{\"fused\": true}' (PyTorch)",
    )
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    native_kwargs = json.loads(args.native_kwargs)

    child = [
        "--size",
        args.size,
        "--members",
        str(args.members),
        "--repeats",
        str(args.repeats),
        "--block-seconds",
        str(args.block_seconds),
        "--native-kwargs",
        args.native_kwargs,
        "--impls",
        *args.impls,
        "--batch",
        *map(str, args.batch),
    ] + (["--jit-compile"] if args.jit_compile else [])
    dispatch(
        __file__,
        args,
        child,
        lambda: run_backend(
            args.backend,
            args.size,
            args.batch,
            args.members,
            args.repeats,
            args.block_seconds,
            args.jit_compile,
            native_kwargs,
            args.impls,
        ),
        table,
    )


if __name__ == "__main__":
    main()
