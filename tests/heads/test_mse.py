"""The symlog MSE head: shapes, loss, gradients."""

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, critic_loss
from tests.conftest import grads_of, randomize, to_np


def test_forward_is_the_scalar_output():
    critic = CriticNetwork(model_size="nano", head="mse")
    h, z = np.ones((5, 16), "float32"), np.ones((5, 4, 4), "float32")
    value, logits = critic(h, z)
    assert tuple(logits.shape) == (5, 1)
    np.testing.assert_array_equal(to_np(value), 0.0)  # zero-initialised
    randomize(critic, seed=1)
    value, logits = critic(h, z)
    np.testing.assert_array_equal(to_np(value), to_np(logits)[:, 0])


def test_loss_and_gradient():
    rng = np.random.default_rng(3)
    pred = rng.normal(size=(7, 1)).astype(np.float32)
    targets = (rng.normal(size=7) * 50).astype(np.float32)
    ema = rng.normal(size=7).astype(np.float32)
    weights = rng.uniform(0.1, 1.0, size=7).astype(np.float32)
    goal = np.sign(targets) * np.log1p(np.abs(targets))
    nll = 0.5 * (pred[:, 0] - goal) ** 2
    reg = 0.5 * (pred[:, 0] - ema) ** 2

    fixed = [keras.ops.convert_to_tensor(x) for x in (targets, ema, weights)]

    def total(p):
        return critic_loss(p, *fixed, head="mse", ema_regularizer_weight=0.3)["total"]

    out = to_np(critic_loss(pred, targets, ema, weights, head="mse", ema_regularizer_weight=0.3))
    np.testing.assert_allclose(out["total"], np.mean((nll + 0.3 * reg) * weights), rtol=1e-5)
    assert out["clipped_fraction"] == 0.0
    want = ((pred[:, 0] - goal) + 0.3 * (pred[:, 0] - ema)) * weights / 7
    np.testing.assert_allclose(to_np(grads_of(total, pred)[0])[:, 0], want, rtol=1e-5, atol=1e-7)


def test_the_distribution_regularizer_is_refused():
    pred = np.zeros((2, 1), np.float32)
    with pytest.raises(ValueError, match="ema_regularizer: got 'distribution' with head='mse'"):
        critic_loss(pred, np.zeros(2), None, np.ones(2), head="mse", ema_regularizer="distribution", ema_logits=pred)
    with pytest.raises(ValueError, match=r"logits: got shape \[2, 255\], expected \[..., units=1\]"):
        critic_loss(np.zeros((2, 255)), np.zeros(2), np.zeros(2), np.ones(2), head="mse")
