"""`sheeprl_distribution`: the critic's head with the interface sheeprl's `train` uses of its
`TwoHotEncodingDistribution`, against numpy goldens (both bucket schemes), on every backend; the 2023
critic's against sheeprl's own class in `test_upstream_live.py`."""

import numpy as np
import pytest
from keras import ops

from multicritic import CriticNetwork
from multicritic.interop import sheeprl
from tests.conftest import to_np

H, C, K = 6, 2, 3


def critic_with(bin_scheme):
    options = dict(sheeprl.CRITIC_OPTIONS) if bin_scheme == "uniform_symlog" else {"bin_scheme": "symexp"}
    critic = CriticNetwork(
        model_size=None, num_dense_layers=1, dense_hidden_units=8, gru_units=H, num_z_categoricals=C,
        num_z_classes=K, **options
    )  # fmt: skip
    critic(np.zeros((1, H), "float32"), np.zeros((1, C, K), "float32"))
    return critic


def symexp(x):
    return np.sign(x) * np.expm1(np.abs(x))


def golden(logits, x, bin_scheme):
    """numpy: the real-space mean `[..., 1]` and the two-hot log-likelihood of real `x [..., 1]`, interpolated
    in symlog space (2023) or in real space over symexp buckets (2024)."""
    logits = logits.astype("float64")
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    points = np.linspace(-20.0, 20.0, 255)
    if bin_scheme == "uniform_symlog":
        mean = symexp((np.exp(logp) * points).sum(-1, keepdims=True))
        support, target = points, np.sign(x) * np.log1p(np.abs(x))
    else:
        support, target = symexp(points), x
        mean = (np.exp(logp) * support).sum(-1, keepdims=True)
    target = np.clip(target[..., 0], support[0], support[-1])
    k = np.clip(np.searchsorted(support, target, side="right") - 1, 0, 253)
    w = (target - support[k]) / (support[k + 1] - support[k])
    rows = np.take_along_axis(logp, k[..., None], -1)[..., 0], np.take_along_axis(logp, k[..., None] + 1, -1)[..., 0]
    return mean, (1 - w) * rows[0] + w * rows[1]


@pytest.mark.parametrize("bin_scheme", ["uniform_symlog", "symexp"])
def test_mean_and_log_prob_are_the_goldens(bin_scheme):
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(4, 5, 255)) * 3).astype("float32")
    x = (rng.normal(size=(4, 5, 1)) * np.array([1.0, 1e2, 1e4, 1e6])[:, None, None]).astype("float32")
    distribution = sheeprl.sheeprl_distribution(critic_with(bin_scheme))(ops.convert_to_tensor(logits), dims=1)
    mean, log_prob = golden(logits, x.astype("float64"), bin_scheme)
    assert tuple(distribution.mean.shape) == (4, 5, 1)
    np.testing.assert_allclose(to_np(distribution.mean), mean, rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(to_np(distribution.mode), mean, rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(to_np(distribution.log_prob(ops.convert_to_tensor(x))), log_prob, rtol=1e-5, atol=1e-4)


def test_the_mean_is_the_critics_value():
    critic = critic_with("symexp")
    rng = np.random.default_rng(1)
    for var in critic.weights:  # the zero-initialised head would make every value 0
        var.assign(to_np(var.value) + rng.normal(0.0, 0.3, var.shape).astype("float32"))
    h, z = rng.normal(size=(7, H)).astype("float32"), np.eye(K, dtype="float32")[rng.integers(0, K, (7, C))]
    value_symlog, logits = critic(h, z)
    mean = to_np(sheeprl.sheeprl_distribution(critic)(logits).mean)[..., 0]
    np.testing.assert_allclose(mean, symexp(to_np(value_symlog).astype("float64")), rtol=1e-5)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="critic: got a str"):
        sheeprl.sheeprl_distribution("critic")
    with pytest.raises(ValueError, match=r"dims: got 2, expected 1"):
        sheeprl.sheeprl_distribution(critic_with("symexp"))(np.zeros((2, 255), "float32"), dims=2)
