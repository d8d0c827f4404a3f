"""The numerics contract, eager and compiled, on every backend.

a. A symmetric distribution (a uniform one included) decodes to exactly 0.
b. Two-hot, then decode, gives the value back (precisely what float32 allows).
c. Finite critic inputs give finite outputs that still depend on the input.
d. Bucket supports are finite and increasing in float32, or refused.
Plus NaN and +-inf in two-hot encoding.
"""

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multicritic import CriticNetwork, CriticTrainer, RewardPredictorLayer, critic_loss, two_hot
from multicritic.math.bins import SYMLOG_LIMIT, bucket_values, expected_value, two_hot_indices
from multicritic.training.trainer import predict_function
from tests.conftest import BACKEND, compiled, randomize, to_np

SCHEMES = ["uniform_symlog", "symexp"]
POLICIES = ["float32", "mixed_bfloat16", "mixed_float16"]
TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32, 1.1754944e-38
ULP = 2.0**-24
# (num_buckets, bound): symmetric supports, odd and even, the smallest ones included.
SUPPORTS = [(255, 20.0), (256, 20.0), (2, 20.0), (3, 20.0), (41, 5.0)]
# "symexp" refuses supports too coarse around 0 (`multicritic.math.bins`): over +-20 its smallest even one is 18
# buckets; 2 buckets pass over +-1.
SYMEXP_SUPPORTS = [(255, 20.0), (256, 20.0), (18, 20.0), (2, 1.0), (3, 20.0), (41, 5.0)]


def variants(fn):
    """`fn` eager and compiled; on TensorFlow also XLA (`jit_compile=True`).

    Tracing Keras ops through torch.compile takes seconds per op on a small
    CPU, so the tests compile one function each, over a few cases."""
    out = {"eager": fn, "compiled": compiled(fn)}
    if BACKEND == "tensorflow":
        import tensorflow as tf

        out["xla"] = tf.function(fn, jit_compile=True)
    return out


def tensors(*arrays):
    return [keras.ops.convert_to_tensor(a) for a in arrays]


@pytest.fixture(params=POLICIES)
def policy(request):
    keras.config.set_dtype_policy(request.param)
    yield request.param
    keras.config.set_dtype_policy("float32")


# a. Exact zeros -------------------------------------------------------------


def symmetric_rows(n, seed):
    """A uniform row and three random symmetric ones, float32, each exactly mirror-symmetric."""
    q = np.random.default_rng(seed).random((3, n))
    q = q + q[:, ::-1]
    rows = np.concatenate([np.ones((1, n)), q / q.sum(-1, keepdims=True)]).astype(np.float32)
    assert np.array_equal(rows, rows[:, ::-1])
    return rows


@pytest.mark.parametrize("compile_it", [False, True], ids=["eager", "compiled"])
def test_symmetric_distributions_decode_to_exactly_zero(compile_it):
    cases = [("uniform_symlog", n, b) for n, b in SUPPORTS] + [("symexp", n, b) for n, b in SYMEXP_SUPPORTS]
    if compile_it:
        cases = [("uniform_symlog", 255, 20.0), ("symexp", 255, 20.0), ("symexp", 2, 1.0)]
    probs = [symmetric_rows(n, seed=n) for _, n, _ in cases]
    for p in probs:
        if p.shape[-1] == 255:
            p[0] = 1.0 / 255.0  # the head's uniform row, as softmax of zeros gives it

    def decode(*ps):
        return [expected_value(p, n, -b, b, scheme) for p, (scheme, n, b) in zip(ps, cases)]

    modes = variants(decode) if compile_it else {"eager": decode}
    for mode, fn in modes.items():
        for got, case in zip(to_np(fn(*tensors(*probs))), cases):
            np.testing.assert_array_equal(got, 0.0, err_msg=f"{mode} {case}")


def new_critics():
    h = np.random.default_rng(0).normal(size=(6, 16)).astype("float32")
    z = np.random.default_rng(1).random((6, 4, 4)).astype("float32")
    return [CriticNetwork(model_size="nano", bin_scheme=scheme) for scheme in SCHEMES], h, z


def test_a_new_critic_predicts_exactly_zero(policy):
    critics, h, z = new_critics()
    for critic in critics:
        for use_ema in (False, True):
            np.testing.assert_array_equal(to_np(critic(h, z, use_ema=use_ema)[0]), 0.0)
        # The trainer's compiled forward: jax.jit (XLA), tf.function; eager on PyTorch.
        np.testing.assert_array_equal(to_np(predict_function(critic)(h, z)[0]), 0.0)


