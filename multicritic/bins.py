"""Bucket supports, two-hot encoding and decoding, symlog / symexp.

Two bin schemes are supported:

- `"uniform_symlog"` (the default; Hafner et al. 2023 v1 and RLlib's TF
  DreamerV3): `num_buckets` points spaced uniformly in symlog space between
  `lower_bound` and `upper_bound`; targets are two-hot encoded in symlog space
  and the decoded value is `sum(probs * buckets)` in symlog space.
- `"symexp"` (the 2024 revision of the paper): the same uniform grid mapped
  through `symexp` and stored in real space; targets are interpolated in real
  space, so decoding a two-hot target gives back the target exactly, and the
  decode sums symmetric pairs of buckets so that a uniform distribution
  decodes to exactly 0.

Every function here is pure `keras.ops` and runs eagerly or inside
`tf.function`, `jax.jit` and `torch.compile` alike.
"""

from __future__ import annotations

import math
from typing import Tuple

import keras
import numpy as np
from keras import ops

from multicritic.validation import as_float32

BIN_SCHEMES = ("uniform_symlog", "symexp")


def _constant(table):
    """A cached table (a tuple of Python floats) as a float32 backend constant."""
    if _torch_compiling():
        # torch.compile cannot trace numpy; a list is slow but traceable.
        return ops.convert_to_tensor(list(table), dtype="float32")
    array = _ARRAYS.get(id(table))
    if array is None:
        array = _ARRAYS[id(table)] = np.asarray(table, np.float32)
    return ops.convert_to_tensor(array)


def _torch_compiling() -> bool:
    if keras.backend.backend() != "torch":
        return False
    import torch

    return torch.compiler.is_compiling()


def symlog(x):
    """`sign(x) * log(|x| + 1)`, elementwise (Hafner et al. 2023, eq. 9)."""
    x = ops.convert_to_tensor(x)
    return ops.sign(x) * ops.log1p(ops.abs(x))


def inverse_symlog(y):
    """`sign(y) * (exp(|y|) - 1)`, the inverse of `symlog`, elementwise."""
    y = ops.convert_to_tensor(y)
    return ops.sign(y) * ops.expm1(ops.abs(y))


symexp = inverse_symlog


def check_bin_args(num_buckets, lower_bound, upper_bound, bin_scheme="uniform_symlog"):
    """Raises a `ValueError` for bucket arguments no support can be built from."""
    if isinstance(num_buckets, bool) or int(num_buckets) != num_buckets or num_buckets < 2:
        raise ValueError(f"num_buckets: got {num_buckets!r}, expected an integer >= 2.")
    if not (math.isfinite(lower_bound) and math.isfinite(upper_bound)) or lower_bound >= upper_bound:
        raise ValueError(
            f"lower_bound/upper_bound: got ({lower_bound!r}, {upper_bound!r}), "
            "expected finite bounds with lower_bound < upper_bound."
        )
    if bin_scheme not in BIN_SCHEMES:
        raise ValueError(f"bin_scheme: got {bin_scheme!r}, expected one of {list(BIN_SCHEMES)}.")


def _tf_linspace_float32(lower, upper, num):
    # Replicates tf.linspace in float32 bit for bit: exact end points,
    # interior points `start + i * delta` rounded after each operation.
    lower, upper = np.float32(lower), np.float32(upper)
    delta = (upper - lower) / np.float32(num - 1)
    inner = lower + np.arange(1, num - 1, dtype=np.float32) * delta
    return np.concatenate([[lower], inner, [upper]]).astype(np.float32)


