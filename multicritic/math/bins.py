"""Bucket supports, two-hot encoding and decoding, symlog / symexp.

Two bin schemes are supported:

- `"uniform_symlog"` (the default; Hafner et al. 2023 v1 and RLlib's TF
  DreamerV3): `num_buckets` points spaced uniformly in symlog space between
  `lower_bound` and `upper_bound`; targets are two-hot encoded in symlog space
  and the decoded value is `sum(probs * buckets)` in symlog space.
- `"symexp"` (the 2024 revision of the paper): the same uniform grid mapped
  through `symexp` and stored in real space; targets are interpolated in real
  space, so decoding a two-hot target gives back the target to float32
  rounding.

Numerics, the same on every backend, eager or compiled:

- With symmetric bounds (`lower_bound == -upper_bound`) the decode sums
  mirrored pairs over an exactly antisymmetric support, so a symmetric distribution (a uniform one
  included) decodes to exactly 0 under both schemes, whatever order a
  compiler sums in (see `expected_value`).
- `"symexp"` round trip (two-hot, then decode): relative error below 1e-6
  for every value down to the smallest normal float32, both signs, unless
  the value lies between two buckets of opposite signs (even `num_buckets`
  or asymmetric bounds): there float32 weights near 1/2 resolve it only to
  2^-24 times the bracket's real-space width `W0`, absolutely (near 0 the
  same in symlog units, elsewhere less). A support where this is coarser
  than the `"uniform_symlog"` scheme's bound on the same grid (2^-23 times
  the spacing `s = (upper - lower) / (num_buckets - 1)`), i.e. `W0 > 2 s`,
  is refused: too coarse to represent the values near 0 (over +-20: 2 to
  16 buckets, where 2 decodes values near 0 up to 2.8 symlog units off;
  18 and more, and every odd count, which has a bucket at 0, are kept).
- `"uniform_symlog"` two-hot weights are RLlib's, bit for bit (`w_kp1 = 1 -
  w_k`), so its round trip (in symlog space) has RLlib's accuracy: an
  absolute error below 2^-23 times the bucket spacing (1.9e-8 by default),
  so a relative one below 1e-6 only down to |value| of about 0.01 (by
  default; 1/16 of the spacing). Beyond |1.8| the decode's antisymmetrised
  support adds up to 5.1e-7 relative (`expected_value`): below 1e-6 in
  all.
- Values beyond the bounds, +-inf included, clip to the end buckets. NaN in
  host data (numpy, Python numbers) raises a `ValueError`; backend tensors
  are not checked (that would be a host sync, and is impossible inside a
  compiled function): a NaN gets the in-range bucket pair (0, 1) with
  both weights NaN, so its dense two-hot row is NaN there and 0 elsewhere.
- Supports are finite and strictly increasing in float32: `check_bin_args`
  refuses |bound| above `SYMLOG_LIMIT` (88.72, where symexp overflows
  float32) and bucket tables that float32 cannot keep increasing.

Every function here is pure `keras.ops` and runs eagerly or inside
`tf.function`, `jax.jit` and `torch.compile` alike.
"""

from __future__ import annotations

import math
from typing import Tuple

import numpy as np
from keras import ops

from multicritic.backend import contract as backend
from multicritic.validation import as_float32, cast_to, fmt, integer

BIN_SCHEMES = ("uniform_symlog", "symexp")

# symexp(x) overflows float32 beyond log1p(float32 max) = 88.7228...: a bound
# past it has no finite real-space end (the loss takes symexp of the bounds).
SYMLOG_LIMIT = math.log1p(float(np.finfo(np.float32).max))


def constant(table):
    """A cached table (a tuple of Python floats) as a float32 backend constant."""
    return backend.current().constant(table)


def symlog(x):
    """`sign(x) * log(|x| + 1)`, elementwise (Hafner et al. 2023, eq. 9)."""
    x = ops.convert_to_tensor(x)
    return ops.sign(x) * ops.log1p(ops.abs(x))


def inverse_symlog(y):
    """`sign(y) * (exp(|y|) - 1)`, the inverse of `symlog`, elementwise."""
    y = ops.convert_to_tensor(y)
    return ops.sign(y) * ops.expm1(ops.abs(y))


symexp = inverse_symlog
"""`sign(x) * (exp(|x|) - 1)`: `inverse_symlog` under the name the DreamerV3 code uses."""


def _beyond_symlog_limit(bound):
    # As float32 holds the bound: rounding can carry 88.722839 past the limit.
    return abs(bound) > SYMLOG_LIMIT + 1.0 or abs(float(np.float32(bound))) > SYMLOG_LIMIT


