import keras
import numpy as np
import pytest

from multicritic import MLP
from multicritic.layers.layer_norm import layer_norm
from tests.conftest import compiled, to_np
from tests.numpy_reference import EPS_LN, sigmoid


def numpy_mlp(mlp, x):
    for dense, norm in zip(mlp.dense_layers, mlp.layer_normalizations):
        a = x @ to_np(dense.kernel).astype(np.float64)
        a = (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + EPS_LN)
        y = a * to_np(norm.gamma) + to_np(norm.beta)
        x = y * sigmoid(y)
    if mlp.output_layer is not None:
        x = x @ to_np(mlp.output_layer.kernel) + to_np(mlp.output_layer.bias)
    return x


@pytest.mark.parametrize("size, layers, units", [("nano", 1, 16), ("S", 2, 512), ("M", 3, 640)])
def test_structure(size, layers, units):
    mlp = MLP(model_size=size)
    assert len(mlp.dense_layers) == len(mlp.layer_normalizations) == layers
    assert mlp.output_layer is None
    out = mlp(np.zeros((3, 10), "float32"))
    assert out.shape == (3, units)
    assert all(not d.use_bias for d in mlp.dense_layers)
    assert all(n.epsilon == 1e-3 and n.center and n.scale for n in mlp.layer_normalizations)


def test_matches_numpy_with_random_weights():
    mlp = MLP(model_size=None, num_dense_layers=2, dense_hidden_units=12, output_layer_size=5)
    x = np.random.default_rng(0).normal(size=(7, 9)).astype("float32")
    mlp.build(x.shape)
    rng = np.random.default_rng(1)
    for v in mlp.weights:
        v.assign(rng.normal(size=tuple(v.shape)).astype("float32"))
    np.testing.assert_allclose(to_np(mlp(x)), numpy_mlp(mlp, x.astype(np.float64)), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("members", [None, 3])
@pytest.mark.parametrize("rows", [5, 40])
def test_parts_give_the_mlp_of_their_concatenation(rows, members):
    # Fewer rows than the units (12, PyTorch) or the input's width (25): the parts are concatenated; more: each
    # meets its own kernel rows.
    mlp = MLP(model_size=None, num_dense_layers=2, dense_hidden_units=12, members=members)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(rows, 9)).astype("float32"), rng.normal(size=(rows, 16)).astype("float32")
    mlp.build((None, 25))
    randomize_weights(mlp)
    whole = to_np(mlp(np.concatenate([a, b], -1)))
    parts = to_np(mlp([keras.ops.convert_to_tensor(a), keras.ops.convert_to_tensor(b)]))
    np.testing.assert_allclose(parts, whole, rtol=1e-5, atol=1e-5)
    if members is None:
        np.testing.assert_allclose(
            parts, numpy_mlp(mlp, np.concatenate([a, b], -1).astype(np.float64)), rtol=2e-5, atol=2e-5
        )


def test_config_round_trip():
    mlp = MLP(model_size="micro", output_layer_size=3, name="m")
    clone = MLP.from_config(mlp.get_config())
    assert clone.get_config() == mlp.get_config()
    assert clone.num_dense_layers == 1 and clone.dense_hidden_units == 32 and clone.output_layer_size == 3


def test_bad_input():
    with pytest.raises(ValueError, match="num_dense_layers/dense_hidden_units"):
        MLP(model_size=None)
    with pytest.raises(ValueError, match="model_size"):
        MLP(model_size="huge")
    with pytest.raises(ValueError, match="output_layer_size"):
        MLP(model_size="nano", output_layer_size=0)


def numpy_layer_norm(x, gamma, beta):
    x = np.asarray(x, np.float64)
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + EPS_LN) * gamma + beta


@pytest.mark.parametrize("scale", [1.0, 1e17, 1e20, 1e30, "mixed"])
def test_layer_norm_of_huge_rows_is_finite_and_exact(scale):
    # Past about 2^60 the variance overflows float32; such rows are still
    # normalised by their exact scale (epsilon aside, which they dwarf), also
    # next to ordinary rows in one batch (TensorFlow: the fallback's branch).
    rng = np.random.default_rng(0)
    scale = np.array([[1.0], [1e30], [3.0], [1e20], [1e-3]]) if scale == "mixed" else scale
    x = (rng.normal(size=(5, 16)) * scale).astype(np.float32)
    gamma, beta = rng.normal(size=16).astype(np.float32), rng.normal(size=16).astype(np.float32)
    g, b = keras.ops.convert_to_tensor(gamma), keras.ops.convert_to_tensor(beta)
    fn = lambda x: layer_norm(x, g, b, 1e-3)  # noqa: E731
    for mode, f in (("eager", fn), ("compiled", compiled(fn))):
        got = to_np(f(keras.ops.convert_to_tensor(x)))
        np.testing.assert_allclose(got, numpy_layer_norm(x, gamma, beta), rtol=2e-5, atol=2e-5, err_msg=mode)


