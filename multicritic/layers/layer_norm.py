"""Layer normalisation that stays finite for any finite row, per ensemble member."""

from __future__ import annotations

from typing import Optional

import keras
from keras import ops

from multicritic.backend import contract as backend
from multicritic.backend import guard_scope
from multicritic.layers.row_scale import row_scale
from multicritic.validation import cast_to

# Rows whose variance overflows float32 are normalised through
# `centered * 2^-64`, whose variance cannot (2^-128 times the plain one).
_SMALL = 2.0**-64
# A fused kernel gets rows whose largest |x| is past this brought down to it first: their mean square
# (and Welford's sums, over up to 2^14 units) stays below float32's 2^128.
_FUSED_LIMIT = 2.0**56


def layer_norm(x, gamma, beta, epsilon, center=True):
    """Layer normalisation over the last axis: `(x - mean) / sqrt(var + eps) * gamma + beta`.

    `center=False`: RMS normalisation, `x / sqrt(mean(x^2) + eps) * gamma + beta`
    (Zhang & Sennrich 2019; the official DreamerV3 2024 networks).

    The same math as `keras.ops.layer_normalization`, written out: Keras's
    computes the mean twice (`moments`), costing XLA two extra passes over the
    activations, about 10% of a large critic step; written out, XLA and
    Grappler fuse it to two. Half-precision inputs are normalised in float32.

    Finite for any finite row: where the variance would overflow float32
    (values past about 2^60) the row is normalised by its exact scale
    (epsilon, which such a variance dwarfs, aside). Other rows get the plain
    formula's bits.
    """
    x = ops.cast(x, "float32") if keras.backend.standardize_dtype(x.dtype) in ("float16", "bfloat16") else x
    # A critic built with dtype="bfloat16" / "float16" stores gamma and beta in that dtype: TensorFlow's eager
    # ops do not promote (float32 + bfloat16 is an InvalidArgumentError), so they join x's dtype here.
    gamma, beta = _like(gamma, x), _like(beta, x)
    if backend.current().fused_norms:
        return _fused_norm(x, gamma, beta, epsilon, center)
    unguarded = guard_scope.left_out()
    if unguarded is not None:
        unguarded.unchecked += 1  # no row statistics to check: the runtime keeps the guards
    centered = x - ops.mean(x, axis=-1, keepdims=True) if center else x
    variance = ops.mean(ops.square(centered), axis=-1, keepdims=True)
    if backend.current().lazy_fallbacks:
        # Every op its own pass here: the fallback runs only for a batch with a row that needs it.
        inv_std = ops.cond(
            ops.all(ops.isfinite(variance)),
            lambda: ops.rsqrt(variance + epsilon),
            lambda: _inv_std(centered, variance, epsilon),
        )
    else:
        inv_std = _inv_std(centered, variance, epsilon)
    # Scaled per row first, then by gamma: grouping `rsqrt * gamma` instead
    # makes XLA's backward pass materialise that [B, units] outer product.
    return centered * inv_std * gamma + beta


def _like(v, x):
    """`v` (a Python number, a tensor or a variable) in `x`'s dtype."""
    if isinstance(v, (int, float)) or keras.backend.standardize_dtype(v.dtype) == keras.backend.standardize_dtype(
        x.dtype
    ):
        return v
    return ops.cast(v, x.dtype)


def _inv_std(centered, variance, epsilon):
    """`rsqrt(variance + epsilon)`, and for rows whose variance overflowed float32 that of `centered * 2^-64`
    (times 2^-64). The second variance is a sibling reduction beside the first. XLA's CPU reductions write
    their input out first, so it costs one more pass over the activations (about 3% of a K = 5 ensemble's
    step at batch 4096 under TensorFlow); a row maximum computed first, to scale by, cost as much or more.
    One select feeds one rsqrt (XLA keeps it one fusion, where a select of two rsqrts were three); the
    unselected variance's gradient is 0, never 0 * inf."""
    fits = ops.isfinite(variance)
    small = ops.mean(ops.square(centered * _SMALL), axis=-1, keepdims=True)
    return ops.rsqrt(ops.where(fits, variance + epsilon, small)) * ops.where(fits, 1.0, _SMALL)


def _fused_norm(x, gamma, beta, epsilon, center):
    """`layer_norm` through Keras's one-kernel ops; rows past `_FUSED_LIMIT` are scaled down to it first
    (exactly 1 for the others), which changes their output only through epsilon, which their variance dwarfs."""
    unguarded = guard_scope.left_out()
    if unguarded is None:
        x = x * row_scale(x, _FUSED_LIMIT)
    else:
        unguarded.normalizations += 1  # the runtime checks this normalisation's row statistics instead
    # Per-feature gamma and beta go into the kernel; an ensemble's per-member ones (and Python numbers) after it.
    scale, offset = _per_feature(gamma), (_per_feature(beta) if center else None)
    y = (
        ops.layer_normalization(x, scale, offset, epsilon=epsilon)
        if center
        else ops.rms_normalization(x, scale, epsilon=epsilon)
    )
    if scale is None and not (isinstance(gamma, (int, float)) and gamma == 1.0):
        y = y * gamma
    if offset is None and not (isinstance(beta, (int, float)) and beta == 0.0):
        y = y + beta
    return y


