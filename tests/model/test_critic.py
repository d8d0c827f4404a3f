import keras
import numpy as np
import pytest

from multicritic import CriticNetwork
from multicritic.training import predict_function
from tests import numpy_reference as ref
from tests.conftest import BACKEND, CRITIC_KINDS, copy_features_into_h_z, inputs_of, random_inputs, randomize, to_np

# SPEC §2: trainable parameter counts of RLlib's critic (EMA copy not counted).
PARAM_COUNTS = {
    "nano": 4_879,
    "micro": 11_551,
    "mini": 37_183,
    "XXS": 180_607,
    "XS": 393_727,
    "S": 1_181_439,
    "M": 2_297_215,
    "L": 4_331_007,
    "XL": 9_708_799,
}


def n_params(variables):
    return sum(int(np.prod(v.shape)) for v in variables)


@pytest.mark.parametrize("size", list(PARAM_COUNTS))
def test_parameter_counts_and_split(size):
    critic = CriticNetwork(model_size=size)
    assert n_params(critic.trainable_variables) == PARAM_COUNTS[size]
    assert n_params(critic.non_trainable_variables) == PARAM_COUNTS[size]
    fast_ids = {id(v) for v in critic.fast_weights}
    assert {id(v) for v in critic.trainable_variables} == fast_ids
    assert {id(v) for v in critic.non_trainable_variables} == {id(v) for v in critic.ema_weights}
    assert all(not v.trainable for v in critic.ema_weights)
    # Pairwise order: trainable[i] is the fast twin of non_trainable[i].
    for fast, ema in zip(critic.trainable_variables, critic.non_trainable_variables):
        assert fast.path.replace("/mlp/", "/mlp_ema/").replace("/return_layer/", "/return_layer_ema/") == ema.path


def test_ema_stays_frozen_when_critic_is_made_trainable():
    critic = CriticNetwork(model_size="nano")
    critic.trainable = False
    assert critic.trainable_variables == []
    critic.trainable = True
    assert n_params(critic.trainable_variables) == PARAM_COUNTS["nano"]
    assert all(not v.trainable for v in critic.ema_weights)
    if BACKEND == "torch":
        assert all(v.value.requires_grad for v in critic.fast_weights)
        assert not any(v.value.requires_grad for v in critic.ema_weights)
        trainable_params = [p for p in critic.parameters() if p.requires_grad]
        assert len(trainable_params) == len(critic.fast_weights)


def ref_forward(critic, inputs, ema=False):
    """The numpy reference on the critic's inputs: a features critic's `x` is `h` with an empty `z`."""
    h, z = inputs if len(inputs) == 2 else (inputs[0], np.zeros((len(inputs[0]), 0), "float32"))
    return ref.forward(ref.params_from(critic, ema=ema), h, z)


