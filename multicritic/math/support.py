"""Supports held in tensors: a uniform symlog grid whose bounds are read when the step runs, not when it is traced.

The fixed heads build their bucket tables from Python floats (`multicritic.math.bins`): a compiled step bakes
them in as constants. A support that adapts during training (`AdaptiveSupportHead`) keeps its bounds in a
variable instead, and everything here takes them as tensors: `low` and `high` in symlog space, scalars or one
pair per ensemble member (broadcast against the values' leading axis by the caller).

Positions are measured in bucket units, `x = (clip(v, low, high) - low) / (high - low) * (num_buckets - 1)` in
`[0, num_buckets - 1]`: the two-hot weights and the HL-Gauss histogram are functions of `x` alone, so they are the
same for every support (the HL-Gauss `sigma` is a ratio of the bucket width, as in `HLGaussHead`). The decode is
`centre + half_width * sum(p * s)` with `s_j = 2 j / (num_buckets - 1) - 1` summed over mirrored pairs, so a
symmetric distribution decodes to exactly the centre (0 for symmetric bounds), whatever order a compiler sums in.

`adapted_bounds` is the adaptation rule of `AdaptiveSupportHead` (see there for why it is this rule).

Every function is pure `keras.ops` and runs eagerly or inside `tf.function`, `jax.jit` and `torch.compile`.
"""

from __future__ import annotations

import math

import numpy as np
from keras import ops

from multicritic.math.bins import SYMLOG_LIMIT, constant

# The narrowest width a support is read with: the bounds of a corrupt state (equal, or swapped and equal) still
# give finite positions. (Far below what `AdaptiveSupportHead`'s `min_span` lets the rule produce.)
_TINY_WIDTH = 1e-30


# Tables by bucket count, in a plain dict: a hit inside a compiled function is a constant, and `torch.compile`
# can neither build one (it cannot trace numpy) nor trace an `lru_cache` silently. A head builds its table when it
# is constructed (`tables`), outside any trace.
_TABLES = {}


def tables(num_buckets: int):
    """`(half_weights, edges)` for `num_buckets`, cached tuples of Python floats: the decode's antisymmetric
    weights `s_j` on the lower half (0 from the middle on) and the HL-Gauss bin edges in bucket units
    `j - 0.5` for `j = 0 .. num_buckets`."""
    n = int(num_buckets)
    if n not in _TABLES:
        s = (2.0 * np.arange(n, dtype=np.float64) - (n - 1)) / (n - 1)
        s = ((s - s[::-1]) / 2.0).astype(np.float32)  # exactly antisymmetric after rounding
        s[n // 2 :] = 0.0
        edges = np.arange(n + 1, dtype=np.float64) - 0.5
        _TABLES[n] = (tuple(s.tolist()), tuple(edges.astype(np.float32).tolist()))
    return _TABLES[n]


def ordered(support):
    """`(low, high)` of a support `[..., 2]` (symlog-space bounds), ordered: any pair of numbers is a support."""
    first, second = support[..., 0], support[..., 1]
    return ops.minimum(first, second), ops.maximum(first, second)


def positions(values_symlog, low, high, num_buckets: int):
    """Each value's position on the grid in bucket units, `[0, num_buckets - 1]`, after clipping it to the
    support; NaN values stay NaN."""
    width = ops.maximum(high - low, _TINY_WIDTH)
    clipped = ops.minimum(ops.maximum(values_symlog, low), high)
    return ops.clip((clipped - low) / width * float(num_buckets - 1), 0.0, float(num_buckets - 1))


def two_hot_pairs(x, num_buckets: int):
    """The sparse two-hot encoding at positions `x` (bucket units): `(k, w_k, w_kp1)`, the lower bucket (int32,
    in `[0, num_buckets - 2]`) and the weights of buckets `k` and `k + 1`. A NaN position gets bucket 0 and NaN
    weights."""
    k = ops.clip(ops.floor(ops.nan_to_num(x, nan=0.0)), 0.0, float(num_buckets - 2))
    upper = x - k  # exact: x and k lie within one bucket of each other
    return ops.cast(k, "int32"), 1.0 - upper, upper


def hl_gauss_histogram(x, num_buckets: int, sigma: float):
    """The HL-Gauss target at positions `x` (bucket units): the mass of `N(x, sigma^2)` in each bucket
    `[j - 0.5, j + 0.5]`, the mass beyond the outer edges dropped before normalising (rows sum to 1):
    `[..., num_buckets]`. (`hl_gauss` of `multicritic.heads.hl_gauss` on a support of width 1 per bucket.)"""
    _, edges = tables(num_buckets)
    cdf = ops.erf((constant(edges) - x[..., None]) * (1.0 / (sigma * math.sqrt(2.0))))
    return (cdf[..., 1:] - cdf[..., :-1]) / (cdf[..., -1:] - cdf[..., :1])


def expected_value(probs, low, high):
    """The symlog-space mean of bucket probabilities `probs [..., num_buckets]` on the grid from `low` to `high`
    (each broadcast against `probs`'s leading dims): `[...]`."""
    half_weights, _ = tables(probs.shape[-1])
    centre, half_width = 0.5 * (low + high), 0.5 * (high - low)
    return centre + half_width * ops.sum((probs - ops.flip(probs, axis=-1)) * constant(half_weights), axis=-1)


def target_range(values_symlog, valid):
    """`(min, max)` of the symlog values where `valid` (bool, like `values_symlog`), as float32 scalars;
    `(+inf, -inf)` when none is valid."""
    lowest = ops.min(ops.where(valid, values_symlog, float("inf")))
    highest = ops.max(ops.where(valid, values_symlog, float("-inf")))
    return lowest, highest


def adapted_bounds(low, high, target_low, target_high, *, margin: float, shrink_rate: float, min_span: float):
    """One step of the adaptive support's rule: the new `(low, high)` from the current bounds and the range
    `[target_low, target_high]` of a batch's symlog targets.

    The wanted interval covers the targets with a margin: `span = max(target_high - target_low, min_span)`
    around their midpoint, widened by `margin * span` on each side (and kept within +-`SYMLOG_LIMIT`). A bound
    the wanted interval lies beyond moves there at once (targets outside the support are clipped: that
    projection error is what the rule removes); a bound inside it moves a fraction `shrink_rate` of the way
    (finer buckets, slowly, so that one narrow batch does not undo the range the others need). An empty batch
    (`target_low > target_high`) changes nothing.
    """
    span = ops.maximum(target_high - target_low, min_span)
    middle = 0.5 * (target_low + target_high)
    pad = margin * span
    want_low = ops.maximum(ops.minimum(target_low, middle - 0.5 * span) - pad, -SYMLOG_LIMIT)
    want_high = ops.minimum(ops.maximum(target_high, middle + 0.5 * span) + pad, SYMLOG_LIMIT)
    new_low = ops.where(want_low < low, want_low, low + shrink_rate * (want_low - low))
    new_high = ops.where(want_high > high, want_high, high + shrink_rate * (want_high - high))
    seen = target_low <= target_high
    return ops.where(seen, new_low, low), ops.where(seen, new_high, high)


tables(255)  # the default count's, built outside any trace
