"""The DreamerV3 MLP block: Dense (no bias) -> LayerNorm -> SiLU, repeated."""

from __future__ import annotations

import math
from typing import Optional

import keras
import numpy as np
from keras import ops

from multicritic.backend import contract as backend
from multicritic.backend import guard_scope
from multicritic.layers.dispatch import call_layer
from multicritic.layers.initializers import MemberwiseInitializer
from multicritic.layers.layer_norm import LayerNormalization
from multicritic.layers.part_hooks import PartHooks
from multicritic.layers.row_scale import row_scale
from multicritic.model.sizes import get_model_dims
from multicritic.validation import FixedOptions, number


# The first Dense runs on its input times 2^-32, so its output cannot
# overflow for any finite input (float32 holds |x| < 2^128); a power of two
# scales float32 and bfloat16 products exactly, and the norm after it
# gives the same output with epsilon * 2^-64. The scale goes on the input or
# on the kernel (and bias): the same products. A quantized first Dense
# (whose input quantizer cannot take values that small) gets its input
# clipped to +-2^96 instead. Not float16: its range is too narrow for either
# (see `_fit_float16`).
NORMS = ("layer", "rms")
_FIRST_INPUT_SCALE = 2.0**-32
_INPUT_LIMIT = 2.0**96
_FLOAT16_MAX = 65504.0
_FLOAT16_ROW_LIMIT = 2.0**8


def _fit_float16(x):
    # Under float16 (largest value 65504) Keras's cast turns larger inputs
    # into inf, and a row of inputs above ~1e3 overflows the first Dense.
    # +-inf becomes +-65504, then rows whose largest |x| exceeds 2^8 are
    # scaled down to it: the LayerNorm after the Dense ignores a row's scale
    # but for epsilon.
    x = ops.clip(x, -_FLOAT16_MAX, _FLOAT16_MAX)  # (NaN stays NaN; exporters take a clip, not an isinf)
    return x * row_scale(x, _FLOAT16_ROW_LIMIT)


def _first_dense(dense, parts, scale, on_kernel):
    """The first Dense on the concatenation of `parts`, times `scale`: as the sum of each part times its rows
    of the kernel (no concatenation is made), the scale on the input or (`on_kernel`) on the kernel, and on
    the bias. Powers of two scale exactly, so either way the products are those of the scaled input."""
    kernel = dense.kernel  # a Python float scale keeps each tensor's (autocast) dtype
    if scale == 1.0:
        pass  # traced without guards (see `multicritic.backend.guard_scope`)
    elif on_kernel:
        kernel = kernel * scale
    else:
        parts = [p * scale for p in parts]
    if len(parts) > 1:
        # One split (its gradient is one concatenation), not a slice per part (a zero-filled kernel each).
        kernel = backend.current().split(kernel, [int(p.shape[-1]) for p in parts], axis=-2)
    else:
        kernel = [kernel]
    out = None
    for part, rows in zip(parts, kernel):
        term = ops.matmul(part, rows) if len(rows.shape) == 2 else _shared_input_matmul(part, rows)
        out = term if out is None else out + term
    if dense.bias is not None:
        out = out + (dense.bias if scale == 1.0 else dense.bias * scale)
    return out


def _shared_input_matmul(x, kernels):
    """`x [B, in]` times each of K stacked kernels `[K, in, units]`: `[B, K, units]`, as `einsum("bi,kio->bko")`.
    Computed as one GEMM against the kernels' `[in, K * units]` view. An einsum costs more: TensorFlow's and XLA's
    gradients transpose the `[B, K * units]` output gradient."""
    members, rows, units = kernels.shape
    wide = ops.reshape(ops.transpose(kernels, (1, 0, 2)), (rows, members * units))
    return ops.reshape(ops.matmul(x, wide), (-1, members, units))


def dense_layer(
    units,
    *,
    members=None,
    first=False,
    use_bias=False,
    kernel_initializer="glorot_uniform",
    bias_initializer="zeros",
    dtype=None,
    name=None,
):
    """A `keras.layers.Dense`, or for `members=K` an `EinsumDense` holding K stacked kernels `[K, in, units]`
    (one batched matmul). `first`: the input `[B, in]` is shared by all members and the output is `[B, K, units]`;
    else the input is member-major `[K, B, in]`, the output `[K, B, units]` (a bias `[K, 1, units]`)."""
    if members is None:
        return keras.layers.Dense(
            units,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            dtype=dtype,
            name=name,
        )
    return keras.layers.EinsumDense(
        "bi,kio->bko" if first else "kbi,kio->kbo",
        output_shape=(members, units) if first else (None, units),
        bias_axes="ko" if use_bias else None,
        kernel_initializer=MemberwiseInitializer(kernel_initializer),
        bias_initializer=bias_initializer,
        dtype=dtype,
        name=name,
    )


