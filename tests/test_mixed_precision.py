"""The precision contract under mixed_bfloat16 / mixed_float16 (SPEC §6)."""

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer, critic_loss, two_hot
from tests import half_precision as hp
from tests.conftest import random_inputs, to_np

POLICIES = ("mixed_bfloat16", "mixed_float16")


@pytest.fixture(params=POLICIES)
def policy(request):
    keras.config.set_dtype_policy(request.param)
    yield request.param
    keras.config.set_dtype_policy("float32")


def assert_half_forward(critic, h, z, policy, use_ema=False):
    """The critic's outputs against the float64 reference, within what the half format allows
    (`tests.half_precision`: exact pre-activations, the rest bounded by the format's unit roundoff, never by
    one machine's gaps); the value is the float32 head's decode of those logits, to float32's precision."""
    value, logits = critic(h, z, use_ema=use_ema)
    assert to_np(logits).dtype == np.float32 and to_np(value).dtype == np.float32
    want, bound = hp.logits_bound(critic, h, z, hp.half_dtype(policy), use_ema=use_ema)
    hp.assert_within(to_np(logits), want, bound, f"logits (use_ema={use_ema})")
    decoded, decode_bound = hp.decode_bound(critic, to_np(logits))
    hp.assert_within(to_np(value), decoded, decode_bound, f"value (use_ema={use_ema})")
    # The MLP really computed in half precision (else the check above is vacuous).
    assert np.abs(to_np(logits) - want).max() > 1e3 * hp.UNIT_ROUNDOFF["float32"] * np.abs(want).max()


def test_variables_and_outputs_follow_the_contract(policy):
    critic = CriticNetwork(model_size="XS")
    assert critic.dtype_policy.name == policy
    assert critic.mlp.dense_layers[0].compute_dtype == policy.split("_")[1]
    h, z = hp.exact_dense_case(critic, 32)
    assert all(keras.backend.standardize_dtype(v.dtype) == "float32" for v in critic.weights)
    assert critic.return_layer.reward_buckets_layer.compute_dtype == "float32"
    for use_ema in (False, True):
        assert_half_forward(critic, h, z, policy, use_ema)


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
    critic = CriticNetwork(model_size="nano", **options)
    h, z = hp.exact_dense_case(critic, 16)
    assert all(keras.backend.standardize_dtype(v.dtype) == "float32" for v in critic.weights)
    assert_half_forward(critic, h, z, policy)
    trainer = CriticTrainer(critic, learning_rate=3e-3)
    targets = (np.random.default_rng(0).normal(size=16) * 100).astype(np.float32)
    first = to_np(trainer.train_step(h, z, targets, np.ones(16, np.float32)))
    for _ in range(10):
        last = to_np(trainer.train_step(h, z, targets, np.ones(16, np.float32)))
    assert all(np.isfinite(v) for v in last.values()) and last["value_nll"] < first["value_nll"]
