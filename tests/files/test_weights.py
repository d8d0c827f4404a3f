"""Issue 72 item 9: a critic built from its file (`CriticNetwork.from_weights_file`), from the configuration the
file holds, with every check `load_weights` makes."""

import h5py
import keras
import numpy as np
import pytest

from multicritic import CriticNetwork
from multicritic.files.weights import CONFIG_ATTR
from tests.conftest import random_inputs, randomize, to_np

# Options away from the defaults, so that a critic built with the defaults could not hold these weights.
OPTIONS = dict(
    model_size=None,
    gru_units=8,
    num_z_categoricals=2,
    num_z_classes=3,
    num_dense_layers=2,
    dense_hidden_units=8,
    num_buckets=11,
    bin_scheme="symexp",
    ensemble_size=2,
    norm="rms",
)


def weights_of(model):
    return [to_np(v).copy() for v in model.weights]


@pytest.fixture
def saved(tmp_path):
    """A critic of `OPTIONS` with random fast weights and other EMA weights, and its sealed `.weights.h5`."""
    critic = CriticNetwork(**OPTIONS)
    randomize(critic, seed=3)
    rng = np.random.default_rng(4)
    for v in critic.ema_weights:
        v.assign(rng.normal(scale=0.3, size=tuple(v.shape)).astype("float32"))
    return critic, critic.save_weights(tmp_path / "critic.weights.h5")


def assert_same_critic(got, critic):
    assert type(got) is CriticNetwork and got.built
    want_config = {k: v for k, v in critic.get_config().items() if k != "name"}
    assert {k: v for k, v in got.get_config().items() if k != "name"} == want_config
    for a, b in zip(weights_of(got), weights_of(critic), strict=True):
        np.testing.assert_array_equal(a, b)
    h, z = random_inputs(critic, 5, seed=1)
    for use_ema in (False, True):
        for a, b in zip(got(h, z, use_ema=use_ema), critic(h, z, use_ema=use_ema)):
            np.testing.assert_array_equal(to_np(a), to_np(b))


def test_a_critic_from_its_weights_file(saved):
    critic, path = saved
    assert_same_critic(CriticNetwork.from_weights_file(path), critic)


def test_a_critic_from_its_keras_file(saved, tmp_path):
    critic, _ = saved
    path = tmp_path / "critic.keras"
    critic.save(path)
    assert_same_critic(CriticNetwork.from_weights_file(path), critic)
    # And Keras's own loader, which needs no configuration either.
    assert_same_critic(keras.models.load_model(path), critic)


def test_overrides_build_with_other_options(saved):
    critic, path = saved
    got = CriticNetwork.from_weights_file(path, dtype="mixed_bfloat16", name="restored")
    assert got.name == "restored" and got.dtype_policy.name == "mixed_bfloat16"
    for a, b in zip(weights_of(got), weights_of(critic), strict=True):
        np.testing.assert_array_equal(a, b)  # float32 variables under the mixed policy: the same numbers


def test_an_architecture_override_is_refused_naming_the_difference(saved):
    _, path = saved
    with pytest.raises(ValueError, match=r"holds another critic configuration: num_buckets: saved 11, this one 21"):
        CriticNetwork.from_weights_file(path, num_buckets=21)


def test_an_unknown_override_is_refused(saved):
    _, path = saved
    with pytest.raises(ValueError, match=r"^num_bucket: not an option of the critic '.*critic.weights.h5' holds"):
        CriticNetwork.from_weights_file(path, num_bucket=21)


def test_a_plain_keras_weights_file_has_no_configuration(saved, tmp_path):
    critic, _ = saved
    plain = tmp_path / "plain.weights.h5"
    keras.Model.save_weights(critic, str(plain))  # plain Keras: no config, no seal
    with h5py.File(plain, "r") as f:
        assert CONFIG_ATTR not in f.attrs
    with pytest.raises(ValueError, match=r"filepath: '.*plain.weights.h5' holds no critic configuration"):
        CriticNetwork.from_weights_file(plain)
    # The way it says: build the critic with its options, then load_weights.
    other = CriticNetwork(**OPTIONS)
    other.load_weights(plain)
    assert_same_critic(other, critic)


def test_a_damaged_file_is_refused(saved, tmp_path):
    _, path = saved
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    damaged = tmp_path / "damaged.weights.h5"
    damaged.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="fails its SHA-256 check"):
        CriticNetwork.from_weights_file(damaged)


def test_a_keras_file_of_another_model_is_refused(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    path = tmp_path / "other.keras"
    model.save(path)
    with pytest.raises(ValueError, match=r"filepath: '.*other.keras' holds a Sequential, expected a CriticNetwork"):
        CriticNetwork.from_weights_file(path)


@pytest.mark.parametrize("bad", [None, 3, b"x"])
def test_a_non_path_is_refused(bad):
    with pytest.raises(ValueError, match=r"filepath: "):
        CriticNetwork.from_weights_file(bad)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"filepath: .*missing.weights.h5.* is not a readable file"):
        CriticNetwork.from_weights_file(tmp_path / "missing.weights.h5")
