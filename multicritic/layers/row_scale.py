"""Per-row scale factors that bring a row's largest magnitude down to a limit."""

from __future__ import annotations

import keras
from keras import ops


def row_scale(x, limit):
    """Per row of `x` (`[..., units]`), `min(limit / max|x|, 1)` as a `[..., 1]` factor in `x`'s dtype,
    stop-gradient'd (the factor is a choice of units, not part of the function being differentiated).

    Exactly 1 for every row within `limit` (`limit / peak` is above 1 there, infinite for a zero row), and
    `limit / max|x|` past it; a power-of-two `limit` makes the scaled row's largest entry `limit` to
    float32 rounding. The peak is taken in float32, so half-precision rows get an exact factor.
    """
    # Cut from the gradient first, so that no backend records the factor's ops for a backward pass.
    peak = ops.amax(ops.abs(ops.stop_gradient(x)), axis=-1, keepdims=True)
    half = keras.backend.standardize_dtype(x.dtype) in ("float16", "bfloat16")
    factor = ops.minimum(limit / (ops.cast(peak, "float32") if half else peak), 1.0)
    return ops.cast(factor, x.dtype) if half else factor
