import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multicritic import CriticNetwork, inverse_symlog, symexp, symlog, two_hot
from multicritic.math.bins import bucket_values, expected_value, two_hot_indices
from tests import numpy_reference as ref
from tests.conftest import compiled, grads_of, to_np

SCHEMES = ["uniform_symlog", "symexp"]
BIG = float(np.float32(1e30))
# Subnormals are left out: TF, XLA and MKL flush them to zero.
finite32 = st.floats(min_value=-BIG, max_value=BIG, allow_nan=False, allow_subnormal=False, width=32)


def test_spec_examples():
    out = to_np(two_hot(np.array([0.0, 0.1, -25.0, 25.0], np.float32)))
    assert out.shape == (4, 255)
    np.testing.assert_array_equal(np.nonzero(out[0])[0], [127])
    assert out[0, 127] == 1.0
    np.testing.assert_allclose(out[1, 127:129], [0.365, 0.635], atol=1e-6)
    assert out[2, 0] == 1.0 and out[3, 254] == 1.0
    np.testing.assert_array_equal(out.sum(-1), 1.0)


def test_reference_docstring_examples():
    # RLlib's two_hot docstring: 11 buckets on [-5, 5] and 5 buckets on [-1, 1].
    np.testing.assert_allclose(
        to_np(two_hot(np.float32(2.5), 11, -5.0, 5.0)), [0, 0, 0, 0, 0, 0, 0, 0.5, 0.5, 0, 0], atol=1e-7
    )
    np.testing.assert_allclose(to_np(two_hot(np.float32(0.1), 5, -1.0, 1.0)), [0, 0, 0.8, 0.2, 0], atol=1e-6)


def test_uniform_buckets_are_tf_linspace():
    b = bucket_values()
    assert b.dtype == np.float32 and b.shape == (255,)
    assert b[0] == -20.0 and b[-1] == 20.0 and b[127] == 0.0
    np.testing.assert_allclose(b, ref.uniform_buckets(), atol=2e-6)
    np.testing.assert_allclose(np.diff(b), 40 / 254, atol=4e-6)  # float32 spacing near 20


def test_symexp_buckets_are_symmetric_and_real_space():
    b = bucket_values(bin_scheme="symexp")
    np.testing.assert_array_equal(b, -b[::-1])
    assert b[127] == 0.0
    np.testing.assert_allclose(b, ref.symexp_buckets(), rtol=1e-6)
    assert np.all(np.diff(b) > 0)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (2, 3, 5)])
def test_any_leading_shape_matches_numpy(scheme, shape):
    values = np.random.default_rng(0).uniform(-22, 22, size=shape).astype(np.float32)
    out = to_np(two_hot(values, bin_scheme=scheme))
    assert out.shape == shape + (255,)
    np.testing.assert_allclose(out, ref.two_hot(values, scheme=scheme), atol=2e-5)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_exact_bucket_hits_and_bounds(scheme):
    if scheme == "uniform_symlog":
        hits = bucket_values()
    else:
        hits = to_np(symlog(bucket_values(bin_scheme=scheme)))
    hits = np.asarray(to_np(hits) if not isinstance(hits, np.ndarray) else hits, np.float32)
    out = to_np(two_hot(hits, bin_scheme=scheme))
    np.testing.assert_allclose(out.max(-1), 1.0, atol=2e-4)
    np.testing.assert_array_equal(out.argmax(-1), np.arange(255))


@settings(max_examples=60, deadline=None)
@given(value=finite32, scheme=st.sampled_from(SCHEMES))
def test_two_hot_properties(value, scheme):
    out = to_np(two_hot(np.float32(value), bin_scheme=scheme)).astype(np.float64)
    # The reference's float32 formula can give a small negative weight next to
    # an exact bucket hit (e.g. -1.2e-7 -> 1.0000008 and -8e-7); kept for parity.
    # It is the rounding of `value - lower` (half a float32 ulp at 20) over the
    # bucket spacing 40/254: at most 6.06e-6 (-8.9e-7 -> -5.7e-6).
    floor = -np.spacing(np.float32(20.0)) / 2 / (40.0 / 254) * 1.01
    assert np.all(np.isfinite(out)) and np.all(out >= floor)
    np.testing.assert_allclose(out.sum(), 1.0, atol=1e-6)
    nz = np.nonzero(np.abs(out) > -floor)[0]
    assert 1 <= len(nz) <= 2 and (len(nz) == 1 or nz[1] == nz[0] + 1)
    clipped = np.clip(value, -20.0, 20.0)
    if scheme == "uniform_symlog":
        np.testing.assert_allclose(out @ bucket_values().astype(np.float64), clipped, atol=1e-5)
    else:
        decoded = out @ bucket_values(bin_scheme="symexp").astype(np.float64)
        np.testing.assert_allclose(decoded, ref.symexp(clipped), rtol=1e-5, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(x=finite32)
def test_symlog_round_trip(x):
    x = np.float32(x)
    back = to_np(inverse_symlog(symlog(x)))
    np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-30)
    np.testing.assert_allclose(to_np(symlog(x)), ref.symlog(np.float64(x)), rtol=1e-6, atol=1e-37)


