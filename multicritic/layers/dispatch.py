"""Calling a built sub-layer without Keras's per-call bookkeeping where that bookkeeping does nothing."""

from __future__ import annotations

import keras


def call_layer(layer, *args, **kwargs):
    """`layer(*args, **kwargs)`, or `layer.call(*args, **kwargs)` for a built layer whose `__call__` would only add its
    bookkeeping: variables in the compute dtype (no autocast), not quantized, a concrete (not symbolic) input.

    Keras's `Layer.__call__` costs tens of microseconds per call in eager PyTorch (argument binding, call
    context, name scope, module hooks): a dozen sub-layer calls per critic step were a fifth of an eager
    step at small batches (the trainer calls the critic itself so too). Mixed precision, quantized layers
    and functional tracing keep the full call.
    """
    if (
        layer.built
        and layer.compute_dtype == layer.variable_dtype
        and getattr(layer, "quantization_mode", None) is None
        and not any(isinstance(x, keras.KerasTensor) for x in args)
    ):
        return layer.call(*args, **kwargs)
    return layer(*args, **kwargs)
