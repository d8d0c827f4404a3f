"""Picks an installed Keras backend when none is chosen and Keras's default is missing.

Keras falls back to TensorFlow when neither KERAS_BACKEND nor keras.json
names a backend; on a JAX- or PyTorch-only install that import would fail.
Nothing changes when a backend is chosen or when Keras is already imported.

When this process is the `multicritic` command (the console script or
`python -m multicritic`, told by `cli_argv()`), `multicritic/__init__.py`
first hands the command line to `multicritic.cli.preflight`, which checks
every flag and the backend (`--backend`, KERAS_BACKEND, keras.json) before
Keras is imported, and exits with one line on stderr and code 2 on a bad
one. The package's `__init__` runs before anything imports Keras, so this is
the one place where that can happen first.

No Keras here (and nothing that imports it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from typing import List, Optional, Tuple

SUPPORTED = ("tensorflow", "torch", "jax")
# Keras 3's backends: the names `import keras` accepts (others end in its bare "Unable to import backend").
KERAS_BACKENDS = ("tensorflow", "torch", "jax", "numpy", "openvino")
PREFERENCE = ("jax", "torch", "tensorflow")  # when Keras's configured backend is missing


def installed(name: str) -> bool:
    """Whether `name` is an importable top-level module (without importing it)."""
    if not name or not name.isidentifier():
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def keras_config_path() -> str:
    """Where Keras reads keras.json (its own rule: KERAS_HOME, else ~/.keras, else /tmp/.keras)."""
    if "KERAS_HOME" in os.environ:
        home = os.environ["KERAS_HOME"]
    else:
        base = os.path.expanduser("~")
        home = os.path.join(base if os.access(base, os.W_OK) else "/tmp", ".keras")
    return os.path.expanduser(os.path.join(home, "keras.json"))


def _configured_backend() -> str:
    """The backend keras.json names; Keras's default "tensorflow" without one."""
    try:
        with open(keras_config_path()) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return "tensorflow"
    backend = config.get("backend", "tensorflow") if isinstance(config, dict) else "tensorflow"
    return backend if isinstance(backend, str) else "tensorflow"


def default_backend() -> Tuple[str, str]:
    """The backend `import keras` uses after `select()` when KERAS_BACKEND is
    unset, and where that choice comes from (for error messages)."""
    configured = _configured_backend()
    where = keras_config_path() if os.path.exists(keras_config_path()) else "Keras's default"
    if installed(configured):
        return configured, where
    for name in PREFERENCE:
        if installed(name):
            return name, f"the first installed of {', '.join(PREFERENCE)} ({where}: {configured!r} is not installed)"
    return configured, where


def _module_after_dash_m(orig_argv: List[str]) -> Optional[str]:
    """The module of `python [options] -m MODULE ...`, else None."""
    args = iter(orig_argv[1:])
    for arg in args:
        if arg == "-" or not arg.startswith("-"):
            return None  # a script or stdin
        if arg.startswith("--"):
            if arg == "--check-hash-based-pycs":
                next(args, None)
            continue
        flags = arg[1:]
        for i, flag in enumerate(flags):
            if flag == "m":
                return flags[i + 1 :] or next(args, None)
            if flag == "c":
                return None
            if flag in "WX":  # options with a value: -Wdefault, -W default
                if not flags[i + 1 :]:
                    next(args, None)
                break
    return None


def cli_argv() -> Optional[List[str]]:
    """The command-line arguments when this process is the `multicritic`
    command (`multicritic ...` or `python -m multicritic ...`), else None."""
    argv = sys.argv
    if not argv:
        return None
    if argv[0] == "-m":
        # `python -m X`: argv[0] is "-m" while X's packages are imported.
        if _module_after_dash_m(list(getattr(sys, "orig_argv", []))) == "multicritic":
            return list(argv[1:])
        return None
    script = re.sub(r"(-script\.pyw?|\.exe)$", "", os.path.basename(argv[0]))
    if script == "multicritic":
        return list(argv[1:])
    return None


# What to install for each backend (the package's extras).
EXTRAS = {"tensorflow": "tensorflow", "torch": "torch", "jax": "jax"}


def missing_backend_message(name: str) -> Optional[str]:
    """One line saying what to install when backend `name` (or Keras) cannot be imported, else None."""
    if not installed("keras"):
        return "multicritic needs Keras 3: pip install 'multicritic[jax]' (or [torch], [tensorflow])."
    if name in EXTRAS and not installed(name):
        return (
            f"KERAS_BACKEND={name!r}, but {name} is not installed: pip install 'multicritic[{EXTRAS[name]}]' "
            f"(or set KERAS_BACKEND to an installed one of {[b for b in SUPPORTED if installed(b)]})."
        )
    return None


# The frameworks' own short names, for the hint.
_SHORT_NAMES = {"tf": "tensorflow", "pt": "torch", "pytorch": "torch"}


def unknown_backend_message(name: str) -> str:
    """One line for a KERAS_BACKEND that no Keras backend has, with the supported name it is closest to."""
    import difflib

    close = [_SHORT_NAMES[name.lower()]] if name.lower() in _SHORT_NAMES else []
    close = close or difflib.get_close_matches(name.lower(), SUPPORTED, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"KERAS_BACKEND: got {name!r}, expected 'tensorflow', 'torch' or 'jax'{hint}."


def select() -> None:
    """Sets KERAS_BACKEND to an installed backend when none is configured (see the module's docstring), and
    refuses in one line a KERAS_BACKEND that is no Keras backend (a `ValueError`) or is not installed (a
    `ModuleNotFoundError`): Keras's own errors are a traceback of its imports."""
    if "keras" in sys.modules:
        return
    if os.environ.get("KERAS_BACKEND"):
        if os.environ["KERAS_BACKEND"] not in KERAS_BACKENDS:
            raise ValueError(unknown_backend_message(os.environ["KERAS_BACKEND"]))
        message = missing_backend_message(os.environ["KERAS_BACKEND"])
        if message:
            raise ModuleNotFoundError(message)
        return
    name, _ = default_backend()
    if name != _configured_backend():
        os.environ["KERAS_BACKEND"] = name
