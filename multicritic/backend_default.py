"""Picks an installed Keras backend when none is chosen and Keras's default is missing.

Keras falls back to TensorFlow when neither KERAS_BACKEND nor keras.json
names a backend; on a JAX- or PyTorch-only install that import would fail.
Nothing changes when a backend is chosen or when Keras is already imported.
"""

import importlib.util
import json
import os
import sys


def _configured_backend() -> str:
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as f:
            return json.load(f).get("backend", "tensorflow")
    except (OSError, ValueError):
        return "tensorflow"


def select() -> None:
    if "keras" in sys.modules or os.environ.get("KERAS_BACKEND"):
        return
    if importlib.util.find_spec(_configured_backend()) is not None:
        return
    for name in ("jax", "torch", "tensorflow"):
        if importlib.util.find_spec(name) is not None:
            os.environ["KERAS_BACKEND"] = name
            return