def test_the_critic_contract_compiled():
    # One compiled function: new critics of both schemes predict exactly 0,
    # and a trained-looking one stays finite and input-dependent for huge inputs.
    critics, h, z = new_critics()
    trained = CriticNetwork(model_size="nano")
    for critic in critics + [trained]:
        critic(h, z)
    randomize(trained, seed=2, scale=0.3)

    def forward(h, z):
        return [critic(h, z)[0] for critic in critics] + [trained(h, z)[1]]

    for mode, fn in variants(forward).items():
        for scale in (1.0, 1e18, 3.4e38):
            hh = np.clip(h * np.float64(scale), -3.4e38, 3.4e38).astype(np.float32)
            *zeros, logits = to_np(fn(*tensors(hh, z)))
            for got in zeros:
                np.testing.assert_array_equal(got, 0.0, err_msg=f"{mode} scale={scale}")
            assert np.all(np.isfinite(logits)), f"{mode} scale={scale}"
            assert len({row.tobytes() for row in logits}) == len(logits), f"{mode} scale={scale}"


# b. Round trips --------------------------------------------------------------


def magnitudes(low, high, count=400, seed=0):
    """float32 values of both signs, log-uniform in |v| over [low, high], both ends included."""
    rng = np.random.default_rng(seed)
    mags = np.concatenate([[low, high], np.exp(rng.uniform(np.log(low), np.log(high), count))])
    return (mags * np.where(rng.random(mags.size) < 0.5, -1.0, 1.0)).astype(np.float32)


ROUND_TRIPS = [
    ("symexp", 255, 20.0),
    ("symexp", 3, 20.0),
    ("symexp", 41, 5.0),
    ("symexp", 18, 20.0),
    ("symexp", 256, 20.0),
    ("symexp", 2, 1.0),
    ("uniform_symlog", 255, 20.0),
    ("uniform_symlog", 3, 20.0),
    ("uniform_symlog", 2, 20.0),
    ("uniform_symlog", 41, 5.0),
]


COMPILED_ROUND_TRIPS = [("symexp", 255, 20.0), ("symexp", 3, 20.0), ("uniform_symlog", 255, 20.0)]


@pytest.fixture(scope="module")
def round_trips():
    """{case: (values, {mode: decode(two_hot(values)) in symlog space})}: every case
    eagerly, the `COMPILED_ROUND_TRIPS` compiled too (one compilation)."""
    inputs = {case: magnitudes(TINY, case[2], seed=i) for i, case in enumerate(ROUND_TRIPS)}

    def decode_all(cases):
        def fn(*values):
            return [expected_value(two_hot(v, n, -b, b, s), n, -b, b, s) for v, (s, n, b) in zip(values, cases)]

        return fn

    runs = {"eager": (ROUND_TRIPS, decode_all(ROUND_TRIPS))}
    for mode, fn in variants(decode_all(COMPILED_ROUND_TRIPS)).items():
        if mode != "eager":
            runs[mode] = (COMPILED_ROUND_TRIPS, fn)
    out = {case: (values, {}) for case, values in inputs.items()}
    for mode, (cases, fn) in runs.items():
        for case, got in zip(cases, to_np(fn(*tensors(*(inputs[c] for c in cases))))):
            out[case][1][mode] = got.astype(np.float64)
    return out