# Tables are cached as tuples of Python floats in a plain dict: a hit inside
# a compiled function is a constant. `torch.compile` cannot build one (it
# traces numpy into tensors), so tables other than the default are built
# eagerly by the layers' constructors, or by one eager call of `bucket_values`.
_TABLES = {}
_ARRAYS = {}  # numpy copies of the tables, by id (the tables live as long as the module)


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
        _TABLES[key] = tuple(np.asarray(out, np.float32).tolist())
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
    antisymmetric when the bounds are).
    """
    check_bin_args(num_buckets, lower_bound, upper_bound, bin_scheme)
    table = _bucket_table(int(num_buckets), float(lower_bound), float(upper_bound), bin_scheme)
    return np.asarray(table, np.float32)


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
        _TABLES[key] = (tuple(grid.tolist()), float(delta))
    return _TABLES[key]


def _uniform_indices(values, num_buckets, lower_bound, upper_bound):
    # Bucket pair and weights of the 2023 scheme, in the reference's
    # operation order (float32 throughout) so weights match bit for bit.
    grid, delta = _two_hot_grid(num_buckets, lower_bound, upper_bound)
    values = ops.clip(values, lower_bound, upper_bound)
    idx = (values - lower_bound) / delta
    k = ops.floor(idx)
    kp1 = ops.ceil(idx)
    kp1 = ops.where(ops.equal(k, kp1), kp1 + 1.0, kp1)
    # Past the top, kp1 gets weight 0; any valid index will do.
    kp1 = ops.where(ops.equal(kp1, float(num_buckets)), kp1 - 2.0, kp1)
    k, kp1 = ops.cast(k, "int32"), ops.cast(kp1, "int32")
    table = _constant(grid)
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
    table = _constant(buckets)
    values_real = ops.clip(values_real, buckets[0], buckets[-1])
    delta = (upper_bound - lower_bound) / (n - 1)
    guess = ops.floor((ops.clip(values_symlog, lower_bound, upper_bound) - lower_bound) / delta)
    k = ops.cast(ops.clip(guess, 0, n - 2), "int32")
    k = k - ops.cast(ops.take(table, k) > values_real, "int32")
    k = ops.clip(k, 0, n - 2)
    k = k + ops.cast(ops.take(table, k + 1) <= values_real, "int32")
    k = ops.clip(k, 0, n - 2)
    b_k = ops.take(table, k)
    b_kp1 = ops.take(table, k + 1)
    w_kp1 = ops.clip((values_real - b_k) / (b_kp1 - b_k), 0.0, 1.0)
    return k, k + 1, 1.0 - w_kp1, w_kp1


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

    `k`, `kp1` are int32 bucket indices and `w_k + w_kp1 == 1`. `values` are in
    symlog space, or in real space with `real_space=True` (which for the
    `"symexp"` scheme avoids a symexp(symlog(x)) round trip).
    """
    check_bin_args(num_buckets, lower_bound, upper_bound, bin_scheme)
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
            the bounds are clipped to them.
        num_buckets: number of buckets (>= 2).
        lower_bound: symlog-space lower bound.
        upper_bound: symlog-space upper bound.
        bin_scheme: `"uniform_symlog"` (interpolate in symlog space, the
            reference) or `"symexp"` (interpolate in real space).

    Returns:
        float32 tensor `[..., num_buckets]` with at most two adjacent non-zero
        entries that sum to 1; its expectation over the bucket support is the
        clipped value (in symlog space for `"uniform_symlog"`, in real space
        for `"symexp"`).

    Example:
        `two_hot(0.1)` puts 0.365 on bucket 127 and 0.635 on bucket 128.

    Note:
        Inside `torch.compile`, a support other than the default one must
        have been used eagerly once before (a layer or critic with it does).

    Reference:
        Hafner et al. 2023, "Mastering Diverse Domains through World Models",
        eq. 9-10; arXiv 2301.04104.
    """
    k, kp1, w_k, w_kp1 = two_hot_indices(values, num_buckets, lower_bound, upper_bound, bin_scheme)
    # One-hot masks rather than a scatter: identical values (only zeros are
    # added), and every backend fuses or vectorises it.
    return ops.one_hot(k, num_buckets) * w_k[..., None] + ops.one_hot(kp1, num_buckets) * w_kp1[..., None]


def expected_value(
    probs,
    num_buckets: int = 255,
    lower_bound: float = -20.0,
    upper_bound: float = 20.0,
    bin_scheme: str = "uniform_symlog",
):
    """Decodes bucket probabilities `[..., num_buckets]` to a symlog-space value `[...]`.

    `"uniform_symlog"`: `sum(probs * buckets)` (the reference). `"symexp"`:
    `symlog` of the real-space mean, summed in symmetric pairs around the
    centre bucket so that symmetric probabilities give exactly 0.
    """
    check_bin_args(num_buckets, lower_bound, upper_bound, bin_scheme)
    buckets = _constant(_bucket_table(int(num_buckets), float(lower_bound), float(upper_bound), bin_scheme))
    probs = ops.cast(probs, "float32")
    if bin_scheme == "uniform_symlog":
        return ops.sum(probs * buckets, axis=-1)
    weighted = probs * buckets
    m = num_buckets // 2
    low = ops.flip(weighted[..., :m], axis=-1)
    if num_buckets % 2:
        mean = ops.sum(low + weighted[..., m + 1 :], axis=-1) + weighted[..., m]
    else:
        mean = ops.sum(low + weighted[..., m:], axis=-1)
    return symlog(mean)

for _scheme in BIN_SCHEMES:  # the default tables, built outside any trace
    _bucket_table(255, -20.0, 20.0, _scheme)
_two_hot_grid(255, -20.0, 20.0)