def check_bin_args(num_buckets, lower_bound, upper_bound, bin_scheme="uniform_symlog"):
    """Raises a `ValueError` for bucket arguments no support can be built from."""
    integer("num_buckets", num_buckets, low=2)
    for name, bound in (("lower_bound", lower_bound), ("upper_bound", upper_bound)):
        if isinstance(bound, (bool, str, bytes)) or not isinstance(bound, (int, float, np.integer, np.floating)):
            raise ValueError(f"{name}: got {bound!r}, expected a finite number.")
    if not (math.isfinite(lower_bound) and math.isfinite(upper_bound)) or lower_bound >= upper_bound:
        raise ValueError(
            f"lower_bound/upper_bound: got ({lower_bound!r}, {upper_bound!r}), "
            "expected finite bounds with lower_bound < upper_bound."
        )
    if _beyond_symlog_limit(lower_bound) or _beyond_symlog_limit(upper_bound):
        raise ValueError(
            f"lower_bound/upper_bound: got ({lower_bound!r}, {upper_bound!r}), expected |bound| <= "
            f"{SYMLOG_LIMIT:.4f} (in float32): symexp of a bound, the support's real-space end, overflows "
            "float32 beyond it."
        )
    if not isinstance(bin_scheme, str) or bin_scheme not in BIN_SCHEMES:
        raise ValueError(f"bin_scheme: got {bin_scheme!r}, expected one of {list(BIN_SCHEMES)}.")
    if bin_scheme == "symexp":  # its table (cached) refuses a support too coarse around 0
        _bucket_table(int(num_buckets), float(lower_bound), float(upper_bound), bin_scheme)


def _tf_linspace_float32(lower, upper, num):
    # Replicates tf.linspace in float32 bit for bit: exact end points,
    # interior points `start + i * delta` rounded after each operation.
    lower, upper = np.float32(lower), np.float32(upper)
    delta = (upper - lower) / np.float32(num - 1)
    inner = lower + np.arange(1, num - 1, dtype=np.float32) * delta
    return np.concatenate([[lower], inner, [upper]]).astype(np.float32)


# Tables are cached as tuples of Python floats in a plain dict: a hit inside
# a compiled function is a constant. `torch.compile` cannot build one (it
# cannot trace numpy), so tables other than the default are built
# eagerly by the layers' constructors, or by one eager call of `bucket_values`.
_TABLES = {}


def _increasing(table, num_buckets, lower_bound, upper_bound):
    # Equal neighbours would give two-hot weights of 0/0.
    if not np.all(np.diff(table) > 0):
        raise ValueError(
            f"num_buckets/lower_bound/upper_bound: got ({num_buckets!r}, {lower_bound!r}, {upper_bound!r}), "
            "expected a support float32 can hold strictly increasing (fewer buckets or wider bounds)."
        )
    return tuple(np.asarray(table, np.float32).tolist())


def _bucket_table(num_buckets, lower_bound, upper_bound, bin_scheme):
    key = (num_buckets, lower_bound, upper_bound, bin_scheme)
    if key not in _TABLES:
        if bin_scheme == "uniform_symlog":
            out = _tf_linspace_float32(lower_bound, upper_bound, num_buckets)
        else:
            grid = np.linspace(lower_bound, upper_bound, num_buckets, dtype=np.float64)
            out = np.sign(grid) * np.expm1(np.abs(grid))
            if lower_bound == -upper_bound:
                # Exactly antisymmetric (and 0 in the middle), as published.
                out = (out - out[::-1]) / 2.0
        table = _increasing(np.asarray(out, np.float32), num_buckets, lower_bound, upper_bound)
        if bin_scheme == "symexp":
            _check_resolution_at_zero(table, num_buckets, lower_bound, upper_bound)
        _TABLES[key] = table
    return _TABLES[key]


