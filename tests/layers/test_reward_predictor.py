import numpy as np
import pytest

from multicritic import RewardPredictorLayer
from tests.conftest import to_np
from tests.numpy_reference import softmax, symexp_buckets, symlog, uniform_buckets


@pytest.mark.parametrize("scheme", ["uniform_symlog", "symexp"])
def test_new_head_predicts_zero(scheme):
    head = RewardPredictorLayer(bin_scheme=scheme)
    value, logits = head(np.random.default_rng(0).normal(size=(4, 32)).astype("float32"))
    assert to_np(logits).dtype == np.float32
    np.testing.assert_array_equal(to_np(logits), 0.0)
    # Symmetric sum: exactly 0 (the reference's left-to-right sum gives about -1e-7).
    np.testing.assert_array_equal(to_np(value), 0.0)


@pytest.mark.parametrize("scheme", ["uniform_symlog", "symexp"])
def test_value_is_expectation_over_buckets(scheme):
    head = RewardPredictorLayer(bin_scheme=scheme)
    x = np.random.default_rng(0).normal(size=(6, 8)).astype("float32")
    head.build(x.shape)
    rng = np.random.default_rng(1)
    kernel = rng.normal(size=(8, 255)).astype("float32")
    bias = rng.normal(size=(255,)).astype("float32")
    head.reward_buckets_layer.kernel.assign(kernel)
    head.reward_buckets_layer.bias.assign(bias)
    value, logits = head(x)
    want_logits = x.astype(np.float64) @ kernel + bias
    probs = softmax(want_logits)
    want = probs @ uniform_buckets() if scheme == "uniform_symlog" else symlog(probs @ symexp_buckets())
    np.testing.assert_allclose(to_np(logits), want_logits, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(to_np(value), want, rtol=1e-5, atol=1e-5)


def test_attributes_and_config():
    head = RewardPredictorLayer(num_buckets=41, lower_bound=-3.0, upper_bound=5.0, bin_scheme="symexp")
    assert head.reward_buckets_layer.units == 41
    clone = RewardPredictorLayer.from_config(head.get_config())
    assert (clone.num_buckets, clone.lower_bound, clone.upper_bound, clone.bin_scheme) == (41, -3.0, 5.0, "symexp")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_buckets": 1}, "num_buckets: got 1"),
        ({"lower_bound": 2.0, "upper_bound": 2.0}, "lower_bound/upper_bound"),
        ({"bin_scheme": "log"}, "bin_scheme: got 'log'"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardPredictorLayer(**kwargs)
