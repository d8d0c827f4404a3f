"""The README's recipes for training the critic with each framework's own tools, no CriticTrainer."""

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, critic_loss
from tests.conftest import BACKEND, random_inputs, to_np


def batch(critic, n=64, seed=0):
    h, z = random_inputs(critic, n, seed)
    rng = np.random.default_rng(seed)
    return h, z, (20 * rng.normal(size=n)).astype(np.float32), np.ones(n, np.float32)


def check_ema(critic, fast_before_ema, ema_before, decay):
    # After the loop's last update: ema = d * ema_before + (1 - d) * fast.
    for f, e, v in zip(fast_before_ema, ema_before, critic.ema_weights):
        np.testing.assert_allclose(to_np(v), decay * e + (1 - decay) * f, rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch recipe")
def test_torch_recipe():
    import torch

    critic = CriticNetwork(model_size="nano")
    assert isinstance(critic, torch.nn.Module)
    params = [p for p in critic.parameters() if p.requires_grad]
    assert {id(p) for p in params} == {id(v.value) for v in critic.trainable_variables}
    optimizer = torch.optim.Adam(params, lr=3e-3, eps=1e-5)
    h, z, targets, weights = (torch.as_tensor(x) for x in batch(critic))
    losses = []
    for _ in range(30):
        value, logits = critic(h, z)
        with torch.no_grad():
            ema_value, _ = critic(h, z, use_ema=True)
        loss = critic_loss(logits, targets, ema_value, weights)["total"]
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 100.0)
        optimizer.step()
        ema_before = [to_np(v) for v in critic.ema_weights]
        critic.update_ema()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]
    assert all(v.value.grad is None for v in critic.ema_weights)
    assert not any(id(p) in {id(v.value) for v in critic.ema_weights} for g in optimizer.param_groups for p in g["params"])
    check_ema(critic, [to_np(v) for v in critic.fast_weights], ema_before, critic.ema_decay)


@pytest.mark.skipif(BACKEND != "jax", reason="JAX recipe")
def test_jax_recipe():
    import jax
    import optax

    critic = CriticNetwork(model_size="nano")
    tx = optax.chain(optax.clip_by_global_norm(100.0), optax.adam(3e-3, eps=1e-5))
    fast = [v.value for v in critic.trainable_variables]
    ema = [v.value for v in critic.non_trainable_variables]
    opt_state = tx.init(fast)

    @jax.jit
    def step(fast, ema, opt_state, h, z, targets, weights):
        def loss_fn(fast):
            (_, logits), _ = critic.stateless_call(fast, ema, h, z)
            (ema_value, _), _ = critic.stateless_call(fast, ema, h, z, use_ema=True)
            return critic_loss(logits, targets, ema_value, weights)["total"]

        loss, grads = jax.value_and_grad(loss_fn)(fast)
        updates, opt_state = tx.update(grads, opt_state, fast)
        fast = optax.apply_updates(fast, updates)
        return fast, critic.compute_ema(fast, ema), opt_state, loss

    data = batch(critic)
    losses = []
    for _ in range(30):
        ema_before = [np.asarray(e) for e in ema]
        fast, ema, opt_state, loss = step(fast, ema, opt_state, *data)
        losses.append(float(loss))
    assert losses[-1] < 0.9 * losses[0]
    assert step._cache_size() == 1
    for v, x in zip(critic.trainable_variables + critic.non_trainable_variables, fast + ema):
        v.assign(x)
    check_ema(critic, [to_np(v) for v in critic.fast_weights], ema_before, critic.ema_decay)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow recipe")
def test_tensorflow_recipe():
    import tensorflow as tf

    critic = CriticNetwork(model_size="nano")
    optimizer = keras.optimizers.Adam(learning_rate=3e-3, epsilon=1e-5)
    optimizer.build(critic.trainable_variables)  # slots exist before tracing: one trace

    @tf.function
    def step(h, z, targets, weights):
        with tf.GradientTape() as tape:
            _, logits = critic(h, z)
            ema_value, _ = critic(h, z, use_ema=True)
            loss = critic_loss(logits, targets, ema_value, weights)["total"]
        grads = tape.gradient(loss, critic.trainable_variables)
        grads, _ = tf.clip_by_global_norm(grads, 100.0)
        optimizer.apply(grads, critic.trainable_variables)
        critic.update_ema()
        return loss

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
