"""`critic.export`: each format reloaded with its own runtime and compared with the Keras forward pass."""

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork
from multicritic.export import FORMATS, SUPPORTED, load_exported
from tests.conftest import BACKEND, random_inputs, randomize, to_np

RUNTIMES = {"tf_saved_model": "tensorflow", "onnx": "onnxruntime", "litert": "ai_edge_litert"}
SUFFIX = {"tf_saved_model": "", "onnx": ".onnx", "litert": ".tflite"}


def exported(critic, tmp_path, fmt, **kwargs):
    pytest.importorskip(RUNTIMES[fmt])
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"critic{SUFFIX[fmt]}"
    critic.export(path, format=fmt, verbose=False, **kwargs)
    return load_exported(path, fmt)


def expected(critic, h, z, use_ema=False):
    value, logits = critic(h, z, use_ema=use_ema)
    value, logits = to_np(value).astype(np.float64), to_np(logits)
    return np.sign(value) * np.expm1(np.abs(value)), value, logits


def assert_serves(fn, critic, batches=(1, 7, 33), use_ema=False, tol=1e-5):
    for n in batches:  # one export, any batch size
        h, z = random_inputs(critic, n, seed=n)
        got = fn(h, z)
        for name, g, w in zip(("value_real", "value_symlog", "logits"), got, expected(critic, h, z, use_ema)):
            assert g.dtype == np.float32 and g.shape == w.shape, (name, g.dtype, g.shape, w.shape)
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"{name} at batch {n}")


def trained_critic(**kwargs):
    critic = CriticNetwork(model_size="nano", **kwargs)
    randomize(critic, seed=1, scale=0.3)
    rng = np.random.default_rng(5)
    for v in critic.ema_weights:  # an EMA copy unlike the fast weights: exports of the two differ
        v.assign(rng.normal(scale=0.3, size=tuple(v.shape)).astype("float32"))
    return critic


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_reloads_with_its_runtime(fmt, tmp_path):
    critic = trained_critic()
    if fmt not in SUPPORTED[BACKEND]:
        with pytest.raises(ValueError, match=f"format: got '{fmt}' on the '{BACKEND}' backend.*supported"):
            critic.export(tmp_path / f"critic{SUFFIX[fmt]}", format=fmt)
        return
    assert_serves(exported(critic, tmp_path, fmt), critic)
    assert_serves(exported(critic, tmp_path / "ema", fmt, use_ema=True), critic, use_ema=True)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("fmt", SUPPORTED[BACKEND])
def test_export_of_a_mixed_precision_critic_serves_its_weights_in_float32(fmt, policy, tmp_path):
    keras.config.set_dtype_policy(policy)
    critic = trained_critic()
    keras.config.set_dtype_policy("float32")
    reference = CriticNetwork(model_size="nano")
    reference.set_weights(critic.get_weights())
    assert_serves(exported(critic, tmp_path, fmt), reference)


def test_export_in_the_critics_own_mixed_policy(tmp_path):
    """compute_dtype=None keeps float16 compute: the first format of this backend runs it as Keras does
    (a SavedModel exactly; ONNX Runtime's float16 kernels round differently: within float16's precision)."""
    keras.config.set_dtype_policy("mixed_float16")
    critic = trained_critic()
    fmt = SUPPORTED[BACKEND][0]
    assert_serves(exported(critic, tmp_path, fmt, compute_dtype=None), critic, tol=1e-5 if fmt == "tf_saved_model" else 3e-3)


def test_export_of_an_ensemble(tmp_path):
    critic = trained_critic(ensemble_size=3)
    fmt = SUPPORTED[BACKEND][-1]
    assert_serves(exported(critic, tmp_path, fmt), critic, batches=(1, 9))


def test_export_arguments_are_checked(tmp_path):
    critic = trained_critic()
    with pytest.raises(ValueError, match="format: got 'pickle'"):
        critic.export(tmp_path / "x", format="pickle")
    with pytest.raises(ValueError, match="compute_dtype: got 'float16'"):
        critic.export(tmp_path / "x", format=SUPPORTED[BACKEND][0], compute_dtype="float16")
