import keras
import numpy as np
import pytest

from multicritic import critic_loss, two_hot
from tests import numpy_reference as ref
from tests.conftest import compiled, grads_of, to_np


def batch(h=5, b=4, seed=0, scale=100.0):
    rng = np.random.default_rng(seed)
    logits = (2 * rng.normal(size=(h, b, 255))).astype(np.float32)
    targets = (scale * rng.normal(size=(h, b))).astype(np.float32)
    ema = rng.uniform(-8, 8, size=(h, b)).astype(np.float32)
    weights = rng.uniform(0, 1, size=(h, b)).astype(np.float32)
    return logits, targets, ema, weights


def numpy_loss(logits, targets, ema, weights, scheme="uniform_symlog", rw=1.0):
    lp = ref.log_softmax(logits.astype(np.float64))
    nll = -(lp * ref.two_hot(ref.symlog(targets), scheme=scheme)).sum(-1)
    reg = -(lp * ref.two_hot(ema, scheme=scheme)).sum(-1)
    return np.mean((nll + rw * reg) * weights), nll.mean(), reg.mean()


@pytest.mark.parametrize("scheme", ["uniform_symlog", "symexp"])
def test_matches_numpy(scheme):
    logits, targets, ema, weights = batch()
    out = to_np(critic_loss(logits, targets, ema, weights, bin_scheme=scheme))
    total, nll, reg = numpy_loss(logits, targets, ema, weights, scheme)
    np.testing.assert_allclose(out["total"], total, rtol=1e-5)
    np.testing.assert_allclose(out["value_nll"], nll, rtol=1e-5)
    np.testing.assert_allclose(out["ema_regularizer"], reg, rtol=1e-5)
    assert out["clipped_fraction"] == 0.0 and out["nonfinite_targets"] == 0.0


def test_plain_mean_keeps_masked_positions_in_the_denominator():
    logits, targets, ema, weights = batch()
    weights[:, 1:] = 0.0
    out = to_np(critic_loss(logits, targets, ema, weights))
    per = numpy_loss(logits[:, :1], targets[:, :1], ema[:, :1], weights[:, :1])[0]
    np.testing.assert_allclose(out["total"], per / 4, rtol=1e-5)


@pytest.mark.parametrize("rw, form", [(1.0, "two_hot_mean"), (0.3, "two_hot_mean"), (0.5, "distribution")])
def test_gradient_is_softmax_minus_targets(rw, form):
    logits, targets, ema, weights = batch(3, 2)
    ema_logits = np.random.default_rng(9).normal(size=logits.shape).astype(np.float32)

    def total(lg, tg, em, w):
        return critic_loss(lg, tg, em, w, ema_regularizer=form, ema_regularizer_weight=rw, ema_logits=ema_logits)[
            "total"
        ]

    g_logits, g_targets, g_ema, g_weights = grads_of(total, logits, targets, ema, weights)
    p = ref.softmax(logits.astype(np.float64))
    t_val = ref.two_hot(ref.symlog(targets))
    t_ema = ref.two_hot(ema) if form == "two_hot_mean" else ref.softmax(ema_logits.astype(np.float64))
    want = ((1 + rw) * p - t_val - rw * t_ema) * weights[..., None] / targets.size
    np.testing.assert_allclose(to_np(g_logits), want, rtol=1e-5, atol=1e-6)
    for g in (g_targets, g_ema, g_weights):  # stop-gradient'd
        assert g is None or np.all(to_np(g) == 0.0)


def test_distribution_regularizer_matches_numpy():
    logits, targets, _, weights = batch()
    ema_logits = np.random.default_rng(8).normal(size=logits.shape).astype(np.float32)
    out = to_np(critic_loss(logits, targets, None, weights, ema_regularizer="distribution", ema_logits=ema_logits))
    lp = ref.log_softmax(logits.astype(np.float64))
    reg = -(ref.softmax(ema_logits.astype(np.float64)) * lp).sum(-1)
    np.testing.assert_allclose(out["ema_regularizer"], reg.mean(), rtol=1e-5)


