"""Times every variant of the native baselines side by side, to pick the fastest per backend and batch.

A native step (`benchmarks/native_*.py`) has variants that compute the same
math (tested: `tests/benchmarks/test_native_baselines.py`): the two-hot loss
by gathering two log-probabilities or by a dense `[B, 255]` product, the
LayerNorm grouping (TensorFlow), torch.optim.Adam's fused kernel or foreach
ops (PyTorch), donated state buffers or not (JAX). For each backend and
batch, all variants are warmed up and timed in alternating blocks (medians);
each native module's `options_for(batch)`, which `train_step.py` uses,
returns the fastest measured here.

    python benchmarks/baseline_variants.py --backend all --batch 256 4096 15360 --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.train_step import BACKENDS, _inputs, dispatch, time_side_by_side  # noqa: E402


def variants(native):
    """Every combination of `native.VARIANTS`, as `make_step` keywords."""
    return [dict(zip(native.VARIANTS, values)) for values in itertools.product(*native.VARIANTS.values())]


def label(variant):
    return ",".join(f"{k}={v}" for k, v in variant.items())


def run_backend(backend, size, batches, repeats, block_seconds):
    from multicritic import get_model_dims

    native = __import__(f"benchmarks.native_{backend}", fromlist=["make_step"])
    dims = get_model_dims(size)
    gru, units, layers = dims["gru_units"], dims["dense_hidden_units"], dims["num_dense_layers"]
    cats, classes = dims["num_z_categoricals"], dims["num_z_classes"]
    records = []
    for batch in batches:
        data = _inputs(backend, batch, gru, cats, classes, seed=batch)
        impls = {label(v): native.make_step(gru + cats * classes, units, layers, **v) for v in variants(native)}
        times, count = time_side_by_side(backend, impls, data, repeats, block_seconds)
        chosen = label(native.options_for(batch))
        for name, values in times.items():
            records.append({"backend": backend, "size": size, "batch": batch, "variant": name,
                            "step_ms": statistics.median(values) * 1e3, "repeats": repeats,
                            "steps_per_block": count, "chosen": name == chosen})
    return records


def table(records):
    lines = ["| backend | batch | variant | ms | vs fastest | options_for |", "|---|---:|---|---:|---:|---|"]
    best = {}
    for r in records:
        key = (r["backend"], r["batch"])
        best[key] = min(best.get(key, float("inf")), r["step_ms"])
    for r in sorted(records, key=lambda r: (r["backend"], r["batch"], r["step_ms"])):
        lines.append(f"| {r['backend']} | {r['batch']} | {r['variant']} | {r['step_ms']:.2f} | "
                     f"{r['step_ms'] / best[(r['backend'], r['batch'])]:.3f} | {'yes' if r['chosen'] else ''} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "all"), help=f"one of {BACKENDS} or all")
    parser.add_argument("--size", default="XS")
    parser.add_argument("--batch", type=int, nargs="+", default=[256, 4096, 15360])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--block-seconds", type=float, default=1.0, help="length of one timed block")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    child = ["--size", args.size, "--repeats", str(args.repeats), "--block-seconds", str(args.block_seconds),
             "--batch", *map(str, args.batch)]
    dispatch(__file__, args, child,
             lambda: run_backend(args.backend, args.size, args.batch, args.repeats, args.block_seconds), table)


if __name__ == "__main__":
    main()
