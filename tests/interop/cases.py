"""Checks shared by the interop tests: an upstream critic's recorded outputs against ours, from its weights."""

from __future__ import annotations

import os

import numpy as np
import pytest

from multicritic import critic_loss, inverse_symlog
from tests.conftest import grads_of, to_np

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "interop")


def load_npz(*parts):
    with np.load(os.path.join(DATA, *parts)) as f:
        return {k: f[k] for k in f.files}


def prefixed(golden, prefix):
    return {k[len(prefix) :]: v for k, v in golden.items() if k.startswith(prefix)}


def weights_of(critic):
    return [np.array(to_np(v.value)) for v in critic.weights]


def check_forward(critic, latent, logits, slow_logits, value=None, slow_value=None, real=True, value_rtol=1e-6):
    """Logits of the fast and slow critic (float32 matmuls: 1e-5), and their decoded values."""
    for use_ema, want_logits, want_value in ((False, logits, value), (True, slow_logits, slow_value)):
        got_value, got_logits = to_np(critic.on_latent(latent, use_ema=use_ema))
        np.testing.assert_allclose(got_logits, want_logits, rtol=1e-5, atol=1e-5)
        if want_value is not None:
            got = to_np(inverse_symlog(got_value)) if real else got_value
            scale = np.abs(want_value).max()
            np.testing.assert_allclose(got, want_value, rtol=value_rtol, atol=1e-6 * scale)


def check_loss(critic, logits, slow_logits, target, weights, total, grad_logits):
    """`critic_loss` from the upstream logits (the slow critic's decoded value as the regulariser's target):
    the total and its gradient with respect to the logits."""
    options = critic.loss_options()

    def loss(x):
        return critic_loss(x, target, None, weights, ema_logits=slow_logits, **options)["total"]

    np.testing.assert_allclose(to_np(loss(logits)), total, rtol=1e-5)
    (grad,) = grads_of(loss, logits)
    np.testing.assert_allclose(to_np(grad), grad_logits, rtol=1e-4, atol=1e-5 * np.abs(grad_logits).max())


def check_all_or_nothing(critic, load, state, key, expect=ValueError):
    """A NaN, a wrong shape, a missing and an extra entry in `state` each raise, naming it; nothing changes."""
    before = weights_of(critic)
    bad = dict(state)
    bad[key] = np.full_like(np.asarray(state[key]), np.nan)
    with pytest.raises(expect, match="non-finite"):
        load(bad)
    bad[key] = np.zeros(np.asarray(state[key]).shape + (1,), "float32")
    with pytest.raises(expect, match="got shape"):
        load(bad)
    bad = {k: v for k, v in state.items() if k != key}
    with pytest.raises(expect, match="missing"):
        load(bad)
    with pytest.raises(expect, match="unexpected"):
        load({**state, key + "_extra": state[key]})
    for b, a in zip(before, weights_of(critic)):
        np.testing.assert_array_equal(a, b)


def check_round_trip(exported, source):
    """Export gives back the source arrays bit for bit."""
    assert sorted(exported) == sorted(source)
    for k in source:
        np.testing.assert_array_equal(np.asarray(exported[k]), np.asarray(source[k]), err_msg=k)
