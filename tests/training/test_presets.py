"""`multicritic.training.presets` and the 2024 recipe's trainer options (replay value loss, slow-critic phase)."""

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer

from multicritic.training import presets
from multicritic.training.optimizers import LaProp, LinearWarmup
from tests.conftest import random_inputs, randomize, to_np


def dream_and_replay(critic, t=3, b=2, horizon=4, seed=0):
    rng = np.random.default_rng(seed)
    h, z = random_inputs(critic, (horizon + 1) * t * b, seed)
    rh, rz = random_inputs(critic, t * b, seed + 1)
    return (
        h.reshape(horizon + 1, t * b, -1),
        z.reshape((horizon + 1, t * b) + z.shape[1:]),
        rng.normal(size=(horizon + 1, t * b)).astype("float32"),
        rng.uniform(0.9, 1.0, size=(horizon + 1, t * b)).astype("float32"),
        rh.reshape(t, b, -1),
        rz.reshape((t, b) + rz.shape[1:]),
        rng.normal(size=(t, b)).astype("float32"),
        np.eye(t, b, dtype="float32")[::-1].copy(),
        np.zeros((t, b), "float32"),
    )


def test_rllib_2023_is_the_default_configuration():
    critic, trainer, normalizer = presets.build("rllib-2023", model_size="nano")
    assert critic.get_config() == CriticNetwork(model_size="nano").get_config()
    plain = CriticTrainer(CriticNetwork(model_size="nano"))
    assert trainer.options() == plain.options()
    assert type(trainer.optimizer) is type(plain.optimizer)
    assert normalizer.impl == "perc_ema"


def test_dreamerv3_2024_builds_the_official_configuration():
    critic, trainer, normalizer = presets.build("dreamerv3-2024", model_size="1m")
    config = critic.get_config()
    assert (config["gru_units"], config["num_z_categoricals"], config["num_z_classes"]) == (512, 32, 4)
    assert (config["num_dense_layers"], config["dense_hidden_units"]) == (3, 64)
    assert (config["bin_scheme"], config["norm"], config["norm_epsilon"], config["use_bias"]) == (
        "symexp",
        "rms",
        1e-4,
        True,
    )
    assert isinstance(critic.kernel_initializer, keras.initializers.VarianceScaling)
    assert critic.kernel_initializer.distribution == "truncated_normal" and critic.kernel_initializer.mode == "fan_in"
    assert isinstance(trainer.optimizer, LaProp)
    schedule = keras.optimizers.serialize(trainer.optimizer)["config"]["learning_rate"]
    assert keras.saving.deserialize_keras_object(schedule).get_config() == LinearWarmup(4e-5, 1000).get_config()
    options = trainer.options()
    assert options["grad_clip"] is None and options["gamma"] == 1.0 and options["replay_loss_weight"] == 0.3
    assert normalizer.impl == "perc" and normalizer.limit == 1.0
    # The head starts at zero: every value is exactly 0 (the official outscale 0).
    values, _ = critic(*random_inputs(critic, 4))
    np.testing.assert_array_equal(to_np(values), 0.0)
    # Warm-up: the first update moves no weight.
    before = [to_np(v).copy() for v in critic.trainable_variables]
    metrics = trainer.train_on_dream_and_replay(*dream_and_replay(critic))
    assert np.isfinite(float(to_np(metrics["total"])))
    for v, b in zip(critic.trainable_variables, before):
        np.testing.assert_array_equal(to_np(v), b)
    with pytest.raises(ValueError, match="preset: got 'dreamer'"):
        presets.build("dreamer")
    with pytest.raises(ValueError, match="model_size: got 'XS'"):
        presets.build("dreamerv3-2024", model_size="XS")


