"""Every load is all or nothing: damaged, altered or mismatched files are refused with the state bit-identical."""

import functools
import io
import json

import h5py
import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multicritic import CriticNetwork, CriticTrainer, export_rllib_weights, load_rllib_weights
from tests.conftest import random_inputs, randomize, to_np

SMALL = dict(
    model_size=None,
    gru_units=8,
    num_z_categoricals=2,
    num_z_classes=3,
    num_dense_layers=1,
    dense_hidden_units=8,
    num_buckets=11,
)


def weights_of(model):
    return [to_np(v).copy() for v in model.weights]


def assert_same(model, before):
    for a, b in zip(weights_of(model), before):
        np.testing.assert_array_equal(a, b)


def critic_and_trainer(seed=0, step=False, **kwargs):
    critic = CriticNetwork(**dict(SMALL, **kwargs))
    randomize(critic, seed=seed)
    trainer = CriticTrainer(critic, learning_rate=1e-3)
    if step:  # optimizer slots and counter away from their initial values
        h, z = random_inputs(critic, 16, seed)
        trainer.train_step(h, z, np.linspace(-5, 5, 16).astype("float32"), np.ones(16, "float32"))
    return critic, trainer


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory):
    _, trainer = critic_and_trainer(step=True)
    return trainer.save(tmp_path_factory.mktemp("trained") / "t")


def trainer_state(trainer):
    return [to_np(v).copy() for v in trainer.state_variables]


# --------------------------------------------------------------------- .weights.h5


def test_weights_file_round_trip_is_exact_and_sealed(tmp_path):
    critic, _ = critic_and_trainer()
    path = critic.save_weights(tmp_path / "c.weights.h5")
    data = open(path, "rb").read()
    assert b"\n#multicritic-sha256:" in data[-90:]
    with h5py.File(path, "r") as f:  # still an ordinary .weights.h5 for h5py (and Keras)
        assert "multicritic_config" in f.attrs
    other = CriticNetwork(**SMALL, name="another_name")  # names do not matter
    other.load_weights(path)
    for a, b in zip(weights_of(other), weights_of(critic)):
        np.testing.assert_array_equal(a, b)


def test_two_layer_file_into_one_layer_critic_is_refused(tmp_path):
    """Finding 5: Keras alone took layer 0 and the head and dropped the extra layer."""
    two, _ = critic_and_trainer(num_dense_layers=2)
    path = two.save_weights(tmp_path / "two.weights.h5")
    one = CriticNetwork(**SMALL)
    before = weights_of(one)
    with pytest.raises(ValueError, match="num_dense_layers: saved 2, this one 1"):
        one.load_weights(path)
    assert_same(one, before)
    # Without the saved config (a plain Keras file) the extra arrays are refused too.
    plain = tmp_path / "plain.weights.h5"
    keras_save = functools.partial(keras.Model.save_weights, two)  # plain Keras: no config, no seal
    keras_save(str(plain))
    with pytest.raises(ValueError, match=r"holds 16 arrays, expected 10: unexpected"):
        one.load_weights(plain)
    assert_same(one, before)


def test_other_bin_scheme_is_refused(tmp_path):
    """Finding 6: a symexp critic's weights loaded into a uniform_symlog critic (14.1 became 0.05)."""
    symexp, _ = critic_and_trainer(bin_scheme="symexp")
    path = symexp.save_weights(tmp_path / "s.weights.h5")
    uniform = CriticNetwork(**SMALL)
    before = weights_of(uniform)
    with pytest.raises(ValueError, match="bin_scheme: saved 'symexp', this one 'uniform_symlog'"):
        uniform.load_weights(path)
    assert_same(uniform, before)


def test_nonfinite_weights_are_refused(tmp_path):
    """Finding 14: NaN weights loaded from .weights.h5."""
    critic, _ = critic_and_trainer()
    plain = tmp_path / "nan.weights.h5"
    keras.Model.save_weights(critic, str(plain))  # plain Keras: no config, no seal
    with h5py.File(plain, "a") as f:
        f["layers/mlp/dense_layers/dense/vars/0"][0, 0] = np.nan
    target = CriticNetwork(**SMALL)
    before = weights_of(target)
    with pytest.raises(ValueError, match=r"dense/vars/0: got 1 non-finite value"):
        target.load_weights(plain)
    assert_same(target, before)


