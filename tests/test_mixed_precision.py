"""The precision contract under mixed_bfloat16 / mixed_float16 (SPEC §6)."""

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer, critic_loss, two_hot
from tests.conftest import random_inputs, randomize, to_np

# Largest gaps to the float32 critic measured in the test below (XS, weights
# N(0, 0.05), 32 inputs; fast and EMA passes), on CPU:
#                  logits             values
#   bf16  tensorflow 4.8e-4, torch 3.6e-4, jax 4.4e-4 | 3.0e-4, 1.4e-4, 1.5e-4
#   fp16  tensorflow 5.6e-5, torch 4.2e-5, jax 5.7e-5 | 2.3e-5, 2.0e-5, 3.0e-5
# on logits of magnitude up to 0.22 (mean |logit| 0.05) and symlog values up
# to 0.08, i.e. about 2e-3 (bf16, 8-bit significand) and 2.6e-4 (fp16, 11-bit)
# of the largest logit. Tolerances: about 4x (logits) to 8x (values) the
# largest gap over the three backends.
TOLERANCE = {"mixed_bfloat16": 2e-3, "mixed_float16": 2.5e-4}


@pytest.fixture(params=sorted(TOLERANCE))
def policy(request):
    keras.config.set_dtype_policy(request.param)
    yield request.param
    keras.config.set_dtype_policy("float32")


def test_variables_and_outputs_follow_the_contract(policy):
    reference = CriticNetwork(model_size="XS", dtype="float32")
    randomize(reference, seed=0, scale=0.05)
    critic = CriticNetwork(model_size="XS")
    assert critic.dtype_policy.name == policy
    assert critic.mlp.dense_layers[0].compute_dtype == policy.split("_")[1]
    critic.set_weights(reference.get_weights())
    assert all(keras.backend.standardize_dtype(v.dtype) == "float32" for v in critic.weights)
    assert critic.return_layer.reward_buckets_layer.compute_dtype == "float32"
    h, z = random_inputs(critic, 32)
    for use_ema in (False, True):
        value, logits = critic(h, z, use_ema=use_ema)
        assert to_np(logits).dtype == np.float32 and to_np(value).dtype == np.float32
        ref_value, ref_logits = reference(h, z, use_ema=use_ema)
        np.testing.assert_allclose(to_np(logits), to_np(ref_logits), rtol=0, atol=TOLERANCE[policy])
        np.testing.assert_allclose(to_np(value), to_np(ref_value), rtol=0, atol=TOLERANCE[policy])
        # The MLP really computed in half precision (else the check above is vacuous).
        assert np.abs(to_np(logits) - to_np(ref_logits)).max() > 0


def test_loss_and_two_hot_are_float32_and_finite_at_extremes(policy):
    logits = np.zeros((4, 3, 255), np.float32)
    logits[0] = 1e4
    logits[1, :, ::3] = -1e4
    targets = np.array([[1e9, -1e9, 0.0]] * 4, np.float32)
    ema = np.zeros((4, 3), np.float32)
    half = keras.ops.cast(logits, "float16" if policy == "mixed_float16" else "bfloat16")
    out = critic_loss(half, targets, ema, np.ones((4, 3), np.float32))
    for value in out.values():
        assert keras.backend.standardize_dtype(value.dtype) == "float32"
        assert np.isfinite(to_np(value))
    assert keras.backend.standardize_dtype(two_hot(targets).dtype) == "float32"


def test_trainer_trains_with_extreme_targets(policy):
    critic = CriticNetwork(model_size="nano")
    trainer = CriticTrainer(critic, learning_rate=3e-3)
    if policy == "mixed_float16":
        assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    h, z = random_inputs(critic, 64)
    targets = np.where(np.arange(64) % 2, 1e9, -1e9).astype(np.float32) * np.random.default_rng(0).random(64).astype(
        np.float32
    )
    first = None
    for _ in range(25):
        metrics = to_np(trainer.train_step(h, z, targets, np.ones(64, np.float32)))
        first = metrics["value_nll"] if first is None else first
        assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["value_nll"] < first
    assert all(np.all(np.isfinite(to_np(v))) for v in critic.weights)
    assert all(keras.backend.standardize_dtype(v.dtype) == "float32" for v in critic.ema_weights)


@pytest.mark.parametrize("options", [{"head": "hl_gauss"}, {"head": "mse"}, {"ensemble_size": 3}], ids=str)
def test_heads_and_ensembles_keep_the_contract(policy, options):
    reference = CriticNetwork(model_size="nano", dtype="float32", **options)
    randomize(reference, seed=0, scale=0.05)
    critic = CriticNetwork(model_size="nano", **options)
    critic.set_weights(reference.get_weights())
    assert all(keras.backend.standardize_dtype(v.dtype) == "float32" for v in critic.weights)
    h, z = random_inputs(critic, 16)
    value, logits = critic(h, z)
    ref_value, ref_logits = reference(h, z)
    assert to_np(logits).dtype == np.float32 and to_np(value).dtype == np.float32
    np.testing.assert_allclose(to_np(logits), to_np(ref_logits), rtol=0, atol=TOLERANCE[policy])
    np.testing.assert_allclose(to_np(value), to_np(ref_value), rtol=0, atol=TOLERANCE[policy])
    trainer = CriticTrainer(critic, learning_rate=3e-3)
    targets = (np.random.default_rng(0).normal(size=16) * 100).astype(np.float32)
    first = to_np(trainer.train_step(h, z, targets, np.ones(16, np.float32)))
    for _ in range(10):
        last = to_np(trainer.train_step(h, z, targets, np.ones(16, np.float32)))
    assert all(np.isfinite(v) for v in last.values()) and last["value_nll"] < first["value_nll"]