def _per_feature(v):
    """`v` when it is a `[units]` tensor, else None."""
    return None if isinstance(v, (int, float)) or len(v.shape) != 1 else v


@keras.saving.register_keras_serializable(package="multicritic")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` over the last axis, finite for any finite input, with ensemble members.

    Named as Keras's layer on purpose: Keras's weight files key sub-layers by
    their class name, so files written before this subclass existed load.

    The variables and their names (`gamma`, `beta`) are Keras's; `call`
    computes `layer_norm` (same math, fused better by XLA, and rows whose
    variance overflows float32 stay finite). `rms=True` is RMS
    normalisation (no centring, no `beta`; Keras's own `rms_scaling` is
    deprecated and divides by the variance). With `members=K` the input is
    member-major `[K, ..., units]` and each member has its own `gamma` and `beta`, shaped
    `[K, units]`.

    Args:
        epsilon: added to the variance (1e-3 in DreamerV3).
        members: `None` for one normalisation, or the ensemble size `K`.
        rms: RMS normalisation instead (`x / sqrt(mean(x^2) + eps) * gamma`).
        **kwargs: passed to `keras.layers.LayerNormalization` (`name`,
            `dtype`, initializers...); `axis` is always -1.

    Call arguments:
        inputs: `[..., units]`, or `[K, ..., units]` with members.

    Returns:
        The normalised inputs, same shape, in the layer's compute dtype.

    Examples:
        >>> norm = LayerNormalization(members=5)
        >>> norm(np.ones((5, 8, 16), "float32")).shape
        (5, 8, 16)

    Reference:
        Ba et al., "Layer Normalization", arXiv 1607.06450.
    """

    def __init__(self, *, epsilon: float = 1e-3, members: Optional[int] = None, rms: bool = False, **kwargs):
        kwargs.pop("axis", None)
        kwargs.pop("rms_scaling", None)
        if rms:
            kwargs["center"] = False
        super().__init__(axis=-1, epsilon=epsilon, **kwargs)
        self.rms = bool(rms)
        if members is not None and (isinstance(members, bool) or int(members) != members or members < 1):
            raise ValueError(f"members: got {members!r}, expected a positive integer or None.")
        self.members = None if members is None else int(members)

    def build(self, input_shape):
        shape = (int(input_shape[-1]),) if self.members is None else (self.members, int(input_shape[-1]))
        if self.members is not None and input_shape[0] is not None and int(input_shape[0]) != self.members:
            raise ValueError(f"inputs: got shape {list(input_shape)}, expected [{self.members}, ..., units].")
        self.axis = [len(input_shape) - 1]
        self.gamma = (
            self.add_weight(
                name="gamma",
                shape=shape,
                initializer=self.gamma_initializer,
                regularizer=self.gamma_regularizer,
                constraint=self.gamma_constraint,
                trainable=True,
                autocast=False,
            )
            if self.scale
            else None
        )
        self.beta = (
            self.add_weight(
                name="beta",
                shape=shape,
                initializer=self.beta_initializer,
                regularizer=self.beta_regularizer,
                constraint=self.beta_constraint,
                trainable=True,
                autocast=False,
            )
            if self.center
            else None
        )
        self.built = True

    def call(self, inputs, input_scale=1.0):
        """`input_scale`: the inputs arrive multiplied by this power of two; epsilon is applied as
        `epsilon * input_scale^2`, so the output is that of the unscaled inputs."""
        gamma = 1.0 if self.gamma is None else self.gamma
        beta = 0.0 if self.beta is None else self.beta
        if self.members is not None:  # [K, units] over member-major [K, ..., units]
            middle = (1,) * (len(inputs.shape) - 2)
            gamma = ops.reshape(gamma, (self.members,) + middle + (-1,)) if self.gamma is not None else gamma
            beta = ops.reshape(beta, (self.members,) + middle + (-1,)) if self.beta is not None else beta
        return cast_to(
            layer_norm(inputs, gamma, beta, self.epsilon * input_scale**2, center=not self.rms),
            self.compute_dtype,
        )

    def get_config(self):
        config = super().get_config()
        config.pop("axis", None)
        config.pop("rms_scaling", None)
        config["members"] = self.members
        config["rms"] = self.rms
        return config
