"""The critic refuses what it cannot use, naming the argument, and converts what it can (findings 9, 11, 20)."""

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork
from tests.conftest import BACKEND, CRITIC_KINDS, compiled, inputs_of, random_inputs, randomize, to_np


@pytest.fixture
def critic():
    c = CriticNetwork(model_size="nano")
    randomize(c, seed=1)
    return c


def test_integer_h_does_not_truncate_a_soft_z(critic):
    """Finding 11: `critic(int32 h, float z)` cast z to int (a soft z became 0)."""
    h, z = random_inputs(critic, 4)
    h_int = np.round(h * 3).astype("int32")
    want_v, want_l = critic(h_int.astype("float32"), z)
    for h_in in (h_int, keras.ops.convert_to_tensor(h_int)):
        got_v, got_l = critic(h_in, z)
        np.testing.assert_array_equal(to_np(got_v), to_np(want_v))
        np.testing.assert_array_equal(to_np(got_l), to_np(want_l))
    # One-hot z as integers works too.
    zi = (z > 0.5).astype("int32")
    np.testing.assert_array_equal(to_np(critic(h, zi)[1]), to_np(critic(h, zi.astype("float32"))[1]))


def test_nested_lists_are_arrays(critic):
    h, z = random_inputs(critic, 2)
    got = to_np(critic(h.tolist(), z.tolist())[0])
    np.testing.assert_allclose(got, to_np(critic(h, z)[0]), rtol=1e-6)


@pytest.mark.parametrize(
    "h, z, match",
    [
        (None, "z", r"h: got None, expected a real-valued array"),
        ("h", "abc", r"z: got 'abc', expected a real-valued array"),
        ([["a"] * 16], "z", r"h: got an array of dtype <U1, expected real numbers"),
        ("h", [[[1.0] * 4] * 4, [[1.0] * 4] * 3], r"z: got a list that is not a rectangular array"),
    ],
)
def test_unusable_inputs_name_the_argument(critic, h, z, match):
    h0, z0 = random_inputs(critic, 2)
    h = h0 if isinstance(h, str) and h == "h" else h
    z = z0 if isinstance(z, str) and z == "z" else z
    with pytest.raises(ValueError, match=match):
        critic(h, z)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"ema_decay": "abc"}, r"ema_decay: got 'abc', expected a finite number in \[0, 1\]"),
        ({"ema_decay": float("nan")}, r"ema_decay: got nan"),
        ({"hl_gauss_sigma": "wide"}, r"hl_gauss_sigma: got 'wide', expected a finite number > 0"),
        ({"ensemble_size": 2.5}, r"ensemble_size: got 2.5, expected an integer >= 1"),
        ({"aggregation_subset": None}, r"aggregation_subset: got None"),
        ({"model_size": ["XS"]}, r"model_size: got \['XS'\], expected one of"),
        ({"model_size": None, "gru_units": "8"}, r"gru_units: got '8', expected an integer >= 1"),
        ({"num_buckets": None}, r"num_buckets: got None, expected an integer >= 2"),
        ({"num_buckets": 2.5}, r"num_buckets: got 2.5, expected an integer >= 2"),
        ({"lower_bound": "abc"}, r"lower_bound: got 'abc', expected a finite number"),
        ({"upper_bound": None}, r"upper_bound: got None, expected a finite number"),
        ({"bin_scheme": ["symexp"]}, r"bin_scheme: got \['symexp'\]"),
    ],
)
def test_bad_constructor_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CriticNetwork(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"ema_regularizer_weight": float("inf")}, r"ema_regularizer_weight: got inf, expected a finite number >= 0"),
        ({"ema_update_period": 1.5}, r"ema_update_period: got 1.5, expected an integer >= 1"),
        ({"ema_update_period": "2"}, r"ema_update_period: got '2'"),
        ({"ema_regularizer": ["two_hot_mean"]}, r"ema_regularizer: got \['two_hot_mean'\]"),
        ({"ema_targets": "yes"}, r"ema_targets: got 'yes', expected True or False"),
        ({"seed": -1}, r"seed: got -1, expected an integer in \[0, 4294967295\]"),
        ({"seed": 2**32}, r"seed: got 4294967296, expected an integer in \[0, 4294967295\]"),
    ],
)
def test_bad_training_options_name_the_argument(critic, kwargs, match):
    from multicritic import CriticTrainer

    with pytest.raises(ValueError, match=match):
        CriticTrainer(critic, **kwargs)


def test_a_regularizer_the_head_cannot_use_is_refused():
    from multicritic import CriticNetwork, CriticTrainer

    critic = CriticNetwork(model_size="nano", head="mse")
    with pytest.raises(ValueError, match="ema_regularizer: got 'distribution' with the critic's head='mse'"):
        CriticTrainer(critic, ema_regularizer="distribution")


