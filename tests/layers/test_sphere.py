"""Hyperspherical normalisation: the norm's floor, half precision, the projection and the initializer."""

import keras
import numpy as np

from multicritic.layers.sphere import UnitColumns, l2_normalize, project_columns
from tests.conftest import to_np


def test_l2_normalize_floors_the_norm_and_keeps_the_dtype():
    x = np.array([[3.0, 4.0], [0.0, 0.0], [1e-9, 0.0]], "float32")
    np.testing.assert_allclose(to_np(l2_normalize(x)), [[0.6, 0.8], [0.0, 0.0], [0.1, 0.0]], rtol=1e-6)
    half = l2_normalize(keras.ops.cast(np.array([[300.0, 400.0]]), "float16"))  # 300^2 overflows float16
    assert keras.backend.standardize_dtype(half.dtype) == "float16"
    np.testing.assert_allclose(to_np(half).astype("float32"), [[0.6, 0.8]], rtol=1e-3)


def test_columns_are_projected_and_drawn_on_the_sphere():
    kernel = keras.Variable(np.array([[[3.0, 0.0], [4.0, 2.0]], [[1.0, 1.0], [0.0, 1.0]]], "float32"))
    project_columns([kernel])
    np.testing.assert_allclose(to_np(kernel), [[[0.6, 0.0], [0.8, 1.0]], [[1.0, 2**-0.5], [0.0, 2**-0.5]]], rtol=1e-6)
    init = UnitColumns("glorot_uniform")
    np.testing.assert_allclose(np.linalg.norm(to_np(init((6, 3))), axis=0), 1.0, rtol=1e-6)
    again = keras.initializers.deserialize(keras.initializers.serialize(init))
    assert isinstance(again, UnitColumns) and again.get_config() == init.get_config()