def test_keras_archive_is_checked_too(tmp_path):
    critic, _ = critic_and_trainer(bin_scheme="symexp")
    path = str(tmp_path / "c.keras")
    critic.save(path)
    target = CriticNetwork(**SMALL)
    before = weights_of(target)
    with pytest.raises(ValueError, match="bin_scheme: saved 'symexp'"):
        target.load_weights(path)
    assert_same(target, before)
    same = CriticNetwork(**dict(SMALL, bin_scheme="symexp"))
    same.load_weights(path)
    for a, b in zip(weights_of(same), weights_of(critic)):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------- trainer .npz


def test_string_dtype_array_is_refused_before_any_assignment(tmp_path, trained_checkpoint):
    """Finding 1: the cast happened inside the assignment loop, after earlier weights were overwritten."""
    path = trained_checkpoint
    data = open(path, "rb").read()
    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files}
    keys = [k for k in arrays if k != "meta"]
    middle = keys[len(keys) // 2]
    arrays[middle] = np.full(arrays[middle].shape, "x")
    np.savez(tmp_path / "bad.npz", **arrays)  # unsealed: refused for that alone
    other_critic, other = critic_and_trainer(seed=3)
    before = trainer_state(other)
    with pytest.raises(ValueError, match="no SHA-256 seal"):
        other.restore(tmp_path / "bad.npz")
    # Sealed (as if written by a buggy writer): refused for the dtype, still before any assignment.
    from multicritic.files import integrity

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    (tmp_path / "sealed.npz").write_bytes(integrity.sealed_bytes(buffer.getvalue()))
    with pytest.raises(ValueError, match=rf"{middle}: got dtype <U1, expected"):
        other.restore(tmp_path / "sealed.npz")
    for a, b in zip(trainer_state(other), before):
        np.testing.assert_array_equal(a, b)
    assert open(path, "rb").read() == data  # the original file is untouched


def _rewrite(path, out, edit_meta=None, edit_arrays=None):
    from multicritic.files import integrity

    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files}
    meta = json.loads(str(arrays.pop("meta")))
    if edit_meta:
        meta = edit_meta(meta)
    if edit_arrays:
        edit_arrays(arrays)
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.array(json.dumps(meta)), **arrays)
    out.write_bytes(integrity.sealed_bytes(buffer.getvalue()))
    return out


@pytest.mark.parametrize(
    "edit_meta, edit_arrays, match",
    [
        (
            lambda m: dict(m, trainer_options=dict(m["trainer_options"], gamma=0.5)),
            None,
            r"other trainer options: gamma: saved 0.5, this one 0.997",
        ),
        (
            lambda m: dict(m, critic_config=dict(m["critic_config"], bin_scheme="symexp")),
            None,
            r"bin_scheme: saved 'symexp', this one 'uniform_symlog'",
        ),
        (
            lambda m: dict(m, critic_config=dict(m["critic_config"], ema_decay=0.5)),
            None,
            r"ema_decay: saved 0.5, this one 0.98",
        ),
        (lambda m: [1, 2], None, r"metadata is a list, expected a JSON object"),
        (lambda m: dict(m, critic_config="x"), None, r"metadata 'critic_config' is str, expected a JSON object"),
        (
            lambda m: {k: v for k, v in m.items() if k != "trainer_options"},
            None,
            r"metadata 'trainer_options' is NoneType",
        ),
        (lambda m: dict(m, format="something-else"), None, r"has format 'something-else'"),
        (None, lambda a: a.pop("trainer/steps"), r"missing \['trainer/steps'\]"),
        (None, lambda a: a.update({"critic/extra": np.zeros(3, np.float32)}), r"unexpected \['critic/extra'\]"),
        (
            None,
            lambda a: a.update({"trainer/steps": np.array(1.5)}),
            r"trainer/steps: got dtype float64, expected int32",
        ),
        (None, lambda a: a["critic/mlp/dense_0/kernel"].__setitem__((0, 0), np.inf), r"got 1 non-finite value"),
    ],
)
def test_restore_refuses_mismatches_and_malformed_metadata(tmp_path, trained_checkpoint, edit_meta, edit_arrays, match):
    """Findings 6 and 15: options compared; malformed metadata is a ValueError, not KeyError/TypeError."""
    path = trained_checkpoint
    _, other = critic_and_trainer(seed=4)
    before = trainer_state(other)
    with pytest.raises(ValueError, match=match):
        other.restore(_rewrite(path, tmp_path / "edited.npz", edit_meta, edit_arrays))
    for a, b in zip(trainer_state(other), before):
        np.testing.assert_array_equal(a, b)


