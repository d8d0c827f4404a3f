"""HL-Gauss targets and loss against an independent float64 computation."""

import math

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, critic_loss
from multicritic.heads.hl_gauss import HLGaussHead, hl_gauss
from tests.conftest import compiled, grads_of, to_np


def numpy_hl_gauss(values_symlog, n, low, high, sigma_ratio):
    """Per value: the N(clip(v), (sigma_ratio * width)^2) mass of each bucket [c - w/2, c + w/2], normalised."""
    centres = np.linspace(low, high, n)
    width = (high - low) / (n - 1)
    sigma = sigma_ratio * width
    out = []
    for v in np.ravel(values_symlog):
        v = min(max(float(v), low), high)
        cdf = np.array(
            [0.5 * (1.0 + math.erf((c + s * width / 2 - v) / (sigma * math.sqrt(2)))) for c in centres for s in (-1, 1)]
        ).reshape(n, 2)
        mass = cdf[:, 1] - cdf[:, 0]
        out.append(mass / mass.sum())
    return np.array(out).reshape(np.shape(values_symlog) + (n,))


@pytest.mark.parametrize("sigma", [0.75, 0.3, 2.0])
def test_targets_match_an_independent_computation(sigma):
    values = np.array([-25.0, -20.0, -3.3, -0.01, 0.0, 0.2, 7.77, 19.99, 20.0, 1e6], np.float32)
    got = to_np(hl_gauss(values, 255, -20.0, 20.0, sigma))
    want = numpy_hl_gauss(values, 255, -20.0, 20.0, sigma)
    # float32 edges near +-20 carry 2e-6 of rounding, which the Gaussian's
    # slope turns into ~1e-5 of probability.
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)


def test_targets_are_centred_on_the_value_and_clipped_to_the_support():
    values = np.array([-30.0, -5.05, 0.0, 3.1, 30.0], np.float32)
    probs = to_np(hl_gauss(values, 101, -10.0, 10.0, 0.75)).astype(np.float64)
    centres = np.linspace(-10.0, 10.0, 101)
    mean = probs @ centres
    # Inside the support, away from its ends, the histogram's mean is the value.
    np.testing.assert_allclose(mean[1:4], values[1:4], atol=1e-4)
    # Out-of-range targets clip to the outer centres: all their mass at that end.
    assert probs[0].argmax() == 0 and probs[-1].argmax() == 100
    np.testing.assert_array_equal(probs[0], probs[0 if values[0] < -10 else 0])


def test_loss_and_gradient_are_the_cross_entropy_to_the_histogram():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 255)).astype(np.float32)
    targets = (rng.normal(size=6) * 100).astype(np.float32)
    ema = rng.normal(size=6).astype(np.float32)
    weights = rng.uniform(0.5, 1.0, size=6).astype(np.float32)
    lp = logits - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
    t_value = numpy_hl_gauss(np.sign(targets) * np.log1p(np.abs(targets)), 255, -20.0, 20.0, 0.75)
    t_ema = numpy_hl_gauss(ema, 255, -20.0, 20.0, 0.75)
    nll, reg = -(t_value * lp).sum(-1), -(t_ema * lp).sum(-1)

    fixed = [keras.ops.convert_to_tensor(x) for x in (targets, ema, weights)]  # constants of a compiled function

    def total(lg):
        return critic_loss(lg, *fixed, head="hl_gauss", ema_regularizer_weight=0.5)["total"]

    out = to_np(critic_loss(logits, targets, ema, weights, head="hl_gauss", ema_regularizer_weight=0.5))
    np.testing.assert_allclose(out["total"], np.mean((nll + 0.5 * reg) * weights), rtol=1e-5)
    np.testing.assert_allclose(out["value_nll"], nll.mean(), rtol=1e-5)
    np.testing.assert_allclose(to_np(compiled(total)(keras.ops.convert_to_tensor(logits))), out["total"], rtol=1e-6)
    # d total / d logits = ((1 + rw) softmax - t_value - rw t_ema) * w / N
    probs = np.exp(lp)
    want = (1.5 * probs - t_value - 0.5 * t_ema) * weights[:, None] / 6
    np.testing.assert_allclose(to_np(grads_of(total, logits)[0]), want, atol=1e-6)


def test_symexp_bins_are_refused():
    with pytest.raises(ValueError, match="bin_scheme: got 'symexp' with head='hl_gauss'"):
        HLGaussHead(bin_scheme="symexp")
    with pytest.raises(ValueError, match="hl_gauss_sigma: got -1"):
        CriticNetwork(model_size="nano", head="hl_gauss", hl_gauss_sigma=-1)


def test_a_new_hl_gauss_critic_predicts_zero():
    critic = CriticNetwork(model_size="nano", head="hl_gauss")
    value, logits = critic(np.ones((3, 16), "float32"), np.ones((3, 4, 4), "float32"))
    np.testing.assert_array_equal(to_np(value), 0.0)
    assert tuple(logits.shape) == (3, 255)


def test_sigma_is_refused_where_float32_histograms_break():
    """Finding 8: sigma=1e-40 (accepted as > 0) gave NaN rows at bucket edges. scale = 1 / (sigma * width *
    sqrt(2)) times distances up to span = 40 + width must stay finite in float32, so sigma >= span / (width *
    sqrt(2) * float32_max); and the total mass 2 * erf(scale * width / 2) above the smallest normal float32,
    so sigma <= 1 / (2 * sqrt(2) * tiny)."""
    width = 40.0 / 254
    low = (40.0 + width) / (width * math.sqrt(2.0) * float(np.finfo(np.float32).max))
    high = 1.0 / (2.0 * math.sqrt(2.0) * float(np.finfo(np.float32).tiny))
    edges = -20.0 - width / 2 + width * np.arange(1, 255)  # values exactly on an edge: the NaN rows of the finding
    for bad in (1e-40, low / 2, high * 2, 0.0, float("nan"), "0.75"):
        with pytest.raises(ValueError, match=r"hl_gauss_sigma: got"):
            CriticNetwork(model_size="nano", head="hl_gauss", hl_gauss_sigma=bad)
        with pytest.raises(ValueError, match=r"^sigma: got"):
            HLGaussHead(sigma=bad)
        with pytest.raises(ValueError, match=r"sigma: got"):
            hl_gauss(edges.astype("float32"), sigma=bad)
    for ok in (low * 2, 1e-3, 100.0, high / 2):
        rows = to_np(hl_gauss(edges.astype("float32"), sigma=ok))
        assert np.all(np.isfinite(rows)), ok
        np.testing.assert_allclose(rows.sum(-1), 1.0, rtol=1e-5)
    # The bound follows the support: a wider bucket takes a smaller sigma.
    CriticNetwork(model_size="nano", head="hl_gauss", hl_gauss_sigma=low / 2, num_buckets=3)
