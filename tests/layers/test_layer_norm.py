"""Issue 71, finding 7: a critic built with dtype="bfloat16" or "float16" stores its norms' gamma and beta in
that dtype, and TensorFlow's eager ops do not promote float32 + bfloat16, so every eager entry point (float64 or
list inputs, `stateless_call`, a `StatelessScope`, a distribution scope) raised `InvalidArgumentError`.

Each entry point runs on every backend against a float32 critic holding the same weights, within what the half
format allows (`tests.half_precision`: exact pre-activations, the rest bounded by the format's unit roundoff).
"""

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork
from multicritic.layers.layer_norm import LayerNormalization
from tests import half_precision as hp
from tests import numpy_reference as ref
from tests.conftest import BACKEND, to_np

HALF = ("bfloat16", "float16")


@pytest.fixture(scope="module", params=HALF)
def pair(request):
    """`(dtype, float32 critic, half critic of other weights, the float32 critic's weights, h, z)`: the float32
    critic's weights are exact in the half format, so both critics hold the same numbers."""
    dtype = request.param
    full = CriticNetwork(model_size="nano")
    h, z = hp.exact_dense_case(full, 16)
    # The norms' gamma and beta onto the half format's grid (the kernels already are: multiples of 1/8).
    for mlp in (full.mlp, full.mlp_ema):
        for var in mlp.layer_normalizations[0].weights:
            var.assign(to_np(var).astype(dtype).astype("float32"))
    half = CriticNetwork(model_size="nano", dtype=dtype)
    half(h, z)  # builds it
    weights = full.get_weights()
    assert all(np.array_equal(w.astype(np.float32), w) for w in weights)
    return dtype, full, half, weights, h, z


def assert_like_float32(got, full, h, z, dtype, use_ema=False):
    """`got` (value, logits) against the float32 critic's on the same weights: each is within its bound of the
    float64 reference, so the two are within the sum of the bounds; the value is the float32 head's decode of the
    logits, whose probabilities move by at most a factor exp(+-2 max|dlogit|) per row."""
    value, logits = (np.asarray(to_np(x), np.float64) for x in got)
    want_value, want_logits = (np.asarray(to_np(x), np.float64) for x in full(h, z, use_ema=use_ema))
    _, half_bound = hp.logits_bound(full, h, z, dtype, use_ema=use_ema)
    _, full_bound = hp.logits_bound(full, h, z, "float32", use_ema=use_ema)
    hp.assert_within(logits, want_logits, half_bound + full_bound, f"{dtype} logits (use_ema={use_ema})")
    # The MLP really computed in the half format (else the check above would be vacuous).
    assert np.abs(logits - want_logits).max() > 1e3 * hp.UNIT_ROUNDOFF["float32"] * np.abs(want_logits).max()
    delta = np.abs(logits - want_logits).max(axis=-1)
    _, own_bound = hp.decode_bound(full, logits)
    _, full_decode_bound = hp.decode_bound(full, want_logits)
    spread = ref.softmax(want_logits) @ np.abs(ref.uniform_buckets(want_logits.shape[-1]))
    bound = own_bound + full_decode_bound + np.expm1(2 * delta) * spread
    hp.assert_within(value, want_value, bound, f"{dtype} value (use_ema={use_ema})")


def set_other_weights(critic, weights):
    """The critic's variables hold other numbers than `weights`: a stateless entry point must use what it is
    given."""
    critic.set_weights([np.full_like(w, 0.5) for w in weights])


def test_issue_71_finding_7_float64_inputs(pair):
    dtype, full, half, weights, h, z = pair
    half.set_weights(weights)
    for use_ema in (False, True):
        assert_like_float32(half(h.astype("float64"), z.astype("float64"), use_ema=use_ema), full, h, z, dtype, use_ema)


def test_issue_71_finding_7_list_inputs(pair):
    dtype, full, half, weights, h, z = pair
    half.set_weights(weights)
    assert_like_float32(half(h.tolist(), z.tolist()), full, h, z, dtype)


def test_issue_71_finding_7_float32_inputs(pair):
    dtype, full, half, weights, h, z = pair
    half.set_weights(weights)
    assert_like_float32(half(h, z), full, h, z, dtype)


def test_issue_71_finding_7_stateless_call(pair):
    dtype, full, half, weights, h, z = pair
    half.set_weights(weights)
    # Copies: a variable's `.value` is the variable's own storage on some backends.
    trainable = [keras.ops.convert_to_tensor(to_np(v), v.dtype) for v in half.trainable_variables]
    non_trainable = [keras.ops.convert_to_tensor(to_np(v), v.dtype) for v in half.non_trainable_variables]
    set_other_weights(half, weights)
    outputs, _ = half.stateless_call(trainable, non_trainable, h.astype("float64"), z.astype("float64"))
    assert_like_float32(outputs, full, h, z, dtype)


def test_issue_71_finding_7_stateless_scope(pair):
    dtype, full, half, weights, h, z = pair
    half.set_weights(weights)
    mapping = [(v, keras.ops.convert_to_tensor(to_np(v), v.dtype)) for v in half.weights]
    set_other_weights(half, weights)
    with keras.StatelessScope(state_mapping=mapping):
        outputs = half(h.astype("float64"), z.astype("float64"))
    assert_like_float32(outputs, full, h, z, dtype)


def test_issue_71_finding_7_distribution_scope(pair):
    dtype, full, half, weights, h, z = pair
    try:
        distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices()[:1])
    except (NotImplementedError, AttributeError, ValueError) as err:
        pytest.skip(f"keras.distribution does not run on {BACKEND} ({type(err).__name__}: {err})")
    half.set_weights(weights)
    with distribution.scope():
        outputs = half(h.astype("float64"), z.astype("float64"))
    assert_like_float32(outputs, full, h, z, dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_issue_71_finding_7_the_layer_in_a_half_dtype(dtype):
    """The layer alone: gamma and beta stored in the half format, float64 input, against numpy's float64 layer
    norm on the same numbers (the float32 statistics, one rounding of the output to the half format)."""
    rng = np.random.default_rng(0)
    # float64 numbers the half format holds: the same numbers whether Keras casts them to it or not.
    x = (rng.normal(size=(8, 16)) * 3.0 + 1.0).astype(dtype).astype(np.float64)
    norm = LayerNormalization(dtype=dtype)
    norm.build(x.shape)
    gamma = (1.0 + rng.normal(0.0, 0.1, size=16)).astype(dtype).astype(np.float64)
    beta = rng.normal(0.0, 0.1, size=16).astype(dtype).astype(np.float64)
    norm.gamma.assign(gamma)
    norm.beta.assign(beta)
    assert keras.backend.standardize_dtype(norm.gamma.dtype) == dtype
    got = to_np(norm(x))
    assert got.dtype == np.dtype(dtype)
    centered = x - x.mean(axis=-1, keepdims=True)
    xhat = centered / np.sqrt((centered**2).mean(axis=-1, keepdims=True) + 1e-3)
    want = xhat * gamma + beta
    u, f32 = hp.UNIT_ROUNDOFF[dtype], hp.UNIT_ROUNDOFF["float32"]
    bound = 2 * (u * np.abs(want) + 16 * f32 * (np.abs(gamma * xhat) + np.abs(beta))) + 1e-7
    hp.assert_within(got.astype(np.float64), want, bound, f"{dtype} layer norm")
