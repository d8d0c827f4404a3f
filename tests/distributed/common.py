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


# The critics the data-parallel tests train: the reference critic, and a
# MultiCritic whose second stream is an HL-Gauss ensemble with its own return
# normaliser (statistics of the gathered global batch).
KINDS = ("single", "multi")


def make_critic(kind):
    from multicritic import CriticNetwork, MultiCritic

    if kind == "single":
        return CriticNetwork(model_size="nano")
    return MultiCritic(
        {"task": {"model_size": "nano"}, "explore": {"model_size": "nano", "head": "hl_gauss", "ensemble_size": 3}},
        stream_weights={"explore": 0.5},
        # The official normalisers, whose batch statistics must be the global batch's on every engine.
        normalizers={"task": {"impl": "perc", "rate": 0.01, "debias": True}, "explore": {"impl": "meanstd"}},
    )


def for_critic(kind, batch, step_kind):
    """A direct or dream batch as `kind` takes it: a MultiCritic gets one target / reward array per stream."""
    if kind == "single":
        return batch
    h, z, values, last = batch
    return h, z, {"task": values, "explore": 0.1 * values + 1.0}, last
