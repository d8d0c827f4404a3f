import keras
import numpy as np
import pytest

from multicritic.layers.row_scale import row_scale
from tests.conftest import compiled, grads_of, to_np


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("jit", [False, True])
def test_rows_past_the_limit_are_brought_to_it_and_others_kept(dtype, jit):
    limit = 2.0**8
    x = np.array(
        [[1.0, -2.0, 3.0], [0.0, 0.0, 0.0], [256.0, -1.0, 5.0], [-1000.0, 3.0, 512.0], [0.5, 4096.0, -7.0]],
        dtype,
    )
    fn = compiled(lambda x: row_scale(x, limit)) if jit else (lambda x: row_scale(x, limit))
    factor = fn(keras.ops.convert_to_tensor(x))
    assert tuple(factor.shape) == (5, 1)
    assert keras.backend.standardize_dtype(factor.dtype) == dtype
    peak = np.abs(x.astype(np.float64)).max(-1, keepdims=True)
    expected = np.minimum(limit / np.where(peak > 0, peak, 1.0), 1.0)
    # float16: the factor (float32 inside) is rounded once to float16 (unit roundoff u = 2^-11), the scaled row
    # below once more: 2u. float32: a quotient's rounding, 2^-24, with room.
    rtol = 2 * 2.0**-11 if dtype == "float16" else 1e-7
    np.testing.assert_allclose(to_np(factor).astype(np.float64), expected, rtol=rtol)
    assert (to_np(factor)[:3] == 1.0).all()  # within the limit (a zero row included): exactly 1
    scaled = np.abs(x * to_np(factor)).max(-1)
    np.testing.assert_allclose(scaled[3:].astype(np.float64), limit, rtol=rtol)


def test_factor_carries_no_gradient():
    # With the factor stop-gradient'd, the gradient of sum(x * factor) is the factor itself.
    x = np.array([[1000.0, -3.0], [1.0, 2.0]], "float32")
    (grad,) = grads_of(lambda x: keras.ops.sum(x * row_scale(x, 256.0)), x)
    np.testing.assert_allclose(to_np(grad), [[0.256, 0.256], [1.0, 1.0]], rtol=1e-6)
