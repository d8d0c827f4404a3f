"""Times every variant of the native baselines side by side, to pick the fastest per backend and batch.

A native step (`benchmarks/native/native_*.py`) has variants that compute the same
math (tested: `tests/benchmarks/test_native_baselines.py`): the two-hot loss
by gathering two log-probabilities or by a dense `[B, 255]` product, the
LayerNorm grouping (TensorFlow), torch.optim.Adam's fused kernel or foreach
ops (PyTorch), donated state buffers or not (JAX). For each backend and
batch, all variants are warmed up and timed in alternating blocks (medians);
each native module's `FASTEST` holds the fastest measured here, which
`benchmarks.options_for(native, batch)` gives `train_step.py`.

    python benchmarks/ours/baseline_variants.py --backend all --batch 256 4096 15360 --json out.json
"""

from __future__ import annotations

import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, ROOT)

from benchmarks import options_for, variants  # noqa: E402
from benchmarks.ours.train_step import _inputs, time_side_by_side, timed_command  # noqa: E402


def label(variant):
    return ",".join(f"{k}={v}" for k, v in variant.items())


def run_backend(backend, size, batches, repeats, block_seconds):
    from multicritic import get_model_dims

    native = __import__(f"benchmarks.native.native_{backend}", fromlist=["make_step"])
    dims = get_model_dims(size)
    gru, units, layers = dims["gru_units"], dims["dense_hidden_units"], dims["num_dense_layers"]
    cats, classes = dims["num_z_categoricals"], dims["num_z_classes"]
    records = []
    for batch in batches:
        data = _inputs(backend, batch, gru, cats, classes, seed=batch)
        impls = {label(v): native.make_step(gru + cats * classes, units, layers, **v) for v in variants(native)}
        times, count = time_side_by_side(backend, impls, data, repeats, block_seconds)
        chosen = label(options_for(native, batch))
        for name, values in times.items():
            records.append(
                {
                    "backend": backend,
                    "size": size,
                    "batch": batch,
                    "variant": name,
                    "step_ms": statistics.median(values) * 1e3,
                    "repeats": repeats,
                    "steps_per_block": count,
                    "chosen": name == chosen,
                }
            )
    return records


def table(records):
    lines = ["| backend | batch | variant | ms | vs fastest | options_for |", "|---|---:|---|---:|---:|---|"]
    best = {}
    for r in records:
        key = (r["backend"], r["batch"])
        best[key] = min(best.get(key, float("inf")), r["step_ms"])
    for r in sorted(records, key=lambda r: (r["backend"], r["batch"], r["step_ms"])):
        lines.append(
            f"| {r['backend']} | {r['batch']} | {r['variant']} | {r['step_ms']:.2f} | "
            f"{r['step_ms'] / best[(r['backend'], r['batch'])]:.3f} | {'yes' if r['chosen'] else ''} |"
        )
    return "\n".join(lines)


def main(argv=None):
    timed_command(__file__, __doc__, argv, run_backend, table, batches=(256, 4096, 15360), repeats=5, block_seconds=1.0)


if __name__ == "__main__":
    main()
