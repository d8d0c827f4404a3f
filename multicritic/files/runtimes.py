"""The runtimes that serve `critic.export`s: TensorFlow (SavedModel), onnxruntime (ONNX), the LiteRT interpreter,
PyTorch (a `torch.export` program).

The files' runtimes, not a Keras backend: each is imported when used
(`pip install ".[export]"`), whatever backend Keras runs, and none computes
the critic's math (the backend contract's test names this module as the one
outside `backend/` that imports a framework).
"""

from __future__ import annotations

import importlib
import os

import numpy as np

# The export formats, each served by its own runtime.
FORMATS = ("tf_saved_model", "onnx", "litert", "torch")
RUNTIMES = {"tf_saved_model": "tensorflow", "onnx": "onnxruntime", "litert": "ai_edge_litert", "torch": "torch"}
# The file name a format's export must have (Keras refuses a `torch.export` program's without it).
SUFFIXES = {"torch": ".pt2"}
# A SavedModel's outputs by name (its `serving_default` signature's keys), in the order `load_exported` returns.
OUTPUT_NAMES = ("value_real", "value_symlog", "logits")


def check_path(filepath, format, what="filepath", exists=False) -> str:
    """`filepath` as a str, checked for `format` (a directory for `tf_saved_model`, a file otherwise): the
    path must not be the other kind, and its folder must exist (`exists`: the path itself must)."""
    if not isinstance(filepath, (str, os.PathLike)) or not os.fspath(filepath):
        raise ValueError(f"{what}: got {filepath!r}, expected a path (a str or os.PathLike).")
    path = os.fspath(filepath)
    if isinstance(path, bytes):
        raise ValueError(f"{what}: got {filepath!r}, expected a path (a str or os.PathLike).")
    kind = "directory" if format == "tf_saved_model" else "file"
    other = os.path.isfile(path) if kind == "directory" else os.path.isdir(path)
    if other:
        raise ValueError(
            f"{what}: {path!r} is a {'file' if kind == 'directory' else 'directory'}, expected a {kind} "
            f"path for format {format!r}."
        )
    suffix = SUFFIXES.get(format)
    if suffix is not None and not path.endswith(suffix):
        raise ValueError(f"{what}: got {path!r}, expected a file name ending in {suffix!r} for format {format!r}.")
    if exists and not os.path.exists(path):
        raise ValueError(f"{what}: {path!r} does not exist, expected a {format!r} export ({kind}).")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{what}: {path!r} is in {folder!r}, which is not an existing directory.")
    return path


def load_exported(filepath, format):
    """A callable `fn(h, z) -> (value_real, value_symlog, logits)` (numpy; a features critic's export:
    `fn(x)`) running an export with its own
    runtime: TensorFlow for `tf_saved_model`, onnxruntime for `onnx`, the LiteRT interpreter for `litert`,
    `torch.export.load` for `torch` (each imported here, installed separately).

    A `ValueError` names `format` (not one of the three), `filepath` (missing, the wrong kind of path, or
    not an export its runtime can load) or the runtime that is not installed."""
    from multicritic.validation import real_values

    if not isinstance(format, str) or format not in FORMATS:
        raise ValueError(f"format: got {format!r}, expected one of {list(FORMATS)}.")
    path = check_path(filepath, format, exists=True)
    runtime = RUNTIMES[format]
    try:
        importlib.import_module(runtime)
    except ImportError as err:
        raise ValueError(f"format: {format!r} exports run with {runtime}, which cannot be imported ({err}).") from None
    try:
        run = _load(path, format)
    except Exception as err:  # the runtime's own error for a file it cannot read
        raise ValueError(
            f"filepath: {path!r} is not a {format!r} export this runtime can load ({_reason(err)})."
        ) from err

    def serve(*inputs):
        # An (h, z) critic's export takes `h, z`, a features critic's `x`.
        if len(inputs) not in (1, 2):
            raise ValueError(
                f"inputs: got {len(inputs)}, expected h, z (an (h, z) critic's export) or x (a features critic's)."
            )
        names = ("h", "z") if len(inputs) == 2 else ("x",)
        arrays = {name: np.asarray(real_values(name, x), np.float32) for name, x in zip(names, inputs)}
        if len(inputs) == 1 and arrays["x"].ndim != 2:
            raise ValueError(f"x: got shape {list(arrays['x'].shape)}, expected [B, input_size].")
        if len(inputs) == 2:
            h, z = arrays["h"], arrays["z"]
            if h.ndim != 2 or z.ndim != 3 or h.shape[0] != z.shape[0]:
                raise ValueError(
                    f"h, z: got shapes {list(h.shape)} and {list(z.shape)}, expected h [B, gru_units] and "
                    "z [B, num_z_categoricals, num_z_classes]."
                )
        try:
            return run(arrays)
        except Exception as err:  # the runtime's own error for inputs its signature does not take
            shapes = " and ".join(str(list(x.shape)) for x in arrays.values())
            raise ValueError(f"{', '.join(names)}: the export refused shapes {shapes} ({_reason(err)}).") from err

    return serve


def _reason(err) -> str:
    return f"{type(err).__name__}: " + " ".join(str(err).split())[:300]


def _load(path, format):
    if format == "tf_saved_model":
        import tensorflow as tf

        loaded = tf.saved_model.load(path)  # kept alive: it owns the variables `serve` reads

        def run(inputs):
            out = loaded.serve(*[tf.constant(x, tf.float32) for x in inputs.values()])
            # Named outputs (a dict); exports written before they were named return a tuple in the same order.
            out = [out[name] for name in OUTPUT_NAMES] if isinstance(out, dict) else out
            return tuple(np.asarray(o) for o in out)

        return run
    if format == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return lambda inputs: tuple(session.run(None, dict(zip(names, inputs.values()))))
    if format == "litert":
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=path)
        runner = interpreter.get_signature_runner()
        outputs = sorted(runner.get_output_details())  # output_0, output_1, output_2

        def run(inputs):
            out = runner(**inputs)
            return tuple(out[k] for k in outputs)

        return run
    if format == "torch":
        import torch

        module = torch.export.load(path).module()
        device = next(iter(module.parameters())).device  # where the critic was when it was exported

        def run(inputs):
            with torch.no_grad():
                out = module(*[torch.from_numpy(x).to(device) for x in inputs.values()])
            return tuple(o.cpu().numpy() for o in out)

        return run
    raise AssertionError(format)


def torch_dynamic_batch(inputs: int):
    """`torch.export`'s `dynamic_shapes` for `inputs` tensors sharing one dynamic batch axis (the first)."""
    import torch

    batch = torch.export.Dim("batch")
    return tuple({0: batch} for _ in range(inputs))
