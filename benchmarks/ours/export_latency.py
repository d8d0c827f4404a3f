"""Inference latency of each `critic.export` format, run by its own runtime, next to the Keras forward pass.

For one backend (or `--backend all`: one subprocess per installed backend):
export an XS critic in every format that backend supports, reload each with
its runtime (TensorFlow, onnxruntime, LiteRT), check its outputs against the
Keras forward pass, then time numpy-in/numpy-out calls at each batch size
in alternating blocks and report medians (ms per call).

    python benchmarks/ours/export_latency.py --backend all --batch 1 1024 --json out.json

"keras" is `multicritic.training.predict_function` (the compiled forward:
`tf.function`, `jax.jit`, eager PyTorch under `no_grad`) plus the
conversion of its outputs to numpy.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, ROOT)

from benchmarks.ours.train_step import timed_command  # noqa: E402


def _block(fn, data, count):
    start = time.perf_counter()
    for _ in range(count):
        fn(*data)
    return (time.perf_counter() - start) / count


def run_backend(backend, size, batches, repeats, block_seconds):
    import keras
    import numpy as np

    from multicritic import CriticNetwork
    from multicritic.files.export import SUPPORTED, load_exported
    from multicritic.files.runtimes import SUFFIXES
    from multicritic.training import predict_function

    critic = CriticNetwork(model_size=size)
    rng = np.random.default_rng(0)
    for v in critic.fast_weights:
        v.assign(rng.normal(scale=0.05, size=tuple(v.shape)).astype("float32"))
    forward = predict_function(critic)

    def keras_forward(h, z):
        return tuple(np.asarray(keras.ops.convert_to_numpy(o)) for o in forward(h, z))

    impls = {"keras": keras_forward}
    folder = tempfile.mkdtemp()
    for fmt in SUPPORTED[backend]:
        path = os.path.join(folder, "critic" + {"onnx": ".onnx", "litert": ".tflite", **SUFFIXES}.get(fmt, ""))
        critic.export(path, format=fmt, verbose=False)
        impls[fmt] = load_exported(path, fmt)
    records = []
    for batch in batches:
        h = np.tanh(rng.normal(size=(batch, critic.gru_units))).astype(np.float32)
        z = np.eye(critic.num_z_classes, dtype=np.float32)[
            rng.integers(0, critic.num_z_classes, size=(batch, critic.num_z_categoricals))
        ]
        want = keras_forward(h, z)
        per_call = {}
        for name, fn in impls.items():
            got = fn(h, z)
            err = float(np.max(np.abs(got[-1] - want[1])))
            if err > 1e-4:
                raise SystemExit(f"{backend} {name}: logits differ from Keras's by {err}")
            _block(fn, (h, z), 3)
            per_call[name] = _block(fn, (h, z), 3)
        count = max(1, int(block_seconds / max(per_call.values())))
        times = {name: [] for name in impls}
        for r in range(repeats):
            for name in list(impls) if r % 2 == 0 else list(impls)[::-1]:
                times[name].append(_block(impls[name], (h, z), count))
        for name, values in times.items():
            records.append(
                {
                    "backend": backend,
                    "format": name,
                    "batch": batch,
                    "size": size,
                    "ms": 1e3 * statistics.median(values),
                    "vs_keras": statistics.median(values) / statistics.median(times["keras"]),
                }
            )
    return records


def table(records):
    lines = ["| exported from | format | batch | ms per call (median) | / Keras forward |", "|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['backend']} | {r['format']} | {r['batch']} | {r['ms']:.3f} | {r['vs_keras']:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    timed_command(__file__, __doc__, argv, run_backend, table, batches=(1, 1024), repeats=5, block_seconds=0.5)


if __name__ == "__main__":
    main()
