"""Parity with RLlib's own TensorFlow DreamerV3 code (goldens from tests/data/generate_rllib_goldens.py)."""

import numpy as np
import pytest

from multicritic import (
    CriticNetwork,
    CriticTrainer,
    critic_loss,
    export_rllib_weights,
    inverse_symlog,
    lambda_returns,
    load_rllib_weights,
    symlog,
    two_hot,
)
from multicritic.interop.rllib import rllib_weight_names
from tests import rllib_golden as spec
from tests.conftest import grads_of, to_np


@pytest.fixture(scope="module")
def golden():
    return dict(np.load(spec.GOLDENS))


def scaled_close(got, want, rel=2e-6):
    # float32 results of two libraries: allow a few ulps of the output's scale.
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("size", spec.FORWARD_SIZES)
def test_forward_matches_rllib(size, golden):
    critic = CriticNetwork(model_size=size)
    load_rllib_weights(critic, spec.rllib_weights(size))
    h, z = spec.forward_inputs(size)
    for use_ema in (False, True):
        tag = f"{size}_{'ema' if use_ema else 'fast'}"
        value, logits = critic(h, z, use_ema=use_ema)
        scaled_close(to_np(logits), golden[f"forward_{tag}_logits"])
        np.testing.assert_allclose(to_np(value), golden[f"forward_{tag}_value"], atol=1e-4)


@pytest.mark.parametrize("size", spec.FORWARD_SIZES)
def test_fresh_critic_matches_rllib(size, golden):
    critic = CriticNetwork(model_size=size)
    h, z = spec.forward_inputs(size)
    np.testing.assert_allclose(to_np(critic(h, z)[0]), golden[f"fresh_{size}_value"], atol=2e-7)


def test_weight_round_trip_and_names():
    critic = CriticNetwork(model_size="S")
    weights = spec.rllib_weights("S")
    load_rllib_weights(critic, weights)
    for a, b in zip(export_rllib_weights(critic), weights):
        np.testing.assert_array_equal(a, b)
    names = rllib_weight_names(critic)
    assert names[:7] == [
        "mlp/dense_0/kernel",
        "mlp/dense_1/kernel",
        "mlp/layer_norm_0/gamma",
        "mlp/layer_norm_0/beta",
        "mlp/layer_norm_1/gamma",
        "mlp/layer_norm_1/beta",
        "return_layer/kernel",
    ]
    assert names[8] == "mlp_ema/dense_0/kernel" and len(names) == 16


def test_bad_weight_lists_leave_the_critic_unchanged():
    critic = CriticNetwork(model_size="nano")
    before = [to_np(v) for v in critic.weights]
    weights = spec.rllib_weights("nano")
    with pytest.raises(ValueError, match=r"weights: got 9 arrays, expected 10"):
        load_rllib_weights(critic, weights[:-1])
    bad = list(weights)
    bad[8] = np.zeros((16, 101), np.float32)  # an EMA head with 101 buckets
    with pytest.raises(
        ValueError, match=r"weights\[8\] \(return_layer_ema/kernel\): got shape \[16, 101\], expected \[16, 255\]"
    ):
        load_rllib_weights(critic, bad)
    for b, v in zip(before, critic.weights):
        np.testing.assert_array_equal(to_np(v), b)


def test_two_hot_is_bit_identical_to_rllib(golden):
    values = spec.two_hot_values()
    np.testing.assert_array_equal(to_np(two_hot(values)), golden["two_hot"])
    np.testing.assert_array_equal(to_np(two_hot(values / 4.0, 11, -5.0, 5.0)), golden["two_hot_11"])


def test_symlog_matches_rllib(golden):
    # log1p / expm1 where RLlib writes log(x + 1) / exp(x) - 1: equal up to
    # rounding, and exact for tiny |x| where the reference rounds to 0.
    np.testing.assert_allclose(to_np(symlog(spec.symlog_values())), golden["symlog"], rtol=2e-7, atol=5e-8)
    np.testing.assert_allclose(to_np(inverse_symlog(golden["symlog"])), golden["inverse_symlog"], rtol=5e-7, atol=1e-7)


def test_value_targets_are_bit_identical_to_rllib(golden):
    np.testing.assert_array_equal(to_np(lambda_returns(*spec.return_inputs())), golden["value_targets"])


def test_critic_loss_matches_rllib(golden):
    logits, ema, weights = spec.loss_inputs()
    out = to_np(critic_loss(logits[:-1], golden["value_targets"], ema[:-1], weights[:-1]))
    np.testing.assert_allclose(out["total"], golden["loss_total"], rtol=2e-6)
    np.testing.assert_allclose(out["value_nll"], golden["loss_value_nll"], rtol=2e-6)
    np.testing.assert_allclose(out["ema_regularizer"], golden["loss_ema_regularizer"], rtol=2e-6)
    grad = to_np(
        grads_of(lambda lg: critic_loss(lg, golden["value_targets"], ema[:-1], weights[:-1])["total"], logits[:-1])[0]
    )
    np.testing.assert_allclose(grad, golden["loss_grad_logits"][:-1], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(golden["loss_grad_logits"][-1], 0.0)


def test_training_trajectory_matches_rllib(golden):
    critic = CriticNetwork(model_size=spec.TRAJECTORY_SIZE)
    load_rllib_weights(critic, spec.rllib_weights(spec.TRAJECTORY_SIZE, ema_equals_fast=True))
    trainer = CriticTrainer(critic)
    for step in range(spec.TRAJECTORY_STEPS):
        metrics = to_np(trainer.train_on_dream(*spec.dream_batch(step)))
        for key in ("total", "value_nll", "ema_regularizer", "grad_norm"):
            np.testing.assert_allclose(metrics[key], golden[f"traj_{step}_{key}"], rtol=2e-6, err_msg=f"{key} {step}")
    for i, w in enumerate(export_rllib_weights(critic)):
        np.testing.assert_allclose(
            w, golden[f"traj_final_{i}"], rtol=0, atol=1e-6, err_msg=rllib_weight_names(critic)[i]
        )


@pytest.mark.parametrize("member", [0, 2])
def test_an_rllib_critic_loads_into_any_ensemble_member(member, golden):
    size = spec.FORWARD_SIZES[0]
    ensemble = CriticNetwork(model_size=size, ensemble_size=3)
    others = [to_np(v).copy() for v in ensemble.weights]
    load_rllib_weights(ensemble, spec.rllib_weights(size), member=member)
    h, z = spec.forward_inputs(size)
    for use_ema in (False, True):
        tag = f"{size}_{'ema' if use_ema else 'fast'}"
        logits = to_np(ensemble(h, z, use_ema=use_ema)[1])[member]
        scaled_close(logits, golden[f"forward_{tag}_logits"], rel=1e-5)
    for var, before in zip(ensemble.weights, others):  # the other members are untouched
        kept = [k for k in range(3) if k != member]
        np.testing.assert_array_equal(to_np(var)[kept], before[kept])
    exported = export_rllib_weights(ensemble, member=member)
    for got, want in zip(exported, spec.rllib_weights(size)):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match=r"member: got None for an ensemble of 3"):
        load_rllib_weights(ensemble, spec.rllib_weights(size))
    with pytest.raises(ValueError, match=r"member: got 3, expected an integer in \[0, 3\)"):
        export_rllib_weights(ensemble, member=3)
