"""The DreamerV3 MLP block: Dense (no bias) -> LayerNorm -> SiLU, repeated."""

from __future__ import annotations

from typing import Optional

import keras
from keras import ops

from multicritic.sizes import get_model_dims


# Torch's fused LayerNorm: rows whose largest |x| exceeds this are scaled
# down to it first; below it no sum of squares of a row of up to 2^14 units
# (each centred value at most 2^57) overflows float32 (2^128).
_ROW_LIMIT = 2.0**56
# Written out: the variance of centred values times this is reduced too, for
# rows whose plain variance overflows (2^-128 times the variance).
_SMALL = 2.0**-64
# The first Dense runs on its kernel times 2^-32, so its output cannot
# overflow for any finite input (float32 holds |x| < 2^128); a power of two
# scales float32 and bfloat16 products exactly, and the LayerNorm after it
# gives the same output with epsilon * 2^-64. Not float16: its range is too
# narrow for the scaled kernel (see `_fit_float16`).
_FIRST_KERNEL_SCALE = 2.0**-32
_FLOAT16_MAX = 65504.0
_FLOAT16_ROW_LIMIT = 2.0**8


def _row_scale(x, limit):
    """Per row, `limit / max(limit, max |x|)`: exactly 1 for rows within `limit`.

    Two reductions rather than `abs` then one (a pass fewer over `x`); `relu`
    and operators rather than Keras ops on Python numbers, which on PyTorch
    become host-to-device copies (stream syncs)."""
    peak = ops.maximum(ops.amax(x, axis=-1, keepdims=True), -ops.amin(x, axis=-1, keepdims=True))
    peak = ops.cast(peak, "float32")
    return ops.cast(ops.stop_gradient(limit / (limit + ops.relu(peak - limit))), x.dtype)


def _fit_float16(x):
    # Under float16 (largest value 65504) Keras's cast turns larger inputs
    # into inf, and a row of inputs above ~1e3 overflows the first Dense.
    # +-inf becomes +-65504, then rows whose largest |x| exceeds 2^8 are
    # scaled down to it: the LayerNorm after the Dense ignores a row's scale
    # but for epsilon.
    x = ops.nan_to_num(x, nan=float("nan"), posinf=_FLOAT16_MAX, neginf=-_FLOAT16_MAX)
    return x * _row_scale(x, _FLOAT16_ROW_LIMIT)


def layer_norm(x, gamma, beta, epsilon):
    """Layer normalisation over the last axis: `(x - mean) / sqrt(var + eps) * gamma + beta`.

    The same math as `keras.ops.layer_normalization`, which on PyTorch maps to
    torch's fused kernel (kept there) but elsewhere computes the mean twice
    (`moments`), costing XLA two extra passes over the activations, about 10%
    of a large critic step; written out, XLA and Grappler fuse it to two.

    Finite for any row whose sum is (the MLP keeps its rows below 2^100):
    where the variance would overflow float32 (values past about 2^60) the
    row is normalised by its exact scale (epsilon, which such a variance
    dwarfs, aside). Other rows get the plain formula's bits.
    """
    if keras.backend.backend() == "torch":
        # LayerNorm ignores a row's scale but for epsilon: rows past 2^56 are
        # scaled down to it, others multiplied by exactly 1.
        x = x * _row_scale(x, _ROW_LIMIT)
        return ops.layer_normalization(x, gamma, beta, axis=-1, epsilon=epsilon)
    x = ops.cast(x, "float32") if keras.backend.standardize_dtype(x.dtype) in ("float16", "bfloat16") else x
    mean = ops.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    variance = ops.mean(ops.square(centered), axis=-1, keepdims=True)
    # For rows whose variance overflows, that of `centered * 2^-64`: a
    # sibling reduction, which XLA fuses into the same pass (a row maximum
    # computed first, to scale by, cost 4% of an XS train step). The inner
    # `where` keeps the unused branch's gradient free of 0 * inf.
    fits = ops.isfinite(variance)
    small = ops.mean(ops.square(centered * _SMALL), axis=-1, keepdims=True)
    inv_std = ops.where(fits, ops.rsqrt(variance + epsilon), ops.rsqrt(ops.where(fits, 1.0, small)) * _SMALL)
    # Scaled per row first, then by gamma: grouping `rsqrt * gamma` instead
    # makes XLA's backward pass materialise that [B, units] outer product.
    return centered * inv_std * gamma + beta


