import keras
import numpy as np
import pytest

from multicritic import MLP
from tests.conftest import to_np
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
