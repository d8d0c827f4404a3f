"""The DreamerV3 MLP block: Dense (no bias) -> LayerNorm -> SiLU, repeated."""

from __future__ import annotations

from typing import Optional

import keras
from keras import ops

from multicritic.sizes import get_model_dims


def layer_norm(x, gamma, beta, epsilon):
    """Layer normalisation over the last axis: `(x - mean) / sqrt(var + eps) * gamma + beta`.

    The same math as `keras.ops.layer_normalization`, which on PyTorch maps to
    torch's fused kernel (kept there) but elsewhere computes the mean twice
    (`moments`), costing XLA two extra passes over the activations, about 10%
    of a large critic step; written out, XLA and Grappler fuse it to two.
    """
    if keras.backend.backend() == "torch":
        return ops.layer_normalization(x, gamma, beta, axis=-1, epsilon=epsilon)
    x = ops.cast(x, "float32") if keras.backend.standardize_dtype(x.dtype) in ("float16", "bfloat16") else x
    mean = ops.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    variance = ops.mean(ops.square(centered), axis=-1, keepdims=True)
    # Scaled per row first, then by gamma: grouping `rsqrt * gamma` instead
    # makes XLA's backward pass materialise that [B, units] outer product.
    return centered * ops.rsqrt(variance + epsilon) * gamma + beta


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
        x = inputs
        for dense, norm in zip(self.dense_layers, self.layer_normalizations):
            x = ops.matmul(x, dense.kernel)
            x = layer_norm(x, norm.gamma, norm.beta, norm.epsilon)
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