def test_mlp_of_huge_inputs_matches_float64():
    # Exact for any finite input: the first Dense runs on its input times
    # 2^-32 (and its LayerNorm on epsilon times 2^-64), which changes no bit
    # for ordinary inputs, so it cannot overflow.
    mlp = MLP(model_size=None, num_dense_layers=2, dense_hidden_units=12)
    x = np.random.default_rng(0).normal(size=(7, 9))
    mlp.build(x.shape)
    randomize_weights(mlp)
    for scale in (1e20, 1e28, 1e36, 3e38):
        xs = (x * scale).clip(-3.4e38, 3.4e38).astype(np.float32)
        np.testing.assert_allclose(to_np(mlp(xs)), numpy_mlp(mlp, xs.astype(np.float64)), rtol=2e-5, atol=2e-5)


def test_clips_inputs_says_whether_a_nonfinite_input_can_give_finite_outputs():
    x = np.zeros((4, 9), np.float32)
    x[1, 2], x[2, 0] = np.inf, np.nan
    for policy, clips in (("float32", False), ("mixed_float16", True)):
        mlp = MLP(model_size=None, num_dense_layers=1, dense_hidden_units=12, dtype=policy)
        mlp.build(x.shape)
        randomize_weights(mlp)
        assert mlp.clips_inputs == clips
        out = to_np(mlp(x)).astype(np.float64)
        assert np.isfinite(out[[0, 3]]).all()
        assert np.isfinite(out[1]).all() == clips and np.isnan(out[2]).all()
    float32 = MLP(model_size=None, num_dense_layers=1, dense_hidden_units=12)
    float32.build(x.shape)
    float32.dense_layers[0].quantize("int8")
    assert float32.clips_inputs


def test_float16_mlp_saturates_instead_of_overflowing():
    # float16 holds |x| <= 65504: rows above 2^8 are scaled down to it before
    # the first Dense (whose output would overflow), and +-inf, what Keras's
    # float16 cast makes of larger inputs, counts as 65504.
    mlp = MLP(model_size=None, num_dense_layers=1, dense_hidden_units=12, dtype="mixed_float16")
    x = np.random.default_rng(0).normal(size=(7, 9))
    mlp.build(x.shape)
    randomize_weights(mlp)
    for scale in (1.0, 3e3, 6e4):
        xs = (x * scale).clip(-65504, 65504).astype(np.float16)
        # The reference takes the rows as the MLP does, scaled to 2^8 (exactly, in float64): the LayerNorm then
        # differs from that of the unscaled row by epsilon's share only.
        peak = np.abs(xs.astype(np.float64)).max(-1, keepdims=True)
        scaled = xs.astype(np.float64) * np.minimum(2.0**8 / peak, 1.0)
        want, bound = float16_mlp_bound(mlp, scaled, rescaled=peak > 2.0**8)
        got = to_np(mlp(xs)).astype(np.float64)
        assert np.all(np.abs(got - want) <= bound), (scale, np.max(np.abs(got - want) / bound))
        if scale == 1.0:  # and the MLP really computed in float16 (else the bound above would be vacuous)
            assert np.abs(got - want).max() > 1e3 * 2.0**-24 * np.abs(want).max()
    inf = np.where(x > 0, np.inf, -np.inf).astype(np.float16)
    np.testing.assert_allclose(to_np(mlp(inf)), to_np(mlp(np.sign(x).astype(np.float16) * 65504)), atol=0)


