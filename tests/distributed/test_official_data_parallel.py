"""The official-code reproduction (tests/test_official_2024.py) under JAX data parallelism."""

import numpy as np
import pytest

from tests.conftest import BACKEND, to_np


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution runs on JAX")
def test_three_official_updates_on_two_devices():
    import jax
    import keras

    from multicritic import CriticTrainer
    from multicritic.training.optimizers import LaProp
    from tests.test_official_2024 import GOLDENS, RUN, batches, load, official_critic, official_key

    if jax.device_count() < 2:
        pytest.skip("one JAX device here (the jax-multidevice nox session runs this with four)")
    golden = dict(np.load(GOLDENS))
    # The goldens' batch holds B = 2 replayed sequences (and 2 * 5 dreams): two devices, one sequence each.
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=keras.distribution.list_devices()[:2]))
    try:
        critic = official_critic()
        load(critic, golden, RUN + "init/")
        trainer = CriticTrainer(critic, optimizer=LaProp(learning_rate=1e-3), grad_clip=None, gamma=1.0)
        for step in range(3):
            metrics = trainer.train_on_dream_and_replay(*batches(golden))
            np.testing.assert_allclose(float(to_np(metrics["total"])), golden[RUN + f"step{step}/aux/loss"], rtol=1e-6)
        for weights, net in ((critic.fast_weights, "val"), (critic.ema_weights, "slowval")):
            got = [to_np(v) for v in weights]
            want = [golden[RUN + f"step2/state/{net}/{official_key(v)}"] for v in weights]
            error = np.sqrt(sum(((g - w) ** 2).sum() for g, w in zip(got, want)))
            assert error <= 1e-5 * np.sqrt(sum((w**2).sum() for w in want)), (net, error)
    finally:
        keras.distribution.set_distribution(None)
