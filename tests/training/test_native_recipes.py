"""The docs' recipes for training the critic with each framework's own tools, no CriticTrainer.

The recipes are not copied here: each test runs the docs block itself (`<!-- example: recipe-... -->` in
docs/frameworks/), at a learning rate 100 times the reference's so that 30 steps show learning, then drives
the block's `train_step` and checks what the docs say about it.
"""

import keras
import numpy as np
import pytest

from tests.conftest import BACKEND, random_inputs, to_np
from tests.docs import blocks


def batch(critic, n=64, seed=0):
    h, z = random_inputs(critic, n, seed)
    rng = np.random.default_rng(seed)
    return h, z, (20 * rng.normal(size=n)).astype(np.float32), np.ones(n, np.float32)


def recipe(name):
    """Runs the docs' recipe block `name` with `learning_rate = 3e-3`; returns its namespace."""
    block = blocks.named(name)
    assert block.code.count("learning_rate = 3e-5") == 1, f"{block.id}: the recipe sets `learning_rate = 3e-5`"
    return blocks.run(block.code.replace("learning_rate = 3e-5", "learning_rate = 3e-3"), block.id)


def check_ema(critic, fast_before_ema, ema_before, decay):
    # After the loop's last update: ema = d * ema_before + (1 - d) * fast.
    for f, e, v in zip(fast_before_ema, ema_before, critic.ema_weights):
        np.testing.assert_allclose(to_np(v), decay * e + (1 - decay) * f, rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch recipe")
def test_torch_recipe():
    import torch

    ns = recipe("recipe-torch")
    critic, optimizer, params, step = ns["critic"], ns["optimizer"], ns["params"], ns["train_step"]
    assert isinstance(critic, torch.nn.Module)
    assert {id(p) for p in params} == {id(v.value) for v in critic.trainable_variables}
    h, z, targets, weights = (torch.as_tensor(x) for x in batch(critic))
    losses = []
    for _ in range(30):
        ema_before = [to_np(v) for v in critic.ema_weights]
        fast_before = [to_np(v) for v in critic.fast_weights]
        losses.append(step(h, z, targets, weights).item())
        assert not np.array_equal(to_np(critic.fast_weights[0]), fast_before[0])  # the optimizer stepped
    assert losses[-1] < 0.9 * losses[0]
    assert all(v.value.grad is None for v in critic.ema_weights)
    assert not any(
        id(p) in {id(v.value) for v in critic.ema_weights} for g in optimizer.param_groups for p in g["params"]
    )
    check_ema(critic, [to_np(v) for v in critic.fast_weights], ema_before, critic.ema_decay)


@pytest.mark.skipif(BACKEND != "jax", reason="JAX recipe")
def test_jax_recipe():
    ns = recipe("recipe-jax")
    critic, step = ns["critic"], ns["train_step"]
    fast, ema, opt_state = ns["fast"], ns["ema"], ns["opt_state"]
    data = batch(critic)
    losses = []
    for _ in range(30):
        ema_before = [np.asarray(e) for e in ema]
        fast, ema, opt_state, loss = step(fast, ema, opt_state, *data)
        losses.append(float(loss))
    assert losses[-1] < 0.9 * losses[0]
    assert step._cache_size() == 1  # the block's batch and this one share a shape: one compilation
    for v, x in zip(critic.trainable_variables + critic.non_trainable_variables, fast + ema):
        v.assign(x)
    check_ema(critic, [to_np(v) for v in critic.fast_weights], ema_before, critic.ema_decay)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow recipe")
def test_tensorflow_recipe():
    import tensorflow as tf

    from multicritic import critic_loss

    ns = recipe("recipe-tensorflow")
    critic, step = ns["critic"], ns["train_step"]
    data = batch(critic)
    losses = []
    for _ in range(30):
        ema_before = [to_np(v) for v in critic.ema_weights]
        losses.append(float(step(*data)))
    assert losses[-1] < 0.9 * losses[0]
    assert step.experimental_get_tracing_count() == 1
    check_ema(critic, [to_np(v) for v in critic.fast_weights], ema_before, critic.ema_decay)
    with tf.GradientTape(persistent=True) as tape:
        _, logits = critic(*data[:2])
        ema_value, _ = critic(*data[:2], use_ema=True)
        loss = critic_loss(logits, data[2], ema_value, data[3])["total"]
    assert all(g is None for g in tape.gradient(loss, critic.ema_weights))
    assert keras.backend.backend() == "tensorflow"
