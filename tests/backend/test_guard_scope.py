"""The trace-time switch that leaves the MLP's overflow guards out: same values for rows in range, on every
backend, and a record of what the runtime must check instead."""

import numpy as np
import pytest
from keras import ops

from multicritic import MLP

from multicritic.backend import contract as backend
from multicritic.backend import guard_scope


def mlp_and_rows(**options):
    mlp = MLP(model_size=None, num_dense_layers=2, dense_hidden_units=16, **options)
    x = np.random.default_rng(0).normal(size=(6, 24)).astype("float32")
    mlp(x)
    rng = np.random.default_rng(1)
    for v in mlp.weights:
        v.assign(rng.normal(scale=0.3, size=tuple(v.shape)).astype("float32"))
    return mlp, x


@pytest.mark.parametrize("options", [{}, {"members": 3}, {"use_bias": True}])
def test_without_guards_rows_in_range_get_the_same_values(options):
    mlp, x = mlp_and_rows(**options)
    parts = [x[:, :10], x[:, 10:]]
    want, want_split = ops.convert_to_numpy(mlp(x)), ops.convert_to_numpy(mlp(parts))
    with guard_scope.without_guards() as record:
        got, split = ops.convert_to_numpy(mlp(x)), ops.convert_to_numpy(mlp(parts))
    # The guards' scales are powers of two: exact. (The first Dense by input parts sums two matmuls, which
    # rounds differently from one.)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(split, want_split, rtol=1e-6, atol=1e-7)
    fused = backend.current().fused_norms
    assert (record.normalizations, record.unchecked) == ((4, 0) if fused else (0, 4))  # two calls, two norms each
    assert guard_scope.left_out() is None


def test_without_guards_far_rows_are_no_longer_finite():
    # What the guards are for: the runtime that leaves them out must check each call.
    mlp, x = mlp_and_rows()
    x[0] = np.sign(x[0]) * 3e38  # finite; its first Dense overflows unless scaled
    assert np.isfinite(ops.convert_to_numpy(mlp(x))).all()
    with guard_scope.without_guards():
        assert not np.isfinite(ops.convert_to_numpy(mlp(x))[0]).all()


def test_scopes_nest_and_restore():
    with guard_scope.without_guards() as outer:
        with guard_scope.without_guards() as inner:
            assert guard_scope.left_out() is inner
        assert guard_scope.left_out() is outer
    assert guard_scope.left_out() is None