def test_checkpoint_keys_do_not_depend_on_the_critic_name(tmp_path):
    critic = CriticNetwork(**SMALL, name="first")
    randomize(critic, seed=1)
    trainer = CriticTrainer(critic)
    path = trainer.save(tmp_path / "t")
    with np.load(path) as archive:
        keys = sorted(archive.files)
    assert "critic/mlp/dense_0/kernel" in keys and "optimizer/critic_mlp_dense_0_kernel_momentum" in keys
    assert not any("first" in k for k in keys)
    other = CriticTrainer(CriticNetwork(**SMALL, name="second"))
    other.restore(path)
    for a, b in zip(trainer_state(other), trainer_state(trainer)):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------- RLlib import


def test_rllib_import_refuses_nonfinite_and_non_numeric_arrays():
    critic, _ = critic_and_trainer()
    good = export_rllib_weights(critic)
    target = CriticNetwork(**SMALL)
    before = weights_of(target)
    for i, bad in ((3, np.nan), (len(good) - 1, "x")):
        weights = [w.copy() for w in good]
        weights[i] = np.full(weights[i].shape, bad)
        with pytest.raises(ValueError, match=rf"weights\[{i}\]"):
            load_rllib_weights(target, weights)
        assert_same(target, before)


# --------------------------------------------------------------------- fuzz


def _damage(data: bytes, kind: str, position: float, value: int) -> bytes:
    i = min(int(position * len(data)), len(data) - 1)
    if kind == "truncate":
        return data[:i]
    if kind == "flip":
        return data[:i] + bytes([data[i] ^ (value or 1)]) + data[i + 1 :]
    return data[:i] + bytes([value]) * 8 + data[i + 8 :]  # overwrite a run


damage = st.tuples(st.sampled_from(["truncate", "flip", "overwrite"]), st.floats(0.0, 1.0), st.integers(0, 255))
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module")
def saved_files(tmp_path_factory, trained_checkpoint):
    folder = tmp_path_factory.mktemp("fuzz")
    critic, _ = critic_and_trainer(seed=7)
    return (
        open(critic.save_weights(folder / "c.weights.h5"), "rb").read(),
        open(trained_checkpoint, "rb").read(),
        folder,
    )


@pytest.fixture(scope="module")
def fuzz_targets():
    """One critic and one trainer for every example: a refused load leaves them as they were."""
    return CriticNetwork(**SMALL), critic_and_trainer(seed=8)[1]


def _refused_unchanged(original, damage, path, load, state):
    broken = _damage(original, *damage)
    if broken == original:
        return
    path.write_bytes(broken)
    before = state()
    with pytest.raises(ValueError):
        load(path)
    for a, b in zip(state(), before):
        np.testing.assert_array_equal(a, b)


@FUZZ
@given(damage=damage)
def test_fuzzed_weights_files_are_refused_with_weights_unchanged(saved_files, fuzz_targets, damage):
    original, _, folder = saved_files
    critic = fuzz_targets[0]
    _refused_unchanged(original, damage, folder / "broken.weights.h5", critic.load_weights, lambda: weights_of(critic))


@FUZZ
@given(damage=damage)
def test_fuzzed_trainer_checkpoints_are_refused_with_state_unchanged(saved_files, fuzz_targets, damage):
    _, original, folder = saved_files
    trainer = fuzz_targets[1]
    _refused_unchanged(original, damage, folder / "broken.npz", trainer.restore, lambda: trainer_state(trainer))