def trunk_dims(model_size, num_dense_layers, dense_hidden_units) -> dict:
    """A trunk's depth and width (`get_model_dims`), both given when `model_size` is None, else a `ValueError`."""
    dims = get_model_dims(model_size, num_dense_layers=num_dense_layers, dense_hidden_units=dense_hidden_units)
    if dims["num_dense_layers"] is None or dims["dense_hidden_units"] is None:
        raise ValueError(
            "num_dense_layers/dense_hidden_units: got "
            f"({num_dense_layers!r}, {dense_hidden_units!r}) with model_size=None, "
            "expected both as positive integers."
        )
    return dims


class Trunk(FixedOptions, PartHooks, keras.layers.Layer):
    """The base of the critic's trunks (the MLP and every registered trunk): the options the critic gives every
    trunk (`multicritic.trunks.SHARED`) and the ensemble's `members`, checked, kept as attributes of their names
    and saved by `get_config`.

    A trunk takes its own options as keyword arguments and passes the rest here, as a head does to `ValueHead`;
    one that takes a shared option only in part (a trunk that normalises its own way) checks that after.

    Args:
        model_size: a DreamerV3 model size (see `get_model_dims`) giving
            `num_dense_layers` and `dense_hidden_units` (the MLP's hidden
            layers; what another trunk counts is its own), or `None` to
            give both (see `trunk_dims`).
        num_dense_layers: overrides the size's depth.
        dense_hidden_units: overrides the size's width.
        kernel_initializer: initializer of the Dense kernels, per member
            (default glorot-uniform, as the reference).
        members: `None` (one trunk) or the ensemble size `K`.
        norm: `"layer"` (LayerNorm with scale and centre, the reference) or
            `"rms"` (RMSNorm with a scale, the official 2024 code).
        norm_epsilon: the norms' epsilon (1e-3 in the reference, 1e-4 in
            the official 2024 code).
        use_bias: give the hidden Dense layers a bias (the official 2024
            code does; the reference does not).
        **kwargs: passed to `keras.layers.Layer` (`name`, `dtype`, ...).
    """

    def __init__(
        self,
        *,
        model_size: Optional[str] = "XS",
        num_dense_layers: Optional[int] = None,
        dense_hidden_units: Optional[int] = None,
        kernel_initializer="glorot_uniform",
        members: Optional[int] = None,
        norm: str = "layer",
        norm_epsilon: float = 1e-3,
        use_bias: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(norm, str) or norm not in NORMS:
            raise ValueError(f"norm: got {norm!r}, expected one of {list(NORMS)}.")
        norm_epsilon = number("norm_epsilon", norm_epsilon, low=0.0, low_open=True)
        if not isinstance(use_bias, (bool, np.bool_)):
            raise ValueError(f"use_bias: got {use_bias!r}, expected True or False.")
        dims = trunk_dims(model_size, num_dense_layers, dense_hidden_units)
        if members is not None and (isinstance(members, bool) or int(members) != members or members < 1):
            raise ValueError(f"members: got {members!r}, expected a positive integer or None.")
        self.model_size = model_size
        self.num_dense_layers = dims["num_dense_layers"]
        self.dense_hidden_units = dims["dense_hidden_units"]
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.members = None if members is None else int(members)
        self.norm = norm
        self.norm_epsilon = float(norm_epsilon)
        self.use_bias = bool(use_bias)

    def compute_output_shape(self, input_shape):
        """`[..., dense_hidden_units]`, member-major `[K, ..., dense_hidden_units]` with members."""
        members = () if self.members is None else (self.members,)
        return members + tuple(input_shape)[:-1] + (self.dense_hidden_units,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "model_size": self.model_size,
                "num_dense_layers": self.num_dense_layers,
                "dense_hidden_units": self.dense_hidden_units,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "members": self.members,
                "norm": self.norm,
                "norm_epsilon": self.norm_epsilon,
                "use_bias": self.use_bias,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="multicritic")
class MLP(Trunk):
    """A stack of `Dense -> LayerNorm -> SiLU` blocks, optionally as an ensemble of stacked members.

    Each hidden block is a bias-free `Dense` (the LayerNorm's centre replaces
    the bias), a `LayerNormalization(epsilon=1e-3)` with scale and centre, then SiLU,
    in that order (Hafner et al. 2023, Fig. 5 and Appendix B). An optional
    linear output layer goes on top; the critic uses none. Every sub-layer's
    own `call` runs, so Keras's quantization (`quantize("int8")`), LoRA
    (`enable_lora`) and dtype policies apply to them.

    With `members=K` the same blocks hold K independently initialised members
    as stacked weights (`EinsumDense` kernels `[K, in, units]`, LayerNorm
    scales `[K, units]`): one batched matmul per layer, no loop over members.

    Finite inputs give finite outputs: the first Dense runs on its input
    times 2^-32 (its LayerNorm on epsilon times 2^-64: the same output), so
    it cannot overflow, nor can a LayerNorm's variance (see
    `LayerNormalization`); a quantized first Dense gets its input clipped to
    +-2^96 instead. (A runtime that checks each call's row statistics
    may trace the layers without these guards; see
    `multicritic.backend.guard_scope`.) The first Dense also takes its
    input in parts (a list, e.g. `[h, flat_z]`): in one MLP each part meets
    its own rows of the kernel and the concatenation is never made (on
    PyTorch and JAX, where that is the faster; TensorFlow concatenates); an
    ensemble concatenates them for one GEMM against all members' first
    kernels. With members, leading dims `[..., in]` are flattened to `[N, in]`
    for the stacked kernels (Keras's EinsumDense quantization needs explicit
    rank-2 equations) and restored behind the member axis.

    Args:
        output_layer_size: width of an optional linear output layer with
            bias; `None` for no output layer.
        **kwargs: the shared options, as `Trunk` (`model_size` giving the
            number and width of the hidden layers, `kernel_initializer`,
            `members`, `norm`, ...), and `keras.layers.Layer`'s (`name`,
            `dtype`, ...).

    Call arguments:
        inputs: float tensor `[..., input_dim]` (with members, shared by all
            of them), or a list of tensors whose concatenation along the last
            axis is that.

    Returns:
        `[..., dense_hidden_units]` (member-major `[K, ...,
        dense_hidden_units]` with members), or the output layer's width with
        one.

    Examples:
        >>> mlp = MLP(model_size="XS")
        >>> mlp(np.zeros((4, 1280), "float32")).shape
        (4, 256)
        >>> MLP(model_size="XS", members=5)(np.zeros((4, 1280), "float32")).shape
        (5, 4, 256)

    Reference:
        Hafner et al., "Mastering Diverse Domains through World Models",
        arXiv 2301.04104; RLlib's `dreamerv3/tf/models/components/mlp.py`.
    """

    def __init__(self, *, output_layer_size: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)
        if output_layer_size is not None and (int(output_layer_size) != output_layer_size or output_layer_size < 1):
            raise ValueError(f"output_layer_size: got {output_layer_size!r}, expected a positive integer or None.")
        self.output_layer_size = output_layer_size
        self._float16 = self.compute_dtype == "float16"

        # Tuples: Keras keeps a list as its TrackedList, which Flax NNX's graph (Keras's NNX mode) does not enter,
        # so `nnx.grad` would miss these layers' weights. Keras saves a tuple's layers as a list's.
        self.dense_layers = tuple(
            dense_layer(
                self.dense_hidden_units,
                members=self.members,
                first=i == 0,
                use_bias=self.use_bias,
                kernel_initializer=self.kernel_initializer,
                dtype=self.dtype_policy,
                name=f"dense_{i}",
            )
            for i in range(self.num_dense_layers)
        )
        self.layer_normalizations = tuple(
            LayerNormalization(
                epsilon=self.norm_epsilon,
                members=self.members,
                rms=self.norm == "rms",
                dtype=self.dtype_policy,
                name=f"layer_norm_{i}",
            )
            for i in range(self.num_dense_layers)
        )
        self.output_layer = None
        if output_layer_size:
            self.output_layer = dense_layer(
                output_layer_size,
                members=self.members,
                first=self.num_dense_layers == 0,
                use_bias=True,
                kernel_initializer=self.kernel_initializer,
                dtype=self.dtype_policy,
                name="output",
            )

    def build(self, input_shape):
        shape = tuple(input_shape)
        if self.members is not None and len(shape) > 2:  # leading dims are flattened for the members' GEMMs
            shape = (None, shape[-1])
        for dense, norm in zip(self.dense_layers, self.layer_normalizations):
            dense.build(shape)
            shape = dense.compute_output_shape(shape)
            if self.members is not None and len(shape) == 3 and shape[1] == self.members and shape[0] != self.members:
                shape = (shape[1], shape[0], shape[2])
            norm.build(shape)
        if self.output_layer is not None:
            self.output_layer.build(shape)

    @property
    def clips_inputs(self) -> bool:
        """Whether `call` clips its inputs to a finite range (float16, a quantized first Dense, no Dense), so
        that a non-finite input may give a finite output. Otherwise a non-finite input gives non-finite
        outputs (and a finite one finite outputs)."""
        return (
            self._float16
            or len(self.dense_layers) == 0  # (a len: PyTorch's Dynamo breaks its graph on a tuple's truth value)
            or getattr(self.dense_layers[0], "quantization_mode", None) is not None
        )

    def call(self, inputs):
        parts = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if self.members is not None and len(parts[0].shape) > 2:
            # Members take `[N, in]` (their stacked kernels' equations are rank 2): leading dims flattened, then
            # restored behind the member axis.
            lead = ops.shape(parts[0])[:-1]
            flat = self.call([ops.reshape(p, (-1, p.shape[-1])) for p in parts])
            return ops.reshape(flat, (self.members,) + tuple(lead) + (flat.shape[-1],))
        # A runtime that checks each call's row statistics instead may trace without the guards.
        clips = self.clips_inputs
        unguarded = not clips and guard_scope.left_out() is not None
        scale = 1.0 if clips or unguarded else _FIRST_INPUT_SCALE
        # The scale goes where it costs less: on the input `[rows, in]` or on the kernel `[in, units]` (forward
        # and backward), from the backend's number of rows on (`Backend.kernel_scale_from_units`). On the
        # kernel, each part of a single critic's input meets its own rows (no concatenation) where the backend
        # runs that faster (`Backend.concatenates_first_input`).
        # (A symbolic batch, as in an export's trace, counts as large.)
        lead = parts[0].shape[:-1]
        rows = math.prod(lead) if all(type(d) is int for d in lead) else None
        current = backend.current()
        split = len(parts) > 1
        enough = (
            self.dense_hidden_units * (self.members or 1)
            if split and current.kernel_scale_from_units
            else sum(int(p.shape[-1]) for p in parts)
        )
        on_kernel = unguarded or (scale != 1.0 and (rows is None or rows >= enough))
        if split and (not on_kernel or self.members is not None or current.concatenates_first_input):
            # An ensemble's first layer is one wide GEMM: split, it is two GEMMs forward and backward whose
            # kernel gradients XLA and Grappler transpose apart.
            parts = [ops.concatenate(parts, axis=-1)]
        if self._float16:
            x = _fit_float16(parts[0])
        elif clips:
            x = ops.clip(parts[0], -_INPUT_LIMIT, _INPUT_LIMIT)
        for i, (dense, norm) in enumerate(zip(self.dense_layers, self.layer_normalizations)):
            if i == 0 and not clips:
                x = _first_dense(dense, parts, scale, on_kernel)
            else:
                x = call_layer(dense, x)
            if i == 0 and self.members is not None:
                # Member-major from here on ([K, B, units]): batched matmuls
                # without transposes, and the heads' outputs come out [K, B, ...].
                x = ops.transpose(x, (1, 0, 2))
            x = ops.silu(call_layer(norm, x, input_scale=scale) if i == 0 and scale != 1.0 else call_layer(norm, x))
        if self.output_layer is not None:
            x = call_layer(self.output_layer, x)
        return x

    def compute_output_shape(self, input_shape):
        width = self.output_layer_size or self.dense_hidden_units
        if self.members is None:
            return tuple(input_shape)[:-1] + (width,)
        return (self.members,) + tuple(input_shape)[:-1] + (width,)

    def get_config(self):
        config = super().get_config()
        config["output_layer_size"] = self.output_layer_size
        return config
