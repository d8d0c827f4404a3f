import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multicritic import dream_loss_weights, lambda_returns
from tests import numpy_reference as ref
from tests.conftest import compiled, to_np


def inputs(h1=6, b=4, seed=0):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(h1, b)).astype(np.float32)
    continues = (rng.random(size=(h1, b)) > 0.2).astype(np.float32)
    values = rng.normal(size=(h1, b)).astype(np.float32)
    return rewards, continues, values


def test_hand_computed_example():
    # H = 2, one trajectory; gamma 0.5, lambda 0.5, by hand:
    # R_2 = v_2 = 4; R_1 = r_2 + .5*c_2*(.5*v_2 + .5*R_2) = 1 + .5*(2 + 2) = 3
    # R_0 = r_1 + .5*c_1*(.5*v_1 + .5*R_1) = 2 + .5*(1 + 1.5) = 3.25
    rewards = np.array([[9.0], [2.0], [1.0]], np.float32)
    continues = np.array([[0.0], [1.0], [1.0]], np.float32)
    values = np.array([[7.0], [2.0], [4.0]], np.float32)
    out = to_np(lambda_returns(rewards, continues, values, gamma=0.5, lambda_=0.5))
    np.testing.assert_allclose(out, [[3.25], [3.0]], rtol=1e-6)


def test_matches_numpy_reference():
    r, c, v = inputs(16, 8)
    np.testing.assert_allclose(to_np(lambda_returns(r, c, v)), ref.lambda_returns(r, c, v), rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), gamma=st.floats(0.5, 1.0))
def test_lambda_one_is_bootstrapped_monte_carlo(seed, gamma):
    r, c, v = inputs(7, 3, seed)
    out = to_np(lambda_returns(r, c, v, gamma=gamma, lambda_=1.0))
    h = 6
    for t in range(h):
        want = v[h] * np.prod(gamma * c[t + 1 : h + 1], axis=0)
        for k in range(t + 1, h + 1):
            want = want + r[k] * np.prod(gamma * c[t + 1 : k], axis=0)
        np.testing.assert_allclose(out[t], want, rtol=1e-4, atol=1e-4)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_lambda_zero_is_one_step_td(seed):
    r, c, v = inputs(7, 3, seed)
    out = to_np(lambda_returns(r, c, v, gamma=0.9, lambda_=0.0))
    np.testing.assert_allclose(out, r[1:] + 0.9 * c[1:] * v[1:], rtol=1e-5, atol=1e-6)


def test_trailing_dims_and_compiled():
    rng = np.random.default_rng(5)
    r, c, v = (rng.normal(size=(5, 2, 3)).astype(np.float32) for _ in range(3))
    eager = to_np(lambda_returns(r, c, v))
    assert eager.shape == (4, 2, 3)
    fn = compiled(lambda a, b, d: lambda_returns(a, b, d))
    got = to_np(fn(*(keras.ops.convert_to_tensor(x) for x in (r, c, v))))
    np.testing.assert_allclose(got, eager, rtol=1e-6, atol=1e-6)


def test_dream_loss_weights():
    c = np.array([[1.0, 0.0], [1.0, 1.0], [0.5, 1.0], [1.0, 0.0]], np.float32)
    got = to_np(dream_loss_weights(c, gamma=0.9))
    want = np.array([[1.0, 0.0], [0.9, 0.0], [0.9**2 * 0.5, 0.0], [0.9**3 * 0.5, 0.0]])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(to_np(dream_loss_weights(c)), ref.dream_loss_weights(c), rtol=1e-6)


@pytest.mark.parametrize(
    "shapes, match",
    [
        (((5, 3), (5, 3), (4, 3)), r"values: got shape \[4, 3\], expected \[5, 3\] \(the shape of rewards\)"),
        (((5, 3), (5, 2), (5, 3)), r"continues: got shape \[5, 2\]"),
        (((1, 3), (1, 3), (1, 3)), r"expected time-major \[H\+1, \.\.\.\]"),
    ],
)
def test_bad_shapes(shapes, match):
    with pytest.raises(ValueError, match=match):
        lambda_returns(*(np.zeros(s, np.float32) for s in shapes))


def test_replay_returns_match_a_numpy_transcription():
    from multicritic import replay_lambda_returns

    rng = np.random.default_rng(3)
    t, b = 6, 4
    rewards, boot = rng.normal(size=(t, b)), rng.normal(size=(t, b)) * 10
    last = (rng.uniform(size=(t, b)) < 0.2).astype(float)
    term = last * (rng.uniform(size=(t, b)) < 0.5)
    want = np.zeros((t - 1, b))
    ret = boot[-1]
    for i in reversed(range(t - 1)):
        live, mix = (1 - term[i + 1]) * 0.99, (1 - last[i + 1]) * 0.9
        ret = rewards[i + 1] + (1 - mix) * live * boot[i + 1] + mix * live * ret
        want[i] = ret
    got = replay_lambda_returns(*(x.astype("float32") for x in (rewards, last, term, boot)), 0.99, 0.9)
    np.testing.assert_allclose(to_np(got), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="expected time-major"):
        replay_lambda_returns(rewards[:1], last[:1], term[:1], boot[:1])
