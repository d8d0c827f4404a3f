"""Exporting a critic for serving: `(h, z) -> (value_real, value_symlog, logits)` (a features critic: `x -> ...`)
through Keras's `Model.export`."""

from __future__ import annotations

import warnings

import keras
import numpy as np
from keras import ops

from multicritic.backend import contract as backends
from multicritic.files.runtimes import FORMATS, OUTPUT_NAMES, check_path, load_exported, torch_dynamic_batch  # noqa: F401  (load_exported: the runtimes that serve an export)

# The (backend, format) pairs that export with a dynamic batch and reload with the format's own runtime (tested).
SUPPORTED = backends.EXPORT_FORMATS
# Keras's `Model.export` options per format (LiteRT's are the TFLite converter's attributes: Keras refuses others).
EXPORT_OPTIONS = {
    "tf_saved_model": ("is_static", "jax2tf_kwargs"),
    "onnx": ("opset_version",),
    "litert": None,
    "torch": ("strict", "dynamic_shapes"),
}


def serving_inverse_symlog(y):
    """`inverse_symlog` without `expm1`, which ONNX lacks: `expm1(x) = tanh(x / 2) * (exp(x) + 1)` holds
    exactly and keeps float32's relative precision near 0, where `exp(x) - 1` would cancel."""
    x = ops.abs(y)
    return ops.sign(y) * ops.tanh(0.5 * x) * (ops.exp(x) + 1.0)


class ServingCritic(keras.Model):
    """The critic's serving signature: `(h, z) -> (value_real, value_symlog, logits)` (a features critic's
    `x -> ...`), fast or EMA weights.

    `named=True`: the three as a dict keyed by `OUTPUT_NAMES`, which a SavedModel's signature takes as its
    output names (a tuple's are `output_0` to `output_2`)."""

    def __init__(self, critic, use_ema=False, named=False, **kwargs):
        # float32 in and out whatever the global policy: the critic casts to its own compute dtype.
        kwargs.setdefault("dtype", "float32")
        super().__init__(name=f"{critic.name}_serving", **kwargs)
        self.critic = critic
        self.use_ema = bool(use_ema)
        self.named = bool(named)
        self.built = critic.built  # nothing of its own to build

    def call(self, h, z=None):
        inputs = (h,) if z is None else (h, z)  # a features critic's `x`, or `h, z`
        value, logits = self.critic(*inputs, use_ema=self.use_ema)
        outputs = (serving_inverse_symlog(value), value, logits)
        return dict(zip(OUTPUT_NAMES, outputs)) if self.named else outputs


def input_signature(critic):
    """`h [None, gru_units]` and `z [None, cats, classes]` (a features critic: `x [None, input_size]`), float32."""
    return [
        keras.InputSpec(shape=(None,) + tuple(row), dtype="float32", name=name)
        for name, row in critic.input_row_shapes().items()
    ]


def float32_copy(critic):
    """`critic` itself when it computes in float32, else a float32 critic holding the same (float32) weights."""
    if critic.compute_dtype == "float32":
        return critic
    config = critic.get_config()
    config["dtype"] = "float32"
    copy = type(critic).from_config(config)
    copy.set_weights(critic.get_weights())
    return copy


def export(critic, filepath, format="tf_saved_model", verbose=None, use_ema=False, compute_dtype="float32", **kwargs):
    """See `CriticNetwork.export`."""
    current = backends.current()
    if not isinstance(format, str) or format not in FORMATS:
        raise ValueError(f"format: got {format!r}, expected one of {list(FORMATS)}.")
    if not isinstance(use_ema, (bool, np.bool_)):
        raise ValueError(f"use_ema: got {use_ema!r}, expected True or False.")
    if verbose is not None and not isinstance(verbose, (bool, np.bool_)):
        raise ValueError(f"verbose: got {verbose!r}, expected True, False or None.")
    allowed = EXPORT_OPTIONS[format]
    unknown = sorted(k for k in kwargs if k != "input_signature" and allowed is not None and k not in allowed)
    if unknown:
        raise ValueError(
            f"{unknown[0]}: not an option of export with format {format!r}; expected use_ema, "
            f"compute_dtype, verbose, input_signature or Keras's {list(allowed)}."
        )
    if format not in current.export_formats:
        pairs = ", ".join(f"{b}: {', '.join(f)}" for b, f in SUPPORTED.items())
        why = current.export_limits.get(format, "not supported")
        raise ValueError(
            f"format: got {format!r} on the {current.name!r} backend ({why}); supported (backend: formats): {pairs}."
        )
    if not critic.built:
        raise ValueError("export: the critic is not built yet; call it once on a batch (or give its input sizes).")
    if compute_dtype not in ("float32", None):
        raise ValueError(f"compute_dtype: got {compute_dtype!r}, expected 'float32' or None (the critic's policy).")
    filepath = check_path(filepath, format)
    serving = ServingCritic(
        float32_copy(critic) if compute_dtype == "float32" else critic,
        use_ema=use_ema,
        named=format == "tf_saved_model",
    )
    kwargs.setdefault("input_signature", input_signature(critic))
    if format == "torch":  # Keras's default fixes the batch at 1
        kwargs.setdefault("dynamic_shapes", torch_dynamic_batch(len(kwargs["input_signature"])))
    if verbose is None or verbose:
        return serving.export(filepath, format=format, verbose=None if verbose is None else True, **kwargs)
    # Quiet means quiet: the converters' tracing warnings too (PyTorch's TracerWarning on every shape read as an
    # int: the feature sizes are fixed by design, and the tests reload every export at several batch sizes).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return serving.export(filepath, format=format, verbose=False, **kwargs)
