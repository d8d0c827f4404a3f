"""Finding 18: forward passes from other threads while one thread trains."""

import threading

import numpy as np

from multicritic import CriticNetwork, CriticTrainer
from multicritic.training.trainer import predict_function
from tests.conftest import BACKEND, random_inputs, randomize, to_np


def test_forward_and_predict_from_other_threads_while_training():
    critic = CriticNetwork(model_size="micro")
    randomize(critic, seed=2)
    trainer = CriticTrainer(critic, learning_rate=1e-3)
    predict = predict_function(critic)
    h, z = random_inputs(critic, 64, seed=1)
    targets = np.linspace(-20, 20, 64).astype("float32")
    weights = np.ones(64, "float32")
    trainer.train_step(h, z, targets, weights)  # compiled before the readers start
    predict(h[:8], z[:8])
    stop, errors, reads = threading.Event(), [], []

    def reader(use_predict):
        while not stop.is_set():
            try:
                value, logits = predict(h[:8], z[:8]) if use_predict else critic(h[:8], z[:8])
                value = to_np(value)
                assert value.shape == (8,) and np.isfinite(value).all() and np.isfinite(to_np(logits)).all()
                reads.append(1)
            except Exception as err:  # noqa: BLE001 - any failure is the finding
                errors.append(repr(err))
                return

    threads = [threading.Thread(target=reader, args=(p,)) for p in (True, False)]
    for t in threads:
        t.start()
    try:
        for step in range(15):
            trainer.train_step(h, z, targets, weights)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    assert reads
    assert int(to_np(trainer.steps)) == 16


def test_a_held_weight_value_survives_a_step():
    """JAX donated the weights' buffers to the step: a held `var.value` was deleted.

    A held value stays readable on every backend: on JAX it is the array from
    before the step (arrays are immutable); on TensorFlow and PyTorch it is
    the variable's live storage, which the step updates in place.
    """
    critic = CriticNetwork(model_size="nano")
    randomize(critic, seed=3)
    trainer = CriticTrainer(critic, learning_rate=1e-2)
    held = [v.value for v in critic.weights]
    copies = [to_np(v).copy() for v in held]
    h, z = random_inputs(critic, 16)
    trainer.train_step(h, z, np.full(16, 5.0, "float32"), np.ones(16, "float32"))
    for value, copy in zip(held, copies):
        if BACKEND == "jax":
            np.testing.assert_array_equal(to_np(value), copy)
        else:
            assert np.isfinite(to_np(value)).all()
    assert not np.array_equal(to_np(critic.trainable_variables[0]), copies[0])
