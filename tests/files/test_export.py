"""`critic.export`: each format reloaded with its own runtime and compared with the Keras forward pass."""

import warnings

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork
from multicritic.files.export import FORMATS, SUPPORTED, load_exported
from tests import half_precision as hp
from tests.conftest import BACKEND, CRITIC_KINDS, inputs_of, random_inputs, randomize, to_np

RUNTIMES = {"tf_saved_model": "tensorflow", "onnx": "onnxruntime", "litert": "ai_edge_litert", "torch": "torch"}
SUFFIX = {"tf_saved_model": "", "onnx": ".onnx", "litert": ".tflite", "torch": ".pt2"}


def exported(critic, tmp_path, fmt, **kwargs):
    pytest.importorskip(RUNTIMES[fmt])
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"critic{SUFFIX[fmt]}"
    critic.export(path, format=fmt, verbose=False, **kwargs)
    return load_exported(path, fmt)


def expected(critic, *inputs, use_ema=False):
    value, logits = critic(*inputs, use_ema=use_ema)
    value, logits = to_np(value).astype(np.float64), to_np(logits)
    return np.sign(value) * np.expm1(np.abs(value)), value, logits


def assert_serves(fn, critic, batches=(1, 7, 33), use_ema=False, tol=1e-5):
    for n in batches:  # one export, any batch size
        inputs = inputs_of(critic, n, seed=n)
        got = fn(*inputs)
        want = expected(critic, *inputs, use_ema=use_ema)
        for name, g, w in zip(("value_real", "value_symlog", "logits"), got, want):
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
    serve = exported(critic, tmp_path, fmt)
    assert_serves(serve, critic)
    assert_serves(exported(critic, tmp_path / "ema", fmt, use_ema=True), critic, use_ema=True)
    h, z = random_inputs(critic, 3)
    with pytest.raises(ValueError, match=r"h, z: got shapes \[16\] and \[3, 4, 4\]"):
        serve(h[0], z)
    with pytest.raises(ValueError, match=r"h, z: the export refused shapes \[3, 5\] and \[3, 4, 4\]"):
        serve(h[:, :5], z)
    with pytest.raises(ValueError, match="h: got 'x'"):
        serve("x", z)


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
    """compute_dtype=None keeps float16 compute. The export and Keras may round float16 work differently (CI
    failed on a Xeon with native float16 arithmetic when the two were compared to 1e-5): on inputs where the
    pre-activations are exact in float16, both are within float16's unit roundoff of the float64 reference
    (`tests.half_precision`); the values are the float32 head's decode of the export's own logits, to
    float32's precision; and float16 compute is measurably off float32's."""
    keras.config.set_dtype_policy("mixed_float16")
    critic = CriticNetwork(model_size="nano")
    h_all, z_all = hp.exact_dense_case(critic, 33, seed=3)
    fmt = SUPPORTED[BACKEND][0]
    serve = exported(critic, tmp_path, fmt, compute_dtype=None)
    keras.config.set_dtype_policy("float32")
    for n in (1, 7, 33):
        h, z = h_all[:n], z_all[:n]
        want, bound = hp.logits_bound(critic, h, z, "float16")
        value_real, value, logits = serve(h, z)
        assert all(x.dtype == np.float32 for x in (value_real, value, logits))
        hp.assert_within(logits, want, bound, f"{fmt} logits at batch {n}")
        hp.assert_within(to_np(critic(h, z)[1]), want, bound, f"keras logits at batch {n}")
        decoded, decode_bound = hp.decode_bound(critic, logits)
        hp.assert_within(value, decoded, decode_bound, f"{fmt} value at batch {n}")
        # symexp of the float32 value, in float32 (a float32 path: a few float32 roundings of expm1, far within
        # 1e-5 relative; no half-precision work is involved).
        np.testing.assert_allclose(
            value_real, np.sign(value) * np.expm1(np.abs(value.astype(np.float64))), rtol=1e-5, atol=1e-7
        )
        assert np.abs(logits - want).max() > 1e3 * hp.UNIT_ROUNDOFF["float32"] * np.abs(want).max()