@pytest.mark.parametrize("size, kind", [("nano", "h_z"), ("XS", "h_z"), ("S", "h_z"), ("S", "features")])
@pytest.mark.parametrize("use_ema", [False, True])
def test_forward_matches_numpy(size, kind, use_ema):
    critic = CriticNetwork(model_size=size, **CRITIC_KINDS[kind])
    randomize(critic, seed=1, scale=0.1)
    # Give the EMA copy different weights, to tell the two paths apart.
    rng = np.random.default_rng(2)
    for v in critic.ema_weights:
        v.assign(rng.normal(scale=0.1, size=tuple(v.shape)).astype("float32"))
    inputs = inputs_of(critic, 9)
    value, logits = critic(*inputs, use_ema=use_ema)
    want_value, want_logits = ref_forward(critic, inputs, ema=use_ema)
    assert value.shape == (9,) and logits.shape == (9, 255)
    assert to_np(logits).dtype == np.float32
    np.testing.assert_allclose(to_np(logits), want_logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(to_np(value), want_value, rtol=1e-5, atol=1e-5)


def test_z_is_flattened_row_major_after_h():
    critic = CriticNetwork(model_size="nano")
    randomize(critic)
    h, z = random_inputs(critic, 3)
    kernel = to_np(critic.mlp.dense_layers[0].kernel)
    # Zero every input row but one z entry: only kernel row 16 + 2*4 + 3 may matter.
    z_only = np.zeros_like(z)
    z_only[:, 2, 3] = 1.0
    pre = to_np(critic.mlp.dense_layers[0](np.concatenate([np.zeros_like(h), z_only.reshape(3, -1)], -1)))
    np.testing.assert_allclose(pre, np.broadcast_to(kernel[16 + 2 * 4 + 3], pre.shape), rtol=1e-6)
    value, _ = critic(np.zeros_like(h), z_only)
    want, _ = ref.forward(ref.params_from(critic), np.zeros_like(h), z_only)
    np.testing.assert_allclose(to_np(value), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scheme", ["uniform_symlog", "symexp"])
def test_new_critic_predicts_zero(scheme):
    critic = CriticNetwork(model_size="XS", bin_scheme=scheme)
    h, z = random_inputs(critic, 16)
    for use_ema in (False, True):
        value, logits = critic(h, z, use_ema=use_ema)
        np.testing.assert_array_equal(to_np(logits), 0.0)
        assert np.abs(to_np(value)).max() < 1e-6


def test_numpy_and_backend_tensors_give_the_same_result():
    critic = CriticNetwork(model_size="nano")
    randomize(critic)
    h, z = random_inputs(critic, 5)
    from_numpy = to_np(critic(h, z)[0])
    from_tensor = to_np(critic(keras.ops.convert_to_tensor(h), keras.ops.convert_to_tensor(z))[0])
    np.testing.assert_array_equal(from_numpy, from_tensor)


def test_model_size_none_builds_on_first_call():
    critic = CriticNetwork(model_size=None, num_dense_layers=2, dense_hidden_units=8)
    assert not critic.built
    h = np.ones((3, 5), "float32")
    z = np.ones((3, 2, 3), "float32")
    value, logits = critic(h, z)
    assert critic.built and (critic.gru_units, critic.num_z_categoricals, critic.num_z_classes) == (5, 2, 3)
    assert value.shape == (3,) and logits.shape == (3, 255)
    # 11*8 kernel + 2*8 LN, 8*8 + 2*8, head 8*255 + 255
    assert n_params(critic.trainable_variables) == 11 * 8 + 16 + 64 + 16 + 8 * 255 + 255
    np.testing.assert_array_equal(
        to_np(critic.mlp_ema.dense_layers[0].kernel), to_np(critic.mlp.dense_layers[0].kernel)
    )


def test_init_ema_copies_every_variable():
    critic = CriticNetwork(model_size="micro")
    randomize(critic, seed=3)
    for v in critic.ema_weights:
        v.assign(np.zeros(tuple(v.shape), "float32"))
    critic.init_ema()
    for fast, ema in zip(critic.fast_weights, critic.ema_weights):
        np.testing.assert_array_equal(to_np(fast), to_np(ema))
    assert len(critic.ema_weights) == 5  # kernel, LN gamma and beta, head kernel and bias


def test_update_ema_formula():
    critic = CriticNetwork(model_size="micro", ema_decay=0.9)
    randomize(critic, seed=4)
    rng = np.random.default_rng(5)
    for v in critic.fast_weights:
        v.assign(rng.normal(size=tuple(v.shape)).astype("float32"))
    fast = [to_np(v) for v in critic.fast_weights]
    ema = [to_np(v) for v in critic.ema_weights]
    critic.update_ema()
    for f, e, new in zip(fast, ema, critic.ema_weights):
        want = np.float32(0.9) * e + np.float32(1.0 - 0.9) * f
        np.testing.assert_allclose(to_np(new), want, rtol=1e-6, atol=1e-7)
    # Fast weights untouched; decay 1 keeps the EMA, decay 0 copies.
    for f, v in zip(fast, critic.fast_weights):
        np.testing.assert_array_equal(to_np(v), f)
    before = [to_np(v) for v in critic.ema_weights]
    critic.update_ema(decay=1.0)
    for b, v in zip(before, critic.ema_weights):
        np.testing.assert_array_equal(to_np(v), b)
    critic.update_ema(decay=0.0)
    for f, v in zip(fast, critic.ema_weights):
        np.testing.assert_array_equal(to_np(v), f)


def test_optimizer_step_changes_no_ema_weight():
    critic = CriticNetwork(model_size="nano")
    randomize(critic)
    optimizer = keras.optimizers.Adam(learning_rate=0.1)
    ema_before = [to_np(v) for v in critic.ema_weights]
    fast_before = [to_np(v) for v in critic.fast_weights]
    grads = [keras.ops.ones(v.shape) for v in critic.trainable_variables]
    optimizer.apply(grads, critic.trainable_variables)
    for b, v in zip(ema_before, critic.ema_weights):
        np.testing.assert_array_equal(to_np(v), b)
    assert all(np.abs(to_np(v) - b).max() > 0.05 for b, v in zip(fast_before, critic.fast_weights))
    # The optimizer holds slots for the fast weights only.
    slots = [v for v in optimizer.variables if len(v.shape) > 0]
    assert n_params(slots) == 2 * PARAM_COUNTS["nano"]


@pytest.mark.parametrize(
    "h_shape, z_shape, match",
    [
        ((4, 16, 1), (4, 4, 4), r"h: got shape \[4, 16, 1\], expected \[B, 16\]"),
        ((4, 15), (4, 4, 4), r"h: got shape \[4, 15\], expected \[B, 16\]"),
        ((4, 16), (4, 16), r"z: got shape \[4, 16\], expected \[B, 4, 4\]"),
        ((4, 16), (4, 4, 5), r"z: got shape \[4, 4, 5\], expected \[B, 4, 4\]"),
        ((4, 16), (5, 4, 4), r"h, z: batch sizes differ: h has shape \[4, 16\], z has shape \[5, 4, 4\]"),
    ],
)
def test_bad_inputs_raise_before_anything_changes(h_shape, z_shape, match):
    critic = CriticNetwork(model_size="nano")
    before = [to_np(v) for v in critic.weights]
    with pytest.raises(ValueError, match=match):
        critic(np.zeros(h_shape, "float32"), np.zeros(z_shape, "float32"))
    for b, v in zip(before, critic.weights):
        np.testing.assert_array_equal(to_np(v), b)


@pytest.mark.parametrize(
    "shape, match",
    [
        ((4, 9), r"x: got shape \[4, 9\], expected \[\.\.\., 10\] \(input_size=10\)"),
        ((2, 4, 11), r"x: got shape \[2, 4, 11\], expected \[\.\.\., 10\] \(input_size=10\)"),
        ((), r"x: got shape \[\], expected \[\.\.\., 10\] \(input_size=10\)"),
    ],
)
def test_features_critic_refuses_bad_inputs_before_anything_changes(shape, match):
    critic = CriticNetwork(model_size="nano", input_size=10)
    before = [to_np(v) for v in critic.weights]
    with pytest.raises(ValueError, match=match):
        critic(np.zeros(shape, "float32"))
    with pytest.raises(ValueError, match=r"^z: got a ndarray, expected none: a features critic"):
        critic(np.zeros((4, 10), "float32"), np.zeros((4, 1, 1), "float32"))
    with pytest.raises(ValueError, match=r"^z: got True, expected none"):
        critic(np.zeros((4, 10), "float32"), True)  # use_ema is a keyword
    for b, v in zip(before, critic.weights):
        np.testing.assert_array_equal(to_np(v), b)


def test_features_critic_takes_any_leading_dims_and_builds_on_first_call():
    critic = CriticNetwork(model_size=None, input_layout="features", num_dense_layers=1, dense_hidden_units=8)
    assert not critic.built and critic.input_size is None
    (x,) = inputs_of(CriticNetwork(model_size="nano", input_size=5), (2, 3))
    value, logits = critic(x)
    assert critic.built and critic.input_size == 5 and critic.latent_size == 5
    assert critic.get_config()["input_size"] == 5 and critic.gru_units is None
    assert value.shape == (2, 3) and logits.shape == (2, 3, 255)
    # 5*8 kernel + 2*8 LN, head 8*255 + 255: no z, no row for one.
    assert n_params(critic.trainable_variables) == 5 * 8 + 16 + 8 * 255 + 255
    want_value, want_logits = ref_forward(critic, (x.reshape(6, 5),))
    np.testing.assert_allclose(to_np(logits).reshape(6, 255), want_logits, rtol=1e-4, atol=1e-4)
    one_value, one_logits = critic(x[0, 0])  # one row, no batch axis
    assert one_value.shape == () and one_logits.shape == (255,)
    np.testing.assert_allclose(to_np(one_logits), want_logits[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(to_np(critic.on_latent(x)[1]), to_np(logits), rtol=1e-6, atol=1e-6)


def test_bad_input_on_lazy_build_leaves_critic_unbuilt():
    critic = CriticNetwork(model_size=None, num_dense_layers=1, dense_hidden_units=4)
    with pytest.raises(ValueError, match="h, z: batch sizes differ"):
        critic(np.zeros((2, 3), "float32"), np.zeros((3, 2, 2), "float32"))
    assert not critic.weights


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"model_size": "XXXL"}, "model_size: got 'XXXL'"),
        ({"num_buckets": 1}, "num_buckets: got 1"),
        ({"lower_bound": 1.0, "upper_bound": -1.0}, "lower_bound/upper_bound"),
        ({"lower_bound": 1.0, "upper_bound": 1.0}, "lower_bound/upper_bound"),
        ({"ema_decay": 1.5}, r"ema_decay: got 1.5, expected a finite number in \[0, 1\]"),
        ({"ema_decay": -0.1}, "ema_decay"),
        ({"bin_scheme": "linear"}, "bin_scheme"),
        ({"ema_update_period": 2}, r"ema_update_period: a training option, now given to CriticTrainer"),
        ({"ema_regularizer": "kl"}, "ema_regularizer: a training option"),
        ({"head": "softmax"}, r"head: got 'softmax', expected one of \['two_hot', "),
        ({"head": "hl_gauss", "bin_scheme": "symexp"}, "bin_scheme: got 'symexp' with head='hl_gauss'"),
        ({"hl_gauss_sigma": 0.0}, r"hl_gauss_sigma: got 0.0, expected a finite number > 0"),
        ({"ensemble_size": 0}, r"ensemble_size: got 0, expected an integer >= 1"),
        ({"aggregation": "max"}, r"aggregation: got 'max', expected one of"),
        ({"ensemble_size": 3, "aggregation": "min_of_random", "aggregation_subset": 4}, "aggregation_subset: got 4"),
        ({"norm": "batch"}, r"norm: got 'batch', expected one of \['layer', 'rms'\]"),
        ({"bogus": 1}, "bogus"),
        ({"kernel_initializer": "bogus"}, "kernel_initializer: got 'bogus', expected a Keras initializer"),
        ({"input_size": 0}, r"input_size: got 0, expected an integer >= 1"),
        ({"input_size": 8, "input_layout": "z_h"}, r"input_size: got 8 with input_layout='z_h', expected None"),
        ({"input_size": 8, "gru_units": 8}, r"gru_units: got 8 for a features critic \(input_layout='features'\)"),
        ({"input_layout": "features", "num_z_classes": 2}, r"num_z_classes: got 2 for a features critic"),
        ({"input_layout": "x"}, r"input_layout: got 'x', expected one of \['h_z', 'z_h', 'features'\] or None"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CriticNetwork(**kwargs)


@pytest.mark.parametrize("kind", list(CRITIC_KINDS))
def test_config_round_trip_keeps_every_option(kind):
    critic = CriticNetwork(
        **CRITIC_KINDS[kind],
        model_size="nano",
        num_buckets=41,
        lower_bound=-5.0,
        upper_bound=6.0,
        ema_decay=0.9,
        bin_scheme="symexp",
        head="mse",
        ensemble_size=3,
        aggregation="min_of_random",
        aggregation_subset=3,
    )
    config = critic.get_config()
    clone = CriticNetwork.from_config(config)
    assert clone.get_config() == config
    assert n_params(clone.trainable_variables) == n_params(critic.trainable_variables)
    assert (config["input_layout"], config["input_size"]) == (("features", 10) if kind == "features" else ("h_z", None))


@pytest.mark.parametrize("kind", list(CRITIC_KINDS))
def test_compiled_forward_does_not_retrace_per_batch_size(kind):
    critic = CriticNetwork(model_size="nano", **CRITIC_KINDS[kind])
    randomize(critic)
    predict = predict_function(critic)
    predict_ema = predict_function(critic, use_ema=True)
    for batch in (1, 3, 5, 8):
        inputs = inputs_of(critic, batch, seed=batch)
        value, logits = predict(*inputs)
        assert value.shape == (batch,) and logits.shape == (batch, 255)
        np.testing.assert_allclose(to_np(value), to_np(critic(*inputs)[0]), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(to_np(predict_ema(*inputs)[0]), to_np(critic(*inputs, use_ema=True)[0]), atol=1e-6)
    if BACKEND == "tensorflow":
        assert predict.compiled.experimental_get_tracing_count() == 1
        predict(*inputs_of(critic, 100))
        assert predict.compiled.experimental_get_tracing_count() == 1
    elif BACKEND == "jax":
        assert predict.compiled._cache_size() == 1  # 1..8 share the 8-row program
    bad = {"h_z": [np.zeros((2, 3), "float32"), np.zeros((2, 4, 4), "float32")], "features": [np.zeros((2, 3))]}
    with pytest.raises(ValueError, match=r"h: got shape" if kind == "h_z" else r"x: got shape \[2, 3\], expected"):
        predict(*bad[kind])


def test_use_ema_is_a_bool_and_unknown_call_arguments_are_refused():
    """A string "false" is truthy: it ran the EMA critic (issue 31, finding 6's twin on the call)."""
    critic = CriticNetwork(model_size="nano")
    randomize(critic, seed=4)
    h, z = random_inputs(critic, 3)
    for bad in ("false", 1, None, np.float32(0.0)):
        with pytest.raises(ValueError, match=r"use_ema: got"):
            critic(h, z, use_ema=bad)
    with pytest.raises(ValueError, match=r"use_EMA: not an argument of the critic's call"):
        critic(h, z, use_EMA=True)
    np.testing.assert_array_equal(to_np(critic(h, z, use_ema=np.bool_(True))[1]), to_np(critic(h, z, use_ema=True)[1]))


def test_features_critic_is_the_h_z_critic_without_z_for_every_head_and_trunk(monkeypatch):
    """A features critic of `input_size=D` computes what the `(h, z)` critic of `gru_units=D` and a one-class
    `z` (the fake `z` model-free users passed) computes with `z = 0`: the same network but for `z`'s kernel row.
    Every registered head and trunk, an ensemble for one of them, both halves; the outputs agree to float32
    rounding (one matmul over D rows against a sum of the D rows' and the zero row's)."""
    from multicritic.heads import HEADS
    from multicritic.trunks import TRUNKS

    from multicritic.backend import contract

    # The math, op by op (36 compiled calls' compilations otherwise; the compiled calls have tests of their own).
    monkeypatch.setattr(contract, "EAGER", True)
    rng = np.random.default_rng(0)
    sizes = dict(model_size=None, num_dense_layers=2, dense_hidden_units=8, num_buckets=21)
    for i, (head, trunk) in enumerate([(head, "mlp") for head in HEADS] + [("two_hot", t) for t in TRUNKS]):
        ensemble = {"ensemble_size": 2} if i == 0 else {}
        features = CriticNetwork(**sizes, **ensemble, head=head, trunk=trunk, input_size=6)
        h_z = CriticNetwork(
            **sizes, **ensemble, head=head, trunk=trunk, gru_units=6, num_z_categoricals=1, num_z_classes=1
        )
        assert features.get_config()["head"] == h_z.get_config()["head"]
        randomize(features, seed=i)
        for var in features.ema_weights:
            var.assign(var.value * 0.5)
        copy_features_into_h_z(features, h_z, rng)
        (x,) = inputs_of(features, 7, seed=i)
        for use_ema in (False, True):
            got, want = features(x, use_ema=use_ema), h_z(x, np.zeros((7, 1, 1), "float32"), use_ema=use_ema)
            for a, b in zip(got, want):
                np.testing.assert_allclose(to_np(a), to_np(b), rtol=1e-5, atol=1e-6, err_msg=f"{head} {trunk}")
        if trunk == "mlp":  # z's kernel row of 8 units per member, no more
            assert n_params(h_z.trainable_variables) - n_params(features.trainable_variables) == 8 * (
                2 if i == 0 else 1
            )


def test_features_critic_passes_keras_run_layer_test():
    """Keras's own conformance check (serialization round trip, symbolic and eager calls, a training step,
    mixed precision where the backend runs it): a features critic takes one input, as any Keras layer."""
    from keras.src.testing import TestCase

    class Conformance(TestCase):
        def runTest(self):
            pass

    Conformance().run_layer_test(
        CriticNetwork,
        init_kwargs={"input_size": 12, "model_size": None, "num_dense_layers": 1, "dense_hidden_units": 16},
        input_shape=(4, 12),
        expected_output_shape=((4,), (4, 255)),
        expected_num_trainable_weights=5,
        expected_num_non_trainable_weights=5,
        expected_num_seed_generators=0,
        supports_masking=False,
    )
