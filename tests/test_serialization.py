import json
import os

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, MLP, RewardPredictorLayer
from tests.conftest import random_inputs, randomize, to_np
from tests.portable import OPTIONS

DATA = os.path.join(os.path.dirname(__file__), "data")
GOLDEN = dict(np.load(os.path.join(DATA, "golden_outputs.npz")))


def outputs(critic, h, z):
    return [to_np(x) for use_ema in (False, True) for x in critic(h, z, use_ema=use_ema)]


def check_golden(critic, atol=1e-6):
    got = outputs(critic, GOLDEN["h"], GOLDEN["z"])
    want = [GOLDEN["fast_value"], GOLDEN["fast_logits"], GOLDEN["ema_value"], GOLDEN["ema_logits"]]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=atol)


def test_keras_file_round_trip_keeps_fast_and_ema_weights_and_options(tmp_path):
    critic = CriticNetwork(**OPTIONS)
    randomize(critic, seed=3)
    rng = np.random.default_rng(4)
    for v in critic.ema_weights:
        v.assign(rng.normal(scale=0.2, size=tuple(v.shape)).astype("float32"))
    path = str(tmp_path / "critic.keras")
    critic.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, CriticNetwork)
    assert loaded.get_config() == critic.get_config()
    for a, b in zip(loaded.weights, critic.weights):
        np.testing.assert_array_equal(to_np(a), to_np(b))
    h, z = random_inputs(critic, 6)
    for a, b in zip(outputs(loaded, h, z), outputs(critic, h, z)):
        np.testing.assert_array_equal(a, b)
    assert all(not v.trainable for v in loaded.ema_weights)
    assert len(loaded.trainable_variables) == len(critic.trainable_variables)


def test_layers_round_trip_through_keras_serialization():
    for layer in (
        MLP(model_size="nano", output_layer_size=3),
        RewardPredictorLayer(num_buckets=11, bin_scheme="symexp"),
    ):
        config = keras.saving.serialize_keras_object(layer)
        assert config["registered_name"].startswith("multicritic>")
        clone = keras.saving.deserialize_keras_object(json.loads(json.dumps(config)))
        assert type(clone) is type(layer) and clone.get_config() == layer.get_config()


def test_golden_weights_file_loads_on_this_backend():
    critic = CriticNetwork(**OPTIONS)
    critic.load_weights(os.path.join(DATA, "golden_critic.weights.h5"))
    check_golden(critic)


def test_golden_keras_file_loads_on_this_backend():
    critic = keras.saving.load_model(os.path.join(DATA, "golden_critic.keras"))
    assert critic.bin_scheme == "symexp" and critic.num_buckets == 101 and critic.ema_decay == 0.9
    check_golden(critic)


@pytest.mark.parametrize(
    "kwargs",
    [dict(OPTIONS, model_size="nano"), dict(OPTIONS, num_buckets=255), dict(OPTIONS, model_size="mini")],
)
def test_loading_another_architecture_fails_and_changes_nothing(kwargs):
    critic = CriticNetwork(**kwargs)
    before = [to_np(v) for v in critic.weights]
    with pytest.raises(ValueError, match="load_weights: could not load .* its weights are unchanged"):
        critic.load_weights(os.path.join(DATA, "golden_critic.weights.h5"))
    for b, v in zip(before, critic.weights):
        np.testing.assert_array_equal(to_np(v), b)


def test_loading_a_truncated_file_fails_and_changes_nothing(tmp_path):
    data = open(os.path.join(DATA, "golden_critic.weights.h5"), "rb").read()
    path = tmp_path / "broken.weights.h5"
    path.write_bytes(data[: len(data) // 2])
    critic = CriticNetwork(**OPTIONS)
    before = [to_np(v) for v in critic.weights]
    with pytest.raises(ValueError, match="load_weights: could not load"):
        critic.load_weights(str(path))
    for b, v in zip(before, critic.weights):
        np.testing.assert_array_equal(to_np(v), b)


# Checkpoints saved on each backend and loaded on each of the others (and the
# goldens on every backend): tests/test_cross_backend_checkpoints.py.
