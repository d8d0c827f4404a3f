"""Seeds, shapes and inputs of the RLlib goldens (tests/data/rllib_goldens.npz).

Imported both by the generator (in an RLlib + tf_keras environment) and by the
tests, so it depends on numpy only. Weight lists are in the order of RLlib's
`CriticNetwork.get_weights()`: fast MLP Dense kernels, then each LayerNorm's
gamma and beta, then the head's kernel and bias; then the same for the EMA copy.
"""

from __future__ import annotations

import pathlib

import numpy as np

GOLDENS = pathlib.Path(__file__).with_name("data") / "rllib_goldens.npz"
GAMMA, LAMBDA = 0.997, 0.95

# size: (gru_units, num_z_categoricals, num_z_classes, dense_units, dense_layers)
DIMS = {
    "nano": (16, 4, 4, 16, 1),
    "micro": (32, 8, 8, 32, 1),
    "XXS": (128, 32, 32, 128, 1),
    "XS": (256, 32, 32, 256, 1),
    "S": (512, 32, 32, 512, 2),
    "M": (1024, 32, 32, 640, 3),
}
FORWARD_SIZES = ("nano", "micro", "XXS", "XS", "S", "M")
TRAJECTORY_SIZE = "micro"
TRAJECTORY_STEPS = 5
HORIZON_PLUS_1, DREAM_BATCH = 16, 6


def weight_shapes(size):
    gru, cats, classes, units, layers = DIMS[size]
    shapes = [(gru + cats * classes if i == 0 else units, units) for i in range(layers)]
    for _ in range(layers):
        shapes += [(units,), (units,)]
    return shapes + [(units, 255), (255,)]


def _one_copy(size, rng):
    out = []
    shapes = weight_shapes(size)
    layers = DIMS[size][4]
    for i, shape in enumerate(shapes):
        if i < layers:  # Dense kernels
            w = rng.normal(size=shape) / np.sqrt(shape[0])
        elif i < 3 * layers:  # LayerNorm gamma, beta
            w = (1.0 if (i - layers) % 2 == 0 else 0.0) + 0.1 * rng.normal(size=shape)
        else:  # head kernel and bias
            w = 0.3 * rng.normal(size=shape)
        out.append(w.astype(np.float32))
    return out


def rllib_weights(size, ema_equals_fast=False):
    rng = np.random.default_rng(sum(map(ord, size)))
    fast = _one_copy(size, rng)
    ema = [w.copy() for w in fast] if ema_equals_fast else _one_copy(size, rng)
    return fast + ema


def forward_inputs(size, batch=5):
    gru, cats, classes = DIMS[size][:3]
    rng = np.random.default_rng(100 + sum(map(ord, size)))
    h = rng.normal(size=(batch, gru)).astype(np.float32)
    z = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, size=(batch, cats))]
    return h, z


def two_hot_values():
    bucket = np.float32(40.0) / np.float32(254.0)
    exact = np.float32(-20.0) + np.arange(0, 255, 37, dtype=np.float32) * bucket
    edges = np.array([0.0, 0.1, -0.1, 20.0, -20.0, 25.0, -25.0, 19.999, -19.999, 1e-8, 7.5], np.float32)
    rand = np.random.default_rng(7).uniform(-22, 22, size=40).astype(np.float32)
    return np.concatenate([edges, exact, rand]).astype(np.float32)


def symlog_values():
    return np.array([0.0, 1e-30, -1e-6, 0.5, -1.0, 3.0, 1e3, -1e6, 3e9, -1e20, 1e30], np.float32)


def return_inputs():
    rng = np.random.default_rng(11)
    shape = (HORIZON_PLUS_1, DREAM_BATCH)
    rewards = (rng.normal(size=shape) * np.array([1, 10, 1e3, 1e5, 0.1, 1.0])).astype(np.float32)
    continues = (rng.random(size=shape) > 0.1).astype(np.float32)
    continues[:, -1] = rng.random(size=HORIZON_PLUS_1).astype(np.float32)  # probabilities too
    values = (rng.normal(size=shape) * np.array([1, 10, 1e3, 1e5, 0.1, 1.0])).astype(np.float32)
    return rewards, continues, values


def loss_inputs():
    rng = np.random.default_rng(12)
    logits = (2.0 * rng.normal(size=(HORIZON_PLUS_1, DREAM_BATCH, 255))).astype(np.float32)
    ema_symlog = rng.uniform(-12, 12, size=(HORIZON_PLUS_1, DREAM_BATCH)).astype(np.float32)
    _, continues, _ = return_inputs()
    weights = np.cumprod(GAMMA * continues, axis=0) / GAMMA
    return logits, ema_symlog, weights.astype(np.float32)


def dream_batch(step, size=TRAJECTORY_SIZE, batch=8):
    gru, cats, classes = DIMS[size][:3]
    rng = np.random.default_rng(1000 + step)
    h1 = HORIZON_PLUS_1
    h = np.tanh(rng.normal(size=(h1, batch, gru))).astype(np.float32)
    z = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, size=(h1, batch, cats))]
    rewards = (rng.normal(size=(h1, batch)) * 5.0).astype(np.float32)
    continues = (rng.random(size=(h1, batch)) > 0.05).astype(np.float32)
    return h, z, rewards, continues