@keras.saving.register_keras_serializable(package="multicritic")
class MLP(keras.layers.Layer):
    """A stack of `Dense -> LayerNormalization -> SiLU` blocks.

    Each hidden block is a bias-free `Dense` (the LayerNorm's centre replaces
    the bias), a `LayerNormalization(epsilon=1e-3)` with scale and centre, then
    SiLU, in that order (Hafner et al. 2023, Fig. 5 and Appendix B). An
    optional linear output layer goes on top; the critic uses none. The
    Dense and LayerNormalization sub-layers hold the variables (and their
    names); `call` applies them with the same ops as their own `call`.

    Args:
        model_size: a DreamerV3 model size (see `get_model_dims`) giving the
            number and width of the hidden layers, or `None` to give both
            explicitly.
        num_dense_layers: overrides the size's number of hidden layers.
        dense_hidden_units: overrides the size's hidden width.
        output_layer_size: width of an optional linear output layer with
            bias; `None` for no output layer.
        kernel_initializer: initializer of the Dense kernels
            (default glorot-uniform, as the reference).
        **kwargs: passed to `keras.layers.Layer` (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[..., input_dim]`.

    Returns:
        `[..., dense_hidden_units]`, or `[..., output_layer_size]` with an
        output layer.

    Example:
        >>> mlp = MLP(model_size="XS")
        >>> mlp(np.zeros((4, 1280), "float32")).shape
        (4, 256)

    Reference:
        Hafner et al., "Mastering Diverse Domains through World Models",
        arXiv 2301.04104; RLlib's `dreamerv3/tf/models/components/mlp.py`.
    """

    def __init__(
        self,
        *,
        model_size: Optional[str] = "XS",
        num_dense_layers: Optional[int] = None,
        dense_hidden_units: Optional[int] = None,
        output_layer_size: Optional[int] = None,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        dims = get_model_dims(
            model_size,
            num_dense_layers=num_dense_layers,
            dense_hidden_units=dense_hidden_units,
        )
        if dims["num_dense_layers"] is None or dims["dense_hidden_units"] is None:
            raise ValueError(
                "num_dense_layers/dense_hidden_units: got "
                f"({num_dense_layers!r}, {dense_hidden_units!r}) with model_size=None, "
                "expected both as positive integers."
            )
        if output_layer_size is not None and (int(output_layer_size) != output_layer_size or output_layer_size < 1):
            raise ValueError(f"output_layer_size: got {output_layer_size!r}, expected a positive integer or None.")
        self.model_size = model_size
        self.num_dense_layers = dims["num_dense_layers"]
        self.dense_hidden_units = dims["dense_hidden_units"]
        self.output_layer_size = output_layer_size
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

        self.dense_layers = [
            keras.layers.Dense(
                self.dense_hidden_units,
                use_bias=False,
                kernel_initializer=self.kernel_initializer,
                dtype=self.dtype_policy,
                name=f"dense_{i}",
            )
            for i in range(self.num_dense_layers)
        ]
        self.layer_normalizations = [
            keras.layers.LayerNormalization(epsilon=1e-3, dtype=self.dtype_policy, name=f"layer_norm_{i}")
            for i in range(self.num_dense_layers)
        ]
        self.output_layer = None
        if output_layer_size:
            self.output_layer = keras.layers.Dense(
                output_layer_size,
                kernel_initializer=self.kernel_initializer,
                dtype=self.dtype_policy,
                name="output",
            )

    def build(self, input_shape):
        shape = tuple(input_shape)
        for dense, norm in zip(self.dense_layers, self.layer_normalizations):
            dense.build(shape)
            shape = shape[:-1] + (self.dense_hidden_units,)
            norm.build(shape)
        if self.output_layer is not None:
            self.output_layer.build(shape)

    def call(self, inputs):
        # The sub-layers' variables are applied directly (the same ops as
        # Dense.call and LayerNormalization.call): one Keras layer call
        # instead of two per block, which is most of a small step's Python
        # time on PyTorch. Variables are autocast by this layer's call.
        # Finite inputs give finite outputs: the first Dense cannot overflow
        # (see `_FIRST_KERNEL_SCALE`, `_fit_float16`), nor can a LayerNorm's
        # variance (see `layer_norm`).
        float16 = self.compute_dtype == "float16"
        x = _fit_float16(inputs) if float16 else inputs
        for i, (dense, norm) in enumerate(zip(self.dense_layers, self.layer_normalizations)):
            kernel, epsilon = dense.kernel, norm.epsilon
            if i == 0 and not float16:
                # `.value` (autocast) times a number: a tensor operator, no Keras op.
                kernel, epsilon = kernel.value * _FIRST_KERNEL_SCALE, epsilon * _FIRST_KERNEL_SCALE**2
            x = ops.matmul(x, kernel)
            x = layer_norm(x, norm.gamma, norm.beta, epsilon)
            x = ops.silu(ops.cast(x, self.compute_dtype))
        if self.output_layer is not None:
            x = ops.matmul(x, self.output_layer.kernel) + self.output_layer.bias
        return x

    def compute_output_shape(self, input_shape):
        width = self.output_layer_size or self.dense_hidden_units
        return tuple(input_shape)[:-1] + (width,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "model_size": self.model_size,
                "num_dense_layers": self.num_dense_layers,
                "dense_hidden_units": self.dense_hidden_units,
                "output_layer_size": self.output_layer_size,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
