"""The runtimes that serve `critic.export`s: TensorFlow (SavedModel), onnxruntime (ONNX), the LiteRT interpreter.

Framework code, so it lives with the backend modules; each runtime is
imported when used (`pip install ".[export]"`), whatever backend Keras runs.
"""

from __future__ import annotations

import numpy as np


def load_exported(filepath, format):
    """A callable `fn(h, z) -> (value_real, value_symlog, logits)` (numpy) running an export with its own
    runtime: TensorFlow for `tf_saved_model`, onnxruntime for `onnx`, the LiteRT interpreter for `litert`
    (each imported here, installed separately)."""
    path = str(filepath)
    if format == "tf_saved_model":
        import tensorflow as tf

        loaded = tf.saved_model.load(path)  # kept alive: it owns the variables `serve` reads

        def run(h, z):
            return tuple(np.asarray(o) for o in loaded.serve(tf.constant(h, tf.float32), tf.constant(z, tf.float32)))

        return run
    if format == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return lambda h, z: tuple(session.run(None, dict(zip(names, (np.float32(h), np.float32(z))))))
    if format == "litert":
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=path)
        runner = interpreter.get_signature_runner()
        outputs = sorted(runner.get_output_details())  # output_0, output_1, output_2

        def run(h, z):
            out = runner(h=np.asarray(h, np.float32), z=np.asarray(z, np.float32))
            return tuple(out[k] for k in outputs)

        return run
    raise ValueError(f"format: got {format!r}, expected 'tf_saved_model', 'onnx' or 'litert'.")