def test_compiled_matches_eager():
    args = [keras.ops.convert_to_tensor(a) for a in batch()]
    eager = to_np(critic_loss(*args))
    jitted = to_np(compiled(lambda *a: critic_loss(*a))(*args))
    for key in eager:
        np.testing.assert_allclose(jitted[key], eager[key], rtol=1e-6)


def test_numerically_safe_for_huge_logits_and_targets():
    logits, targets, ema, weights = batch(scale=1.0)
    logits[0] = 1e4
    logits[1] = -1e4
    logits[2, :, ::2] = 1e4
    targets[:, 0] = 1e30
    targets[:, 1] = -1e30
    ema[:, 2] = 1e30
    out = to_np(critic_loss(logits, targets, ema, weights))
    assert all(np.isfinite(v) for v in out.values())
    assert out["clipped_fraction"] == pytest.approx(2 / 4)
    g = to_np(grads_of(lambda lg: critic_loss(lg, targets, ema, weights)["total"], logits)[0])
    assert np.all(np.isfinite(g))


def test_nonfinite_targets_are_dropped_and_counted():
    logits, targets, ema, weights = batch()
    clean = to_np(critic_loss(logits, targets, ema, weights))
    targets[0, 0] = np.nan
    ema[1, 1] = np.inf
    targets[1, 0] = -np.inf
    out = to_np(critic_loss(logits, targets, ema, weights))
    assert out["nonfinite_targets"] == 3.0
    assert out["clipped_fraction"] == 0.0  # dropped, not clipped
    assert all(np.isfinite(v) for v in out.values())
    mask = np.ones(targets.shape, bool)
    mask[0, 0] = mask[1, 1] = mask[1, 0] = False
    lp = ref.log_softmax(logits.astype(np.float64))
    nll = -(lp * ref.two_hot(ref.symlog(np.nan_to_num(targets, neginf=0)))).sum(-1)
    reg = -(lp * ref.two_hot(np.nan_to_num(ema, posinf=0))).sum(-1)
    np.testing.assert_allclose(out["total"], np.mean((nll + reg) * weights * mask), rtol=1e-5)
    assert out["total"] != clean["total"]


def test_two_hot_helper_agrees_with_loss():
    # value_nll is the cross-entropy against the public two_hot of symlog(targets).
    logits, targets, ema, weights = batch()
    dense = to_np(two_hot(np.sign(targets) * np.log1p(np.abs(targets))))
    lp = ref.log_softmax(logits.astype(np.float64))
    np.testing.assert_allclose(
        to_np(critic_loss(logits, targets, ema, weights)["value_nll"]), -(lp * dense).sum(-1).mean(), rtol=1e-5
    )


@pytest.mark.parametrize(
    "shapes, match",
    [
        (((4, 3, 255), (4, 3), (4, 3), (5, 3)), r"loss_weights: got shape \[5, 3\], expected \[4, 3\].*take \[:-1\]"),
        (((4, 3, 255), (5, 3), (4, 3), (4, 3)), r"value_targets: got shape \[5, 3\], expected \[4, 3\]"),
        (((4, 3, 255), (4, 3), (4, 2), (4, 3)), r"ema_value_symlog: got shape \[4, 2\]"),
        (((4, 3, 254), (4, 3), (4, 3), (4, 3)), r"logits: got shape \[4, 3, 254\], expected \[\.\.\., units=255\]"),
        (((12, 255), (4, 3), (4, 3), (4, 3)), r"value_targets: got shape \[4, 3\], expected \[12\]"),
    ],
)
def test_bad_shapes(shapes, match):
    with pytest.raises(ValueError, match=match):
        critic_loss(*(np.zeros(s, np.float32) for s in shapes))


def test_bad_options():
    logits, targets, ema, weights = batch()
    with pytest.raises(ValueError, match="ema_logits: got None"):
        critic_loss(logits, targets, ema, weights, ema_regularizer="distribution")
    with pytest.raises(ValueError, match="ema_regularizer: got 'kl'"):
        critic_loss(logits, targets, ema, weights, ema_regularizer="kl")