def float16_mlp_bound(mlp, x, rescaled):
    """`(want, bound)`: the float64 one-layer MLP on `x` (`[B, n]`, the row-scaled float16 input) and the bound
    on a float16 run of it, from float16's unit roundoff u = 2^-11 (every rounding: the exact value times
    (1 + d), |d| <= u), never from one machine's gaps (a CPU with native float16 arithmetic rounds after every
    operation, others keep float32 intermediates; both are within it):

    - the first Dense: a rescaled row's entries rounded twice (the float16 factor, the product), the kernel
      once (its float16 cast), `n` roundings of the dot product's accumulation (float16 or float32
      accumulator) and one of its float16 output: |da| <= (n + 2) u (|x| @ |W|), (n + 4) u for a rescaled row;
    - the LayerNorm, in float32 (`layer_norm`): its centred, scaled row moves by at most (2 M + |n| M) / sigma
      for M = max |da| of the row (mean and standard deviation are 1-Lipschitz in the max norm), its float32
      sums add 16 float32 roundings, and its output is rounded once to float16 (u |y|);
    - SiLU in float16: |silu'| <= 1.1 times that, plus 5 roundings of its result.

    A factor 2 covers the second-order terms."""
    assert len(mlp.dense_layers) == 1 and mlp.output_layer is None
    u, f32 = 2.0**-11, 2.0**-24
    kernel = to_np(mlp.dense_layers[0].kernel).astype(np.float64)
    gamma, beta = (
        to_np(w).astype(np.float64) for w in (mlp.layer_normalizations[0].gamma, mlp.layer_normalizations[0].beta)
    )
    a = x @ kernel
    sigma = np.sqrt(a.var(-1, keepdims=True) + EPS_LN)
    normed = (a - a.mean(-1, keepdims=True)) / sigma
    y = normed * gamma + beta
    want = y / (1.0 + np.exp(-y))
    roundings = x.shape[-1] + 2 + np.where(rescaled, 2, 0)
    big_m = (roundings * u * (np.abs(x) @ np.abs(kernel))).max(-1, keepdims=True)
    dy = (
        np.abs(gamma) * (2 * big_m + np.abs(normed) * big_m) / sigma
        + 16 * f32 * (np.abs(gamma * normed) + np.abs(beta))
        + u * np.abs(y)
    )
    return want, 2 * (1.1 * dy + 5 * u * np.abs(want)) + 1e-7


def randomize_weights(mlp, seed=1):
    rng = np.random.default_rng(seed)
    for v in mlp.weights:
        v.assign(rng.normal(size=tuple(v.shape)).astype("float32"))


def numpy_rms_mlp(mlp, x, eps):
    """The official 2024 block: Dense with bias -> RMSNorm (scale only) -> SiLU, float64."""
    for dense, norm in zip(mlp.dense_layers, mlp.layer_normalizations):
        a = x @ to_np(dense.kernel).astype(np.float64) + to_np(dense.bias)
        y = a / np.sqrt((a**2).mean(-1, keepdims=True) + eps) * to_np(norm.gamma)
        x = y * sigmoid(y)
    return x


def test_rms_norm_with_biases_matches_numpy():
    mlp = MLP(model_size=None, num_dense_layers=3, dense_hidden_units=12, norm="rms", norm_epsilon=1e-4, use_bias=True)
    x = np.random.default_rng(0).normal(size=(7, 9)).astype("float32")
    mlp.build(x.shape)
    assert all(d.use_bias for d in mlp.dense_layers)
    assert all(n.rms and n.beta is None and n.epsilon == 1e-4 for n in mlp.layer_normalizations)
    rng = np.random.default_rng(1)
    for v in mlp.weights:
        v.assign(rng.normal(size=tuple(v.shape)).astype("float32"))
    want = numpy_rms_mlp(mlp, x.astype(np.float64), 1e-4)
    np.testing.assert_allclose(to_np(mlp(x)), want, rtol=2e-5, atol=2e-5)
    # Huge inputs (clipped to +-2^96 for a first Dense with a bias) stay finite.
    assert np.isfinite(to_np(mlp(np.full((2, 9), 3e38, "float32")))).all()
    clone = MLP.from_config(mlp.get_config())
    assert (clone.norm, clone.norm_epsilon, clone.use_bias) == ("rms", 1e-4, True)
    with pytest.raises(ValueError, match="norm: got 'batch'"):
        MLP(model_size="nano", norm="batch")
    with pytest.raises(ValueError, match="norm_epsilon"):
        MLP(model_size="nano", norm_epsilon=0.0)
    with pytest.raises(ValueError, match="use_bias"):
        MLP(model_size="nano", use_bias="yes")


@pytest.mark.parametrize("scale", [1.0, 1e20, 1e30])
def test_rms_norm_of_huge_rows_is_finite_and_exact(scale):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(5, 16)) * scale).astype(np.float32)
    gamma = rng.normal(size=16).astype(np.float32)
    got = to_np(layer_norm(keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(gamma), 0.0, 1e-4, center=False))
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-4) * gamma
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
