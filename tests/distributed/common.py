"""Shared data of the data-parallel tests (numpy only)."""

import numpy as np


def initial_weights(critic):
    rng = np.random.default_rng(0)
    return [rng.normal(scale=0.2, size=tuple(v.shape)).astype(np.float32) for v in critic.weights]


def batches(kind, steps=3, n=16, horizon=6, gru=16, cats=4, classes=4):
    out = []
    for step in range(steps):
        rng = np.random.default_rng(100 + step)
        if kind == "direct":
            out.append(
                (
                    rng.normal(size=(n, gru)).astype(np.float32),
                    rng.random((n, cats, classes)).astype(np.float32),
                    (30 * rng.normal(size=n)).astype(np.float32),
                    rng.uniform(0.5, 1, size=n).astype(np.float32),
                )
            )
        else:
            out.append(
                (
                    rng.normal(size=(horizon + 1, n, gru)).astype(np.float32),
                    rng.random((horizon + 1, n, cats, classes)).astype(np.float32),
                    (3 * rng.normal(size=(horizon + 1, n))).astype(np.float32),
                    (rng.random((horizon + 1, n)) > 0.1).astype(np.float32),
                )
            )
    return out


def split(batch, parts, index, axis):
    return tuple(np.array_split(x, parts, axis=axis)[index] for x in batch)