@pytest.mark.parametrize("n, bound", [(255, 20.0), (3, 20.0), (41, 5.0)])
def test_symexp_round_trip_is_relative_to_the_smallest_normal(round_trips, n, bound):
    # Odd supports have a bucket at 0, so no bracket straddles it. The weight
    # next to 0 is |v| / |bucket|: a normal float32 down to |v| = TINY * |bucket|
    # (TINY itself for the default support, whose buckets beside 0 are 0.17).
    values, got = round_trips["symexp", n, bound]
    buckets = bucket_values(n, -bound, bound, "symexp").astype(np.float64)
    normal = np.abs(values) >= TINY * max(1.0, buckets[n // 2 + 1])
    assert normal.sum() > 300
    for mode, decoded in got.items():
        np.testing.assert_allclose(decoded[normal], values[normal], rtol=1e-6, atol=0, err_msg=mode)


@pytest.mark.parametrize("n, bound", [(18, 20.0), (256, 20.0), (2, 1.0)])
def test_symexp_round_trip_across_zero_is_absolute(round_trips, n, bound):
    # Between two buckets of opposite signs float32 weights near 1/2 resolve
    # a value to about 2^-24 of the bracket's width; elsewhere relative. (18
    # buckets over +-20: the coarsest even support over it that is not refused.)
    values, got = round_trips["symexp", n, bound]
    buckets = bucket_values(n, -bound, bound, "symexp").astype(np.float64)
    width = buckets[n // 2] - buckets[n // 2 - 1]
    real = np.sign(values) * np.expm1(np.abs(values.astype(np.float64)))
    across = np.abs(real) < buckets[n // 2]
    for mode, decoded in got.items():
        err = np.abs(np.sign(decoded) * np.expm1(np.abs(decoded)) - real)
        assert err[across].max() <= 2 * ULP * width, mode
        np.testing.assert_allclose(decoded[~across], values[~across], rtol=1e-6, err_msg=mode)


@pytest.mark.parametrize("n, bound", [(255, 20.0), (3, 20.0), (2, 20.0), (41, 5.0)])
def test_uniform_symlog_round_trip(round_trips, n, bound):
    # RLlib's weights, bit for bit: `w_kp1 = 1 - w_k` resolves a value to
    # about 2^-24 of the bucket spacing, so the error is relative (1e-6)
    # above ~spacing / 16 and absolute (2^-23 * spacing) below.
    values, got = round_trips["uniform_symlog", n, bound]
    spacing = 2 * bound / (n - 1)
    big = np.abs(values) > spacing / 8
    for mode, decoded in got.items():
        err = np.abs(decoded - values)
        assert np.all(err <= np.maximum(1e-6 * np.abs(values), 2 * ULP * spacing)), mode
        np.testing.assert_allclose(decoded[big], values[big], rtol=1e-6, err_msg=mode)


# Float32 values of every magnitude, subnormals left out (XLA, TF and MKL flush them).
MAX32 = float(np.finfo(np.float32).max)
finite32 = st.floats(min_value=-MAX32, max_value=MAX32, allow_subnormal=False, width=32)


@settings(max_examples=20, deadline=None)
@given(values=st.lists(finite32, min_size=1, max_size=32))
def test_symexp_real_space_two_hot_is_exact_to_float32(values):
    # The loss's path: real-space targets, interpolated between real-space buckets.
    values = np.asarray(values, np.float32)
    k, kp1, w_k, w_kp1 = (to_np(a) for a in two_hot_indices(values, bin_scheme="symexp", real_space=True))
    buckets = bucket_values(bin_scheme="symexp").astype(np.float64)
    assert np.all((0 <= k) & (kp1 == k + 1) & (kp1 <= 254))
    assert np.all((w_k >= 0) & (w_k <= 1) & (w_kp1 >= 0) & (w_kp1 <= 1))
    np.testing.assert_allclose(w_k.astype(np.float64) + w_kp1, 1.0, atol=2 * ULP)
    decoded = w_k * buckets[k] + w_kp1 * buckets[kp1]
    want = np.clip(values.astype(np.float64), buckets[0], buckets[-1])
    tiny = np.abs(want) < TINY * buckets[128]  # the weight itself would be subnormal
    np.testing.assert_allclose(decoded[~tiny], want[~tiny], rtol=1e-6, atol=0)


@settings(max_examples=20, deadline=None)
@given(values=st.lists(st.floats(-20.0, 20.0, width=32, allow_subnormal=False), min_size=1, max_size=32))
def test_symexp_decode_of_a_two_hot_is_relative(values):
    values = np.asarray(values, np.float32)
    got = to_np(expected_value(two_hot(values, bin_scheme="symexp"), bin_scheme="symexp")).astype(np.float64)
    np.testing.assert_allclose(got, values, rtol=1e-6, atol=TINY)


# c. Finite outputs -----------------------------------------------------------


def test_the_critic_is_finite_and_input_dependent_for_huge_inputs(policy):
    critic = CriticNetwork(model_size="nano")
    h = np.random.default_rng(0).normal(size=(4, 16)).astype("float32")
    z = np.random.default_rng(1).random((4, 4, 4)).astype("float32")
    critic(h, z)
    randomize(critic, seed=2, scale=0.3)
    # Inputs the compute dtype holds: float16 tops out at 65504 (Keras casts
    # larger inputs to inf, which the critic takes as 65504); bfloat16 at 3.39e38.
    top = {"float32": 3.4e38, "mixed_bfloat16": 3.3e38, "mixed_float16": 1e30}[policy]
    depends_up_to = 6e4 if policy == "mixed_float16" else 1e18
    predict = predict_function(critic)
    for scale in (1e3, 6e4, 1e18, 1e30, top):
        hh = np.clip(h * np.float64(scale), -top, top).astype(np.float32)
        zz = (z * np.float32(min(scale, top))).astype(np.float32)
        for mode, (value, logits) in (("eager", critic(hh, zz)), ("compiled", predict(hh, zz))):
            value, logits = to_np(value), to_np(logits)
            assert np.all(np.isfinite(logits)) and np.all(np.isfinite(value)), f"{mode} scale={scale}"
            if scale <= depends_up_to:
                for a in range(4):
                    for b in range(a):
                        assert np.any(logits[a] != logits[b]), f"{mode} scale={scale}: rows {a} and {b} agree"


def test_huge_inputs_keep_the_gradients_finite():
    critic = CriticNetwork(model_size="nano")
    h = np.random.default_rng(0).normal(size=(4, 16)).astype("float32") * np.float32(1e30)
    z = np.random.default_rng(1).random((4, 4, 4)).astype("float32")
    critic(h, z)
    randomize(critic, seed=2)
    trainer = CriticTrainer(critic)
    metrics = to_np(trainer.train_step(h, z, np.ones(4, np.float32), np.ones(4, np.float32)))
    assert all(np.isfinite(v) for v in metrics.values())
    assert all(np.all(np.isfinite(to_np(v))) for v in critic.weights)


# d. Finite supports ----------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("bounds", [(-100.0, 100.0), (-20.0, 89.0), (-88.72284, 20.0), (-1e39, 0.0)])
def test_supports_without_a_finite_symexp_are_refused(scheme, bounds):
    match = r"lower_bound/upper_bound: got .*expected \|bound\| <= 88\.72"
    with pytest.raises(ValueError, match=match):
        bucket_values(255, *bounds, scheme)
    with pytest.raises(ValueError, match=match):
        RewardPredictorLayer(lower_bound=bounds[0], upper_bound=bounds[1], bin_scheme=scheme)
    with pytest.raises(ValueError, match=match):
        CriticNetwork(model_size="nano", lower_bound=bounds[0], upper_bound=bounds[1], bin_scheme=scheme)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_widest_support_is_finite(scheme):
    bound = float(np.nextafter(np.float32(SYMLOG_LIMIT), np.float32(0)))  # 88.72283
    b = bucket_values(255, -bound, bound, scheme)
    assert np.all(np.isfinite(b)) and np.all(np.diff(b) > 0)
    logits = np.zeros((2, 255), np.float32)
    out = to_np(
        critic_loss(
            logits,
            np.array([3e38, -1.0], np.float32),
            np.zeros(2, np.float32),
            np.ones(2, np.float32),
            lower_bound=-bound,
            upper_bound=bound,
            bin_scheme=scheme,
        )
    )
    assert all(np.isfinite(v) for v in out.values())


def test_supports_float32_cannot_keep_increasing_are_refused():
    with pytest.raises(ValueError, match="num_buckets/lower_bound/upper_bound: got .*strictly increasing"):
        bucket_values(255, 1.0, 1.0000001)


# NaN and infinities in two-hot -----------------------------------------------


@pytest.mark.parametrize("values", [float("nan"), np.array([0.5, np.nan, np.nan], np.float32), [1.0, float("nan")]])
def test_nan_in_host_data_is_refused(values):
    count = int(np.isnan(np.asarray(values, np.float64)).sum())
    with pytest.raises(ValueError, match=rf"values: got {count} NaN value\(s\) in an array of shape"):
        two_hot(values)
    with pytest.raises(ValueError, match=r"values: got \d NaN"):
        two_hot_indices(values, bin_scheme="symexp", real_space=True)


def test_nan_and_infinities_in_tensors():
    # NaN: the in-range pair (0, 1) with NaN weights, so a dense row of NaN
    # there and 0 elsewhere; +-inf clip to the end buckets. The same on every
    # backend and compiler.
    values = keras.ops.convert_to_tensor(np.array([[np.nan, np.inf], [-np.inf, 0.5]], np.float32))

    def encode(v):
        return [(two_hot(v, bin_scheme=s), two_hot_indices(v, bin_scheme=s, real_space=True)) for s in SCHEMES]

    for mode, fn in variants(encode).items():
        for scheme, (dense, (k, kp1, w_k, w_kp1)) in zip(SCHEMES, to_np(fn(values))):
            where = f"{mode} {scheme}"
            assert np.all(np.isnan(dense[0, 0, :2])), where
            np.testing.assert_array_equal(dense[0, 0, 2:], 0.0, err_msg=where)
            # The end bucket alone, at weight 1 (to an ulp: GPU division, as XLA emits it, may miss x / x = 1).
            np.testing.assert_allclose([dense[0, 1, 254], dense[1, 0, 0]], 1.0, rtol=2 * ULP, err_msg=where)
            np.testing.assert_array_equal(np.delete(dense[0, 1], 254), 0.0, err_msg=where)
            np.testing.assert_array_equal(dense[1, 0, 1:], 0.0, err_msg=where)
            assert not np.any(np.isnan(dense[1])), where
            assert (k[0, 0], kp1[0, 0]) == (0, 1) and np.isnan(w_k[0, 0]) and np.isnan(w_kp1[0, 0]), where
            assert np.all((k >= 0) & (kp1 <= 254)), where
