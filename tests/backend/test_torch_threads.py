"""A forward pass traced in one thread never changes what another thread computes: PyTorch's own "is a trace
running" flags are process-wide, and the backend must not read them (finding 9 of the trust round)."""

import threading

import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer
from multicritic.training.trainer import predict_function
from tests.conftest import BACKEND, randomize

pytestmark = pytest.mark.skipif(BACKEND != "torch", reason="graph replays and compiled steps: PyTorch backend only")

H, B = 5, 8


# The reference critic, and the new parts together (their own replays and compiled steps).
PARTS = {"reference": {}, "quantile-on-residual": {"head": "quantile", "trunk": "residual"}}


def train(while_other_thread_traces: bool, parts=None):
    critic = CriticNetwork(model_size="nano", **(parts or {}))
    randomize(critic, seed=0)
    trainer = CriticTrainer(critic, learning_rate=1e-3)
    rng = np.random.default_rng(0)
    batches = [
        (
            rng.standard_normal((H, B, critic.gru_units)).astype("float32"),
            rng.random((H, B, critic.num_z_categoricals, critic.num_z_classes)).astype("float32"),
            rng.standard_normal((H, B)).astype("float32"),
            np.ones((H, B), "float32"),
        )
        for _ in range(25)
    ]
    stop, traced = threading.Event(), []

    def other():
        predict = predict_function(critic)
        g = np.random.default_rng(1)
        h = g.standard_normal((7, critic.gru_units)).astype("float32")
        z = g.random((7, critic.num_z_categoricals, critic.num_z_classes)).astype("float32")
        n = 1
        while not stop.is_set():  # a new batch size each call: a new trace each call
            predict(h[: 1 + n % 7], z[: 1 + n % 7])
            traced.append(n)
            n += 1

    thread = threading.Thread(target=other, daemon=True)
    if while_other_thread_traces:
        thread.start()
        while not traced:
            pass
    for batch in batches:
        trainer.train_on_dream(*batch)
    stop.set()
    if while_other_thread_traces:
        thread.join()
    return [v.numpy().copy() for v in critic.weights]


@pytest.mark.parametrize("parts", sorted(PARTS))
def test_tracing_in_another_thread_leaves_training_bit_identical(parts):
    alone, beside = train(False, PARTS[parts]), train(True, PARTS[parts])
    for a, b in zip(alone, beside):
        np.testing.assert_array_equal(a, b)