def _check_resolution_at_zero(table, num_buckets, lower_bound, upper_bound):
    """Refuses a symexp support whose bracket across 0 (two buckets of opposite signs) resolves values to
    less than the uniform_symlog scheme does on the same grid: `2^-24 W0 > 2^-23 s` (module docstring)."""
    table = np.asarray(table, np.float64)
    above = int(np.searchsorted(table, 0.0, side="right"))
    if 0 < above < len(table) and table[above - 1] < 0.0:
        width, spacing = table[above] - table[above - 1], (upper_bound - lower_bound) / (num_buckets - 1)
        if width > 2.0 * spacing:
            raise ValueError(
                f"num_buckets/lower_bound/upper_bound: got ({num_buckets!r}, {lower_bound!r}, {upper_bound!r}) with "
                f"bin_scheme='symexp', a support too coarse around 0: its buckets {table[above - 1]:.4g} and "
                f"{table[above]:.4g} resolve the values between them only to 2^-24 of their width {width:.4g}, "
                f"expected at most 2^-23 of the grid spacing {spacing:.4g} (the uniform_symlog scheme's bound); use "
                "more buckets, an odd num_buckets with symmetric bounds (a bucket at 0) or bin_scheme="
                "'uniform_symlog'."
            )


def _decode_table(num_buckets, lower_bound, upper_bound, bin_scheme):
    """For symmetric bounds, `expected_value`'s weights: the antisymmetrised support `(b_j - b_mirror) / 2`
    (rounded once to float32) on the lower half's buckets `j < num_buckets // 2`, 0 on the rest. `None` for
    asymmetric bounds."""
    key = (num_buckets, lower_bound, upper_bound, bin_scheme, "decode")
    if key not in _TABLES:
        _TABLES[key] = None
        if lower_bound == -upper_bound:
            table = np.asarray(_bucket_table(num_buckets, lower_bound, upper_bound, bin_scheme), np.float64)
            # A difference of two float32 values is exact in float64: one rounding, the same for -x as x.
            weights = ((table - table[::-1]) / 2.0).astype(np.float32)
            weights[num_buckets // 2 :] = 0.0
            _TABLES[key] = tuple(weights.tolist())
    return _TABLES[key]


def bucket_values(
    num_buckets: int = 255,
    lower_bound: float = -20.0,
    upper_bound: float = 20.0,
    bin_scheme: str = "uniform_symlog",
) -> np.ndarray:
    """The bucket support as a float32 numpy array `[num_buckets]`.

    Symlog space for `"uniform_symlog"` (`tf.linspace(lower, upper, n)`, bit
    for bit), real space for `"symexp"` (`symexp` of that grid, made exactly
    antisymmetric when the bounds are). Also builds the support's other
    tables, so that compiled functions (`torch.compile`) find them.
    """
    check_bin_args(num_buckets, lower_bound, upper_bound, bin_scheme)
    args = (int(num_buckets), float(lower_bound), float(upper_bound))
    _decode_table(*args, bin_scheme)
    if bin_scheme == "uniform_symlog":
        _two_hot_grid(*args)
    return np.asarray(_bucket_table(*args, bin_scheme), np.float32)


def bucket_range(num_buckets=255, lower_bound=-20.0, upper_bound=20.0, bin_scheme="uniform_symlog"):
    """`(first, last)` bucket as Python floats (symlog space or real space, as the scheme stores them)."""
    table = _bucket_table(int(num_buckets), float(lower_bound), float(upper_bound), bin_scheme)
    return table[0], table[-1]


def _two_hot_grid(num_buckets, lower_bound, upper_bound):
    # `lower + k * delta` exactly as the reference rounds it (float32 product,
    # then float32 sum). Read from a table, so a compiler's fused multiply-add
    # cannot change it: the weights' denominator is a small difference of
    # these numbers and would amplify one rounding 1e5-fold.
    key = (num_buckets, lower_bound, upper_bound, "grid")
    if key not in _TABLES:
        delta = np.float32((upper_bound - lower_bound) / (num_buckets - 1))
        grid = np.float32(lower_bound) + np.arange(num_buckets, dtype=np.float32) * delta
        _TABLES[key] = (_increasing(grid, num_buckets, lower_bound, upper_bound), float(delta))
    return _TABLES[key]


def _uniform_indices(values, num_buckets, lower_bound, upper_bound):
    # Bucket pair and weights of the 2023 scheme, in the reference's
    # operation order (float32 throughout) so weights match bit for bit.
    grid, delta = _two_hot_grid(num_buckets, lower_bound, upper_bound)
    values = ops.clip(values, lower_bound, upper_bound)
    idx = (values - lower_bound) / delta
    # NaN gets the bucket pair (0, 1) and NaN weights (below): casting NaN to
    # an integer is undefined, and an index out of range fails or wraps.
    idx = ops.nan_to_num(idx, nan=0.0)
    k = ops.floor(idx)
    # The reference's `ceil(idx)`, plus 1 where that equals `k`, is `k + 1` for every idx; past the top
    # (`k + 1 == num_buckets`) it takes the reference's `num_buckets - 2`, whose weight is 0.
    kp1 = k + 1.0
    kp1 = ops.where(ops.equal(kp1, float(num_buckets)), float(num_buckets - 2), kp1)
    k, kp1 = ops.cast(k, "int32"), ops.cast(kp1, "int32")
    table = constant(grid)
    values_k = ops.take(table, k)
    values_kp1 = ops.take(table, kp1)
    w_k = (values - values_kp1) / (values_k - values_kp1)
    return k, kp1, w_k, 1.0 - w_k


def _real_space_indices(values_real, values_symlog, buckets, lower_bound, upper_bound):
    """`buckets`: the real-space table (a tuple)."""
    # 2024 scheme: linear interpolation between the two real-space buckets
    # that enclose the value. The uniform symlog grid gives the bucket to
    # within one; comparing against the stored buckets fixes rounding.
    n = len(buckets)
    table = constant(buckets)
    # A value at or past a bound is its end bucket exactly: symexp(bound) in
    # float32 (GPU expm1) can miss the float64-built table by an ulp.
    values_real = ops.where(values_symlog <= lower_bound, table[0], values_real)
    values_real = ops.where(values_symlog >= upper_bound, table[-1], values_real)
    values_real = ops.clip(values_real, buckets[0], buckets[-1])
    delta = (upper_bound - lower_bound) / (n - 1)
    guess = ops.floor((ops.clip(values_symlog, lower_bound, upper_bound) - lower_bound) / delta)
    # NaN: the pair (0, 1) with NaN weights (the comparisons below are false).
    guess = ops.nan_to_num(guess, nan=0.0)
    k = ops.cast(ops.clip(guess, 0, n - 2), "int32")
    k = k - ops.cast(ops.take(table, k) > values_real, "int32")
    k = ops.clip(k, 0, n - 2)
    k = k + ops.cast(ops.take(table, k + 1) <= values_real, "int32")
    k = ops.clip(k, 0, n - 2)
    b_k = ops.take(table, k)
    b_kp1 = ops.take(table, k + 1)
    # b_k <= value <= b_kp1, so both weights lie in [0, 1]. Each is its own
    # distance over the width: as `1 - other` a weight below 2^-24 would
    # round to 0 (a value of -1e-9 decoded to 0).
    width = b_kp1 - b_k
    return k, k + 1, (b_kp1 - values_real) / width, (values_real - b_k) / width


def _check_no_nan(values):
    # Host data only: checking a backend tensor would cost a device-to-host
    # sync, and a compiled function cannot raise on a value.
    if isinstance(values, (np.ndarray, np.generic, float, list, tuple)):
        array = np.asarray(values)
        if array.dtype.kind in "fc" and np.isnan(array).any():
            raise ValueError(
                f"values: got {int(np.isnan(array).sum())} NaN value(s) in an array of shape {fmt(array.shape)}, "
                "expected numbers (values beyond the bounds, +-inf included, clip to the end buckets)."
            )


def two_hot_indices(
    values,
    num_buckets: int = 255,
    lower_bound: float = -20.0,
    upper_bound: float = 20.0,
    bin_scheme: str = "uniform_symlog",
    *,
    real_space: bool = False,
) -> Tuple:
    """The sparse form of `two_hot`: `(k, kp1, w_k, w_kp1)`, each shaped like `values`.

    `k`, `kp1` are int32 bucket indices, always in range, and
    `w_k + w_kp1 == 1` (to float32 rounding). `values` are in symlog space,
    or in real space with `real_space=True` (which for the `"symexp"` scheme
    avoids a symexp(symlog(x)) round trip). NaN: as `two_hot`.
    """
    check_bin_args(num_buckets, lower_bound, upper_bound, bin_scheme)
    _check_no_nan(values)
    values = as_float32(values)
    if bin_scheme == "uniform_symlog":
        if real_space:
            values = symlog(values)
        return _uniform_indices(values, num_buckets, lower_bound, upper_bound)
    buckets = _bucket_table(int(num_buckets), float(lower_bound), float(upper_bound), bin_scheme)
    if real_space:
        return _real_space_indices(values, symlog(values), buckets, lower_bound, upper_bound)
    clipped = ops.clip(values, lower_bound, upper_bound)
    return _real_space_indices(inverse_symlog(clipped), clipped, buckets, lower_bound, upper_bound)


def two_hot(
    values,
    num_buckets: int = 255,
    lower_bound: float = -20.0,
    upper_bound: float = 20.0,
    bin_scheme: str = "uniform_symlog",
):
    """Two-hot encodes symlog-space `values` over the buckets.

    Args:
        values: float tensor `[...]` of symlog-space values; values beyond
            the bounds, +-inf included, are clipped to them.
        num_buckets: number of buckets (>= 2).
        lower_bound: symlog-space lower bound.
        upper_bound: symlog-space upper bound.
        bin_scheme: `"uniform_symlog"` (interpolate in symlog space, the
            reference) or `"symexp"` (interpolate in real space).

    Returns:
        float32 tensor `[..., num_buckets]` with at most two adjacent non-zero
        entries that sum to 1; its expectation over the bucket support is the
        clipped value (in symlog space for `"uniform_symlog"`, in real space
        for `"symexp"`; see the module docstring for the accuracy).

    Raises:
        ValueError: for host data (numpy arrays, Python numbers) holding NaN.
            Backend tensors are not checked (a host sync, impossible inside
            a compiled function): a NaN gives NaN at buckets 0 and 1 and 0
            elsewhere, identically on every backend, eager or compiled.

    Examples:
        `two_hot(0.1)` puts 0.365 on bucket 127 and 0.635 on bucket 128.

    Note:
        Inside `torch.compile`, a support other than the default one must
        have been used eagerly once before (a layer or critic with it does).

    Reference:
        Hafner et al. 2023, "Mastering Diverse Domains through World Models",
        eq. 9-10; arXiv 2301.04104.
    """
    k, kp1, w_k, w_kp1 = two_hot_indices(values, num_buckets, lower_bound, upper_bound, bin_scheme)
    # Selects rather than a scatter (every backend fuses or vectorises them)
    # or one-hot products (0 * NaN would fill the row eagerly, but not where
    # XLA rewrites the products as selects).
    buckets = ops.arange(num_buckets, dtype="int32")
    w_k, w_kp1 = w_k[..., None], w_kp1[..., None]
    zero = ops.zeros_like(w_k)
    return ops.where(buckets == k[..., None], w_k, zero) + ops.where(buckets == kp1[..., None], w_kp1, zero)


def expected_value(
    probs,
    num_buckets: int = 255,
    lower_bound: float = -20.0,
    upper_bound: float = 20.0,
    bin_scheme: str = "uniform_symlog",
):
    """Decodes bucket probabilities `[..., num_buckets]` to a symlog-space value `[...]`.

    `"uniform_symlog"`: `sum(probs * buckets)` (the reference); `"symexp"`:
    `symlog` of the real-space mean `sum(probs * buckets)`. With symmetric
    bounds the sum runs over mirrored pairs, bucket `j` with `n - 1 - j`: it
    is `sum(p * a)` over the support made exactly antisymmetric, `a_j =
    (b_j - b_mirror) / 2`, computed as `sum((p - flip(p)) * a_lower)` with
    `a_lower` zero past the middle (each pair once, at its lower bucket). A
    symmetric distribution decodes to exactly 0 however a compiler orders the sum (every term is 0), and the gradient
    is `a_j` for `p_j`, everywhere (the decode is linear; the middle bucket
    of an odd count, 0, drops out). `a` is the support itself for
    `"symexp"`, built antisymmetric; the default `"uniform_symlog"` support
    (RLlib's `tf.linspace` points) is antisymmetric to float32 rounding, and
    `a` moves its buckets beyond |1.8| by at most 5.1e-7 of their value (8
    ulps at 20), so a two-hot target decodes to its value within 1e-6
    relative. Asymmetric bounds: the plain sum.
    """
    check_bin_args(num_buckets, lower_bound, upper_bound, bin_scheme)
    args = (int(num_buckets), float(lower_bound), float(upper_bound), bin_scheme)
    probs = cast_to(probs, "float32")
    weights = _decode_table(*args)
    if weights is None:
        mean = ops.sum(probs * constant(_bucket_table(*args)), axis=-1)
    else:
        # Four ops over whole rows, not slices of half rows: eager PyTorch pays a fixed cost per op, and
        # slices are strided (half rows cost its XS pass 8x more over the plain decode). Products and a sum,
        # not a matmul: GPUs may run float32 matmuls in TF32, at 1e-3 precision.
        mean = ops.sum((probs - ops.flip(probs, axis=-1)) * constant(weights), axis=-1)
    return mean if bin_scheme == "uniform_symlog" else symlog(mean)


for _scheme in BIN_SCHEMES:  # the default tables, built outside any trace
    bucket_values(255, -20.0, 20.0, _scheme)