def test_symexp_is_inverse_symlog_and_safe():
    assert symexp is inverse_symlog
    big = np.array([1e30, -1e30, 3.4e38], np.float32)
    assert np.all(np.isfinite(to_np(symlog(big))))
    np.testing.assert_allclose(to_np(symexp(np.float32(20.0))), np.expm1(20.0), rtol=1e-6)
    assert np.all(np.isfinite(to_np(two_hot(big))))
    assert np.all(np.isfinite(to_np(two_hot(big, bin_scheme="symexp"))))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_expected_value(scheme):
    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.ones(255) * 0.1, size=6).astype(np.float32)
    got = to_np(expected_value(probs, bin_scheme=scheme))
    if scheme == "uniform_symlog":
        want = probs @ ref.uniform_buckets()
    else:
        want = ref.symlog(probs @ ref.symexp_buckets())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # Symmetric bounds: pairs around the centre, so a uniform row is exactly 0.
    uniform = np.full((2, 255), 1 / 255, np.float32)
    np.testing.assert_array_equal(to_np(expected_value(uniform, bin_scheme=scheme)), 0.0)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_decodes_gradient_is_the_antisymmetrised_support_for_every_row(scheme):
    # The decode is linear over mirrored pairs: d value / d p_j = a_j = (b_j - b_mirror) / 2 for any
    # probabilities, ties included (a zero-initialised head ties every pair: the gradient must not vanish
    # there), and 0 for the middle bucket.
    buckets = bucket_values(bin_scheme=scheme).astype(np.float64)
    support = ((buckets - buckets[::-1]) / 2).astype(np.float32)
    assert support[127] == 0.0 and np.array_equal(support, -support[::-1])
    if scheme == "symexp":  # built antisymmetric: the support itself
        np.testing.assert_array_equal(support, buckets.astype(np.float32))
    else:  # tf.linspace's points: exact within |1.8|, within 5.1e-7 relative beyond
        near = np.abs(buckets) < 1.8
        np.testing.assert_array_equal(support[near], buckets[near].astype(np.float32))
        np.testing.assert_allclose(support, buckets, rtol=5.1e-7, atol=0)
    rng = np.random.default_rng(5)
    probs = rng.dirichlet(np.ones(255), size=3).astype(np.float32)
    probs[1] = 1 / 255  # every pair tied
    probs[2, :127] = probs[2, 128:][::-1]  # symmetric: tied too
    (grad,) = grads_of(lambda p: keras.ops.sum(expected_value(p, bin_scheme=scheme)), probs)
    grad = to_np(grad)
    if scheme == "uniform_symlog":
        np.testing.assert_array_equal(grad, np.broadcast_to(support, grad.shape))
        return
    # symexp: the symlog of the real-space mean, its derivative 1 / (1 + |mean|) divided out; the tied rows
    # decode to 0, where symlog's own derivative differs between backends.
    mean = to_np(symexp(expected_value(probs, bin_scheme=scheme))).astype(np.float64)
    np.testing.assert_allclose(grad[0] * (1.0 + np.abs(mean[0])), support, rtol=1e-6)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_decoding_a_two_hot_gives_the_value_back(scheme):
    values = np.array([-1e6, -3.0, 0.0, 0.5, 17.0, 1e3, 1e8], np.float32)
    target = two_hot(symlog(values), bin_scheme=scheme)
    decoded = to_np(inverse_symlog(expected_value(target, bin_scheme=scheme)))
    # Real-space interpolation decodes exactly; symlog-space is exact in symlog.
    np.testing.assert_allclose(decoded, values, rtol=2e-5 if scheme == "symexp" else 1e-4)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_compiled_matches_eager(scheme):
    values = keras.ops.convert_to_tensor(np.random.default_rng(4).uniform(-30, 30, size=(5, 7)).astype(np.float32))

    def encode_decode(v):
        target = two_hot(v, bin_scheme=scheme)
        return target, expected_value(target, bin_scheme=scheme)

    for a, b in zip(to_np(encode_decode(values)), to_np(compiled(encode_decode)(values))):
        np.testing.assert_allclose(a, b, atol=1e-6)

    def round_trip(v):
        return symlog(inverse_symlog(v))

    # Fused transcendental kernels may differ from eager ones by an ulp.
    np.testing.assert_allclose(to_np(compiled(round_trip)(values)), to_np(round_trip(values)), rtol=1e-6)