def test_torch_export_is_a_torch_export_program_with_a_dynamic_batch(tmp_path):
    """Keras 3.15's `format="torch"`: the file `torch.export.load` reads, any batch size (Keras's own default
    fixes it at 1); refused with a `ValueError` naming `format` on the other backends (the test above)."""
    if BACKEND != "torch":
        pytest.skip("a torch.export program is written from the PyTorch backend")
    import torch

    critic = trained_critic()
    with pytest.raises(ValueError, match=r"filepath: got '.*critic.onnx', expected a file name ending in '.pt2'"):
        critic.export(tmp_path / "critic.onnx", format="torch")
    critic.export(tmp_path / "critic.pt2", format="torch", verbose=False, use_ema=True)
    program = torch.export.load(str(tmp_path / "critic.pt2"))
    assert isinstance(program, torch.export.ExportedProgram)
    h, z = random_inputs(critic, 5, seed=3)
    with torch.no_grad():
        got = program.module()(torch.from_numpy(h), torch.from_numpy(z))
    for g, w in zip(got, expected(critic, h, z, use_ema=True)):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", list(CRITIC_KINDS))
def test_export_of_an_ensemble(kind, tmp_path):
    """An ensemble's export; a features critic's (`x -> ...`), ensemble too."""
    critic = trained_critic(ensemble_size=3, **CRITIC_KINDS[kind])
    fmt = SUPPORTED[BACKEND][-1]
    serve = exported(critic, tmp_path, fmt)
    assert_serves(serve, critic, batches=(1, 9))
    if kind == "features":
        with pytest.raises(ValueError, match=r"x: got shape \[10\], expected \[B, input_size\]"):
            serve(np.zeros(10, "float32"))
        with pytest.raises(ValueError, match=r"x: the export refused shapes \[3, 9\]"):
            serve(np.zeros((3, 9), "float32"))


def test_export_arguments_are_checked(tmp_path):
    critic = trained_critic()
    with pytest.raises(ValueError, match="format: got 'pickle'"):
        critic.export(tmp_path / "x", format="pickle")
    with pytest.raises(ValueError, match="compute_dtype: got 'float16'"):
        critic.export(tmp_path / "x", format=SUPPORTED[BACKEND][0], compute_dtype="float16")


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_refuses_unknown_options_and_paths_of_the_wrong_kind(fmt, tmp_path):
    """Findings 6 and 15: `use_EMA=True` (a typo) went to Keras and exported the fast critic, `use_ema="false"`
    exported the EMA critic, a SavedModel onto an existing file raised a raw framework error."""
    critic = trained_critic()
    path = tmp_path / f"critic{SUFFIX[fmt]}"
    for kwargs, message in (
        (dict(use_EMA=True), "use_EMA: not an option of export with format"),
        (dict(use_ema="false"), "use_ema: got 'false', expected True or False"),
        (dict(use_ema=1), "use_ema: got 1"),
        (dict(verbose="loud"), "verbose: got 'loud'"),
    ):
        if fmt == "litert" and "use_EMA" in kwargs:
            continue  # LiteRT's options are the converter's attributes: Keras refuses the others itself
        with pytest.raises(ValueError, match=message):
            critic.export(path, format=fmt, **kwargs)
    if fmt not in SUPPORTED[BACKEND]:
        return
    pytest.importorskip(RUNTIMES[fmt])
    taken = tmp_path / ("a_file" if fmt == "tf_saved_model" else "a_folder")
    taken.mkdir() if fmt != "tf_saved_model" else taken.write_text("x")
    kind = "file" if fmt == "tf_saved_model" else "directory"
    with pytest.raises(ValueError, match=rf"filepath: '.*' is a {kind}, expected a"):
        critic.export(taken, format=fmt)
    with pytest.raises(ValueError, match=r"filepath: .* which is not an existing directory"):
        critic.export(tmp_path / "missing" / f"critic{SUFFIX[fmt]}", format=fmt)
    assert sorted(p.name for p in tmp_path.iterdir()) == [taken.name]  # nothing written


