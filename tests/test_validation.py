"""The conversion helpers of `multicritic.validation`."""

import keras
import numpy as np
import pytest

from multicritic.validation import as_float32, cast_to


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_cast_to_returns_a_tensor_of_that_dtype_as_it_is(dtype):
    x = keras.ops.convert_to_tensor(np.arange(6).reshape(2, 3).astype(dtype))
    assert cast_to(x, dtype) is x
    other = "float32" if dtype == "float16" else "float16"  # (no float64 on JAX without x64)
    y = cast_to(x, other)
    assert keras.backend.standardize_dtype(y.dtype) == other
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(y), np.arange(6).reshape(2, 3))


def test_cast_to_converts_arrays_and_as_float32_keeps_float32_tensors():
    y = cast_to(np.array([1.5, -2.0], np.float32), "float32")
    assert keras.ops.is_tensor(y) and keras.backend.standardize_dtype(y.dtype) == "float32"
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(y), [1.5, -2.0])
    assert as_float32(y) is y
    z = as_float32(np.array([1, 2], np.int64))
    assert keras.backend.standardize_dtype(z.dtype) == "float32"