def test_size_is_a_deprecated_alias_of_model_size():
    # One spelling across the API (CriticNetwork(model_size=...)); the old keyword still builds the same preset.
    with pytest.warns(DeprecationWarning, match=r"presets\.build\(model_size=\.\.\.\)"):
        old = presets.build("rllib-2023", size="nano")
    assert old.critic.get_config() == presets.build("rllib-2023", model_size="nano").critic.get_config()
    with pytest.warns(DeprecationWarning, match=r"presets\.options\(model_size=\.\.\.\)"):
        old_options = presets.options("dreamerv3-2024", size="1m")
    new_options = presets.options("dreamerv3-2024", model_size="1m")
    assert {k: v for k, v in old_options["critic"].items() if k != "kernel_initializer"} == {
        k: v for k, v in new_options["critic"].items() if k != "kernel_initializer"
    }
    assert old_options["critic"]["gru_units"] == 512
    with pytest.raises(ValueError, match="size: got 'nano' with model_size='XS'"):
        presets.build("rllib-2023", model_size="XS", size="nano")


def test_replay_loss_adds_its_weighted_share():
    critic = CriticNetwork(model_size="nano")
    randomize(critic, seed=2)
    data = dream_and_replay(critic)
    with_replay = CriticTrainer(critic, replay_loss_weight=0.5)
    metrics = {
        k: float(v)
        for k, v in to_np(with_replay.dream_and_replay_loss(*[keras.ops.convert_to_tensor(x) for x in data])[1]).items()
    }
    _, dream = with_replay.dream_loss(*[keras.ops.convert_to_tensor(x) for x in data[:4]])
    np.testing.assert_allclose(
        metrics["total"], float(to_np(dream["total"])) + 0.5 * metrics["repval/total"], rtol=1e-6
    )
    assert metrics["repval/value_nll"] > 0


def test_replay_batches_are_checked():
    critic = CriticNetwork(model_size="nano")
    trainer = CriticTrainer(critic)
    data = list(dream_and_replay(critic))
    before = [to_np(v).copy() for v in critic.weights]
    bad = list(data)
    bad[4], bad[5] = data[4][:, :1], data[5][:, :1]
    bad[6], bad[7], bad[8] = data[6][:, :1], data[7][:, :1], data[8][:, :1]
    with pytest.raises(ValueError, match="expected T \\* B = 3"):
        trainer.train_on_dream_and_replay(*bad)
    bad = list(data)
    bad[7] = data[7] * 0.5
    with pytest.raises(ValueError, match="replay_is_last: got values other than 0 and 1"):
        trainer.train_on_dream_and_replay(*bad)
    bad = list(data)
    bad[6] = data[6][:2]
    with pytest.raises(ValueError, match="replay_rewards: got shape"):
        trainer.train_on_dream_and_replay(*bad)
    for v, b in zip(critic.weights, before):
        np.testing.assert_array_equal(to_np(v), b)


@pytest.mark.parametrize("first, moves", [(False, [False, False, True, False]), (True, [True, False, False, True])])
def test_ema_update_phase(first, moves):
    """Period 3: RLlib updates the EMA at steps 3, 6, ...; the official slow critic at steps 1, 4, ..."""
    critic = CriticNetwork(model_size="nano")
    randomize(critic, seed=1)
    trainer = CriticTrainer(critic, ema_update_period=3, ema_update_first=first, learning_rate=1e-2)
    h, z = random_inputs(critic, 16)
    targets, weights = np.linspace(-5, 5, 16).astype("float32"), np.ones(16, "float32")
    for moved in moves:
        before = to_np(critic.ema_weights[0]).copy()
        trainer.train_step(h, z, targets, weights)
        assert (not np.array_equal(to_np(critic.ema_weights[0]), before)) == moved


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(critic_options=[1, 2]), "critic_options: got a list, expected a dict of overrides or None"),
        (dict(trainer_options="fast"), "trainer_options: got a str"),
        (dict(critic_options={"ema_decays": 0.5}), "critic_options: got the option 'ema_decays'"),
        (dict(trainer_options={"lr": 1e-3}), "trainer_options: got the option 'lr'"),
        (dict(trainer_options={"gamma": 2.0}), "gamma: got 2.0"),
    ],
)
def test_bad_overrides_are_refused_by_name(kwargs, match):
    """Finding 15: `critic_options=[1, 2]` raised a raw TypeError; unknown options a TypeError from deep inside."""
    with pytest.raises(ValueError, match=match):
        presets.build("rllib-2023", model_size="nano", **kwargs)
    with pytest.raises(ValueError, match=r"preset: got 3"):
        presets.options(3)