def test_load_exported_names_what_it_cannot_load(tmp_path):
    """Finding 15: a missing file raised the runtime's own error (onnxruntime's NoSuchFile)."""
    with pytest.raises(ValueError, match="format: got 'pickle'"):
        load_exported(tmp_path / "x", "pickle")
    for fmt in FORMATS:
        try:
            __import__(RUNTIMES[fmt])
        except ImportError:
            continue
        with pytest.raises(ValueError, match=r"filepath: '.*' does not exist"):
            load_exported(tmp_path / f"missing{SUFFIX[fmt]}", fmt)
    pytest.importorskip("onnxruntime")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not an onnx model")
    with pytest.raises(ValueError, match=r"filepath: '.*garbage.onnx' is not a 'onnx' export this runtime can load"):
        load_exported(garbage, "onnx")


def saved_model_backend():
    if "tf_saved_model" not in SUPPORTED[BACKEND]:
        pytest.skip(f"no SavedModel export from {BACKEND}")
    return pytest.importorskip("tensorflow")


@pytest.mark.parametrize("options", [{}, {"ensemble_size": 3}], ids=["single", "ensemble"])
def test_saved_model_signature_names_its_outputs(options, tmp_path):
    """Issue 72 item 8: `serving_default` named its outputs output_0 to output_2; a server (TF Serving, a
    `signatures["serving_default"]` call) reads them by name now, as it reads the inputs `h` and `z`."""
    tf = saved_model_backend()
    critic = trained_critic(**options)
    path = tmp_path / "critic"
    critic.export(path, verbose=False)
    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    assert sorted(signature.structured_outputs) == ["logits", "value_real", "value_symlog"]
    assert sorted(signature.structured_input_signature[1]) == ["h", "z"]
    h, z = random_inputs(critic, 5, seed=2)
    out = signature(h=tf.constant(h), z=tf.constant(z))
    for name, want in zip(("value_real", "value_symlog", "logits"), expected(critic, h, z)):
        got = out[name].numpy()
        assert got.dtype == np.float32 and got.shape == want.shape, (name, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_a_saved_model_with_unnamed_outputs_still_loads(tmp_path):
    """Exports written before the outputs were named return a tuple: `load_exported` serves those too."""
    saved_model_backend()
    from multicritic.files.export import ServingCritic, input_signature

    critic = trained_critic()
    path = tmp_path / "old"
    ServingCritic(critic).export(
        str(path), format="tf_saved_model", verbose=False, input_signature=input_signature(critic)
    )
    assert_serves(load_exported(path, "tf_saved_model"), critic, batches=(3,))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_quiet_export_prints_nothing(fmt, tmp_path, capsys):
    """Issue 72 item 8: the docs' SavedModel example printed Keras's 15-line endpoint summary; PyTorch's ONNX
    export printed a TracerWarning per shape read. verbose=False prints nothing and warns nothing."""
    if fmt not in SUPPORTED[BACKEND]:
        pytest.skip(f"no {fmt} export from {BACKEND}")
    pytest.importorskip(RUNTIMES[fmt])
    critic = trained_critic()
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        critic.export(tmp_path / f"critic{SUFFIX[fmt]}", format=fmt, verbose=False)
    assert capsys.readouterr() == ("", "") and [str(w.message) for w in caught] == []
    assert_serves(load_exported(tmp_path / f"critic{SUFFIX[fmt]}", fmt), critic, batches=(2,))
    if fmt == "tf_saved_model":  # Keras's default: its endpoint summary, which the quiet export left out
        critic.export(tmp_path / "loud", format=fmt)
        assert "Saved artifact at" in capsys.readouterr().out