@pytest.mark.parametrize("decay", [2.0, -0.5, float("nan"), "0.5"])
def test_update_ema_refuses_a_decay_outside_the_unit_interval(critic, decay):
    for v in critic.fast_weights:
        v.assign(v.value + 1.0)
    before = [to_np(v).copy() for v in critic.ema_weights]
    with pytest.raises(ValueError, match=r"decay: got"):
        critic.update_ema(decay=decay)
    for v, b in zip(critic.ema_weights, before):
        np.testing.assert_array_equal(to_np(v), b)


def _stateless(critic, *inputs, **kwargs):
    fast = [v.value for v in critic.trainable_variables]
    rest = [v.value for v in critic.non_trainable_variables]
    return critic.stateless_call(fast, rest, *inputs, **kwargs)


@pytest.mark.parametrize(
    "lead, ensemble_size, kind",
    [((5, 3), 1, "h_z"), ((5, 3), 3, "h_z"), ((2, 3, 2), 1, "h_z"), ((2, 3, 2), 3, "h_z"), ((2, 3, 2), 3, "features")],
)
def test_issue_71_finding_14_stateless_call_takes_the_leading_dims_the_call_takes(lead, ensemble_size, kind):
    """Issue 71 finding 14: `stateless_call` refused `[T, B, ...]` that `critic(h, z)` takes: it takes them, its
    outputs are the flat batch's reshaped (bit for bit) and `critic(h, z)`'s (to float32 rounding: the call runs
    a compiled pass), on every backend; jit-compiled too (`jax.jit`, `tf.function`). A features critic's `x`
    alike."""
    critic = CriticNetwork(model_size="nano", ensemble_size=ensemble_size, **CRITIC_KINDS[kind])
    randomize(critic, seed=3)
    for var in critic.ema_weights:  # the EMA copy apart from the fast weights: a mix-up shows
        var.assign(var.value * 0.5)
    n = int(np.prod(lead))
    flat = inputs_of(critic, n, seed=4)
    shaped = tuple(x.reshape(lead + x.shape[1:]) for x in flat)
    members = () if ensemble_size == 1 else (ensemble_size,)
    want = None  # the fast pass's flat logits
    for use_ema in (False, True):
        (value, logits), state = _stateless(critic, *shaped, use_ema=use_ema)
        assert tuple(value.shape) == members + lead and tuple(logits.shape) == members + lead + (255,)
        assert len(state) == len(critic.non_trainable_variables)
        (flat_value, flat_logits), _ = _stateless(critic, *flat, use_ema=use_ema)
        want = want if use_ema else flat_logits
        np.testing.assert_array_equal(to_np(value), to_np(flat_value).reshape(members + lead))
        np.testing.assert_array_equal(to_np(logits), to_np(flat_logits).reshape(members + lead + (255,)))
        call_value, call_logits = critic(*shaped, use_ema=use_ema)
        np.testing.assert_allclose(to_np(value), to_np(call_value), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(to_np(logits), to_np(call_logits), rtol=1e-5, atol=1e-5)
    if BACKEND != "torch":  # the compiled forms a JAX or TensorFlow host runs it in
        fast = [v.value for v in critic.trainable_variables]
        rest = [v.value for v in critic.non_trainable_variables]
        step = compiled(lambda f, r, *inputs: critic.stateless_call(f, r, *inputs)[0])
        got = step(fast, rest, *shaped)
        np.testing.assert_allclose(to_np(got[1]), to_np(want).reshape(members + lead + (255,)), rtol=1e-5, atol=1e-5)


_SAME_LEAD = (
    r"expected h \[\.\.\., gru_units=16\] and z \[\.\.\., num_z_categoricals=4, num_z_classes=4\] with the same"
)


@pytest.mark.parametrize(
    "h_shape, z_shape, match",
    [
        ((5, 3, 15), (5, 3, 4, 4), r"^h: got shape \[None, 15\], expected \[B, 16\] \(gru_units=16\)"),
        ((5, 3, 16), (5, 3, 4, 5), r"^z: got shape \[None, 4, 5\], expected \[B, 4, 4\] \(num_z_categoricals=4"),
        ((5, 3, 16), (4, 3, 4, 4), r"^h, z: got shapes \[5, 3, 16\] and \[4, 3, 4, 4\]; " + _SAME_LEAD),
        ((5, 3, 16), (5, 3, 2, 4, 4), r"^h, z: got shapes \[5, 3, 16\] and \[5, 3, 2, 4, 4\]; " + _SAME_LEAD),
        ((5, 3, 16), (5, 4, 4), r"^h: got shape \[5, 3, 16\], expected \[B, 16\]"),
    ],
)
def test_issue_71_finding_14_stateless_call_refuses_what_the_call_refuses(critic, h_shape, z_shape, match):
    """With leading dims, `stateless_call` refuses a bad input as `critic(h, z)` does: a `ValueError` naming the
    argument, what it got and what was expected."""
    with pytest.raises(ValueError, match=match):
        _stateless(critic, np.zeros(h_shape, "float32"), np.zeros(z_shape, "float32"))