def test_indices_real_space_matches_symlog_space():
    values = np.array([-5e4, -1.0, 0.0, 2.0, 3e5], np.float32)
    a = to_np(two_hot_indices(values, bin_scheme="symexp", real_space=True))
    b = to_np(two_hot_indices(np.asarray(to_np(symlog(values))), bin_scheme="symexp"))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_allclose(a[2], b[2], atol=1e-4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_buckets": 1}, "num_buckets: got 1, expected an integer >= 2"),
        ({"num_buckets": 2.5}, "num_buckets"),
        ({"lower_bound": 3.0, "upper_bound": -3.0}, "lower_bound/upper_bound"),
        ({"lower_bound": -np.inf}, "lower_bound/upper_bound"),
        ({"bin_scheme": "uniform"}, "bin_scheme: got 'uniform'"),
        ({"lower_bound": -100.0, "upper_bound": 100.0}, r"upper_bound: got \(-100.0, 100.0\), expected \|bound\|"),
        ({"lower_bound": -3.0, "upper_bound": 88.7229}, r"\|bound\| <= 88.7228 \(in float32\): symexp of a bound"),
        ({"lower_bound": 1.0, "upper_bound": 1.0000001}, "num_buckets/lower_bound/upper_bound: .*strictly increasing"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        two_hot(np.zeros(3, np.float32), **kwargs)


REFUSED = [(2, -20.0, 20.0), (4, -20.0, 20.0), (16, -20.0, 20.0), (3, -1.0, 20.0), (6, -10.0, 20.0)]
KEPT = [(18, -20.0, 20.0), (256, -20.0, 20.0), (2, -1.0, 1.0), (255, -5.0, 20.0), (3, -20.0, 20.0), (2, 0.5, 3.0)]


def _across_zero(n, low, high):
    """The real-space bracket of two buckets of opposite signs, or None."""
    table = bucket_values(n, low, high, "symexp").astype(np.float64)
    above = int(np.searchsorted(table, 0.0, side="right"))
    return (table[above - 1], table[above]) if 0 < above < n and table[above - 1] < 0 else None


def _round_trip_near_zero(n, low, high):
    """`(values, |decode(two_hot(v)) - v|)` (symlog units) over values in the bracket across 0."""
    lo, hi = _across_zero(n, low, high)
    real = np.concatenate([np.linspace(lo, hi, 2001), np.geomspace(1e-6, hi, 500), -np.geomspace(1e-6, -lo, 500)])
    values = ref.symlog(real).astype(np.float32)
    decoded = to_np(expected_value(two_hot(values, n, low, high, "symexp"), n, low, high, "symexp"))
    return values.astype(np.float64), np.abs(decoded.astype(np.float64) - values.astype(np.float64))


@pytest.mark.parametrize("n, low, high", REFUSED)
def test_a_symexp_support_too_coarse_around_zero_is_refused(n, low, high):
    """Finding 17: 2 symexp buckets over +-20 round-tripped values near 0 to within 2.8 symlog units only.
    Two buckets of opposite signs resolve the values between them to 2^-24 of their real-space width W0 (the
    two-hot weights near 1/2); such a support is refused when that is coarser than the uniform_symlog
    scheme's bound on the same grid, 2^-23 times the spacing s: W0 > 2 s."""
    spacing = (high - low) / (n - 1)
    grid = np.linspace(low, high, n)
    below, above = grid[grid < 0].max(), grid[grid > 0].min()
    assert ref.symexp(above) - ref.symexp(below) > 2 * spacing  # the rule, from the float64 grid
    match = r"num_buckets/lower_bound/upper_bound: got .* a support too coarse around 0"
    with pytest.raises(ValueError, match=match):
        bucket_values(n, low, high, "symexp")
    with pytest.raises(ValueError, match=match):
        two_hot(np.zeros(3, np.float32), n, low, high, "symexp")
    with pytest.raises(ValueError, match=match):
        CriticNetwork(model_size="nano", num_buckets=n, lower_bound=low, upper_bound=high, bin_scheme="symexp")
    # The same grid interpolated in symlog space keeps its promise.
    bucket_values(n, low, high, "uniform_symlog")


@pytest.mark.parametrize("n, low, high", KEPT)
def test_a_kept_symexp_support_round_trips_near_zero_as_promised(n, low, high):
    """Every support kept resolves values across 0 to the uniform_symlog scheme's bound, 2^-23 s, plus the
    symexp scheme's relative error elsewhere (below 1e-6: the float32 rounding of the value itself)."""
    bucket_values(n, low, high, "symexp")
    if _across_zero(n, low, high) is None:  # a bucket at 0, or all buckets of one sign: relative everywhere
        return
    spacing = (high - low) / (n - 1)
    lo, hi = _across_zero(n, low, high)
    assert hi - lo <= 2 * spacing
    values, errors = _round_trip_near_zero(n, low, high)
    bound = 2.0**-23 * spacing + 1e-6 * np.abs(values)
    assert np.all(errors <= bound), (values[np.argmax(errors / bound)], np.max(errors / bound))
