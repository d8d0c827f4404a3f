"""The critic's first Dense on `h` and `z` apart (a GEMM per part) or concatenated (one GEMM): the whole step.

`Backend.concatenates_first_input` chooses, per backend, whether a single
critic's first Dense concatenates its input parts where the overflow guard's
scale goes on the kernel (where it goes on the input they are always
concatenated). This times the full train step (`CriticTrainer`, one critic)
both ways, side by side in one process: two trainers from the same weights,
each traced with the attribute set one way, then timed in alternating
blocks; medians, and the median of the per-round ratios.

    python benchmarks/ours/first_input.py --backend tensorflow --batch 256 4096 15360
    python benchmarks/ours/first_input.py --backend tensorflow --batch 256 4096 15360 --graph
    python benchmarks/ours/first_input.py --backend jax --batch 256 4096 15360
    python benchmarks/ours/first_input.py --backend torch --batch 256 4096

`--graph`: TensorFlow's plain graph instead of XLA (PyTorch: its eager step
instead of the compiled one). Both ways compute the same first loss, which
each record holds.
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.ours.train_step import _inputs, time_side_by_side, timed_command  # noqa: E402
from benchmarks.render_tables import first_input as rendered  # noqa: E402

WAYS = ("split", "concatenated")


def make_steps(size, batch, jit_compile, seed=0):
    """`({way: step}, {way: first loss}, inputs)`: a trainer per way from the same weights, each traced
    (its first three calls) with `concatenates_first_input` set that way on the current backend."""
    import keras

    from multicritic import CriticNetwork, CriticTrainer, get_model_dims

    from multicritic.backend import contract as backend

    dims = get_model_dims(size)
    data = _inputs(
        keras.backend.backend(), batch, dims["gru_units"], dims["num_z_categoricals"], dims["num_z_classes"], seed=batch
    )
    current = backend.current()
    steps, first = {}, {}
    for way in WAYS:
        keras.utils.set_random_seed(seed)
        trainer = CriticTrainer(CriticNetwork(model_size=size), jit_compile=jit_compile)
        current.concatenates_first_input = way == "concatenated"  # shadows the class's value for the trace
        try:
            first[way] = float(trainer.train_step(*data)["total"])
            for _ in range(2):
                trainer.train_step(*data)
        finally:
            del current.concatenates_first_input
        steps[way] = trainer.train_step
    return steps, first, data


def run_backend(backend, size, batches, repeats, block_seconds, graph=False):
    records = []
    for batch in batches:
        steps, first, data = make_steps(size, batch, jit_compile=not graph)
        times, _ = time_side_by_side(backend, steps, data, repeats, block_seconds)
        split, concatenated = times["split"], times["concatenated"]
        records.append(
            {
                "backend": backend,
                "size": size,
                "batch": batch,
                "jit_compile": not graph,
                "split_ms": statistics.median(split) * 1e3,
                "concatenated_ms": statistics.median(concatenated) * 1e3,
                "concatenated_over_split": statistics.median(c / s for c, s in zip(concatenated, split)),
                "first_loss": first,
                "repeats": repeats,
                "split_ms_all": [t * 1e3 for t in split],
                "concatenated_ms_all": [t * 1e3 for t in concatenated],
            }
        )
    return records


def table(records):
    """The docs' table of the records, then each batch's first loss both ways."""
    losses = [
        f"batch {r['batch']}: first loss {r['first_loss']['split']:.7g} split, "
        f"{r['first_loss']['concatenated']:.7g} concatenated"
        for r in records
    ]
    return "\n".join(rendered([records]) + [""] + losses)


def main(argv=None):
    timed_command(
        __file__,
        __doc__,
        argv,
        run_backend,
        table,
        batches=(4096,),
        repeats=9,
        block_seconds=1.0,
        flags=(("graph", "TensorFlow's plain graph instead of XLA (PyTorch: its eager step)"),),
    )


if __name__ == "__main__":
    main()
