"""The critic's `.weights.h5` files: sealed and self-describing when written, checked in full before loading.

`save` writes Keras's own `.weights.h5` layout plus the critic's config (a
root attribute) and a SHA-256 seal (`multicritic.files.integrity`), so Keras and
h5py read it as usual. `load` reads the file once, checks the seal, the
config (when the file carries one), the set of arrays, every shape, dtype
and value (finite), and only then lets Keras assign the weights. A `.keras`
archive is read the same way (its zip CRCs guard its bytes).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from typing import Dict

import h5py
import numpy as np
from keras import ops

from multicritic.files import integrity
from multicritic.model.options import upgrade_config

CONFIG_ATTR = "multicritic_config"
IGNORED_CONFIG_KEYS = ("name", "dtype", "trainable", "kernel_initializer")  # (the last: how new weights start)
OPTIMIZER_GROUP = "optimizer"


def _datasets(h5file) -> Dict[str, np.ndarray]:
    out = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            out[name] = obj[()]

    h5file.visititems(visit)
    return out


def save(critic, path, save_fn) -> str:
    """Keras's `save_weights` (as `save_fn`), plus the config attribute and the seal; atomic."""
    path = os.fspath(path)
    if not path.endswith(".weights.h5"):
        raise ValueError(f"filepath: got {path!r}, expected a name ending in '.weights.h5'.")
    config = json.dumps(critic.get_config(), default=str)

    def write(tmp):
        save_fn(tmp)
        with h5py.File(tmp, "a") as f:
            f.attrs[CONFIG_ATTR] = config

    return integrity.write_sealed(path, write, ".weights.h5")


def _read(path):
    """`(h5 bytes, saved config or None)` from a `.weights.h5` or `.keras` file, integrity checked."""
    data, sealed = integrity.read_file(path, "filepath")
    name = os.fspath(path)
    if name.endswith(".keras"):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                config = json.loads(archive.read("config.json")).get("config")
                return archive.read("model.weights.h5"), config, True
        except (zipfile.BadZipFile, KeyError, ValueError, EOFError, OSError) as err:
            raise ValueError(f"filepath: {name!r} is not a readable .keras archive ({err}).") from err
    return data, None, sealed


def load(critic, path, save_fn, load_fn) -> None:
    """Checks `path` in full against `critic`, then loads it with Keras's `load_weights` (`load_fn`)."""
    name = os.fspath(path)
    where = f"filepath: {name!r}"
    h5_bytes, config, sealed = _read(path)
    try:
        with h5py.File(io.BytesIO(h5_bytes), "r") as f:
            if CONFIG_ATTR in f.attrs:
                config = json.loads(f.attrs[CONFIG_ATTR])
                if not sealed:
                    raise ValueError(f"{where} was written by multicritic but has no seal (truncated or altered).")
            arrays = _datasets(f)
    except (OSError, ValueError, KeyError, TypeError) as err:
        if isinstance(err, ValueError) and str(err).startswith(where):
            raise
        raise ValueError(f"{where} is not a readable weights file ({err}).") from err
    if config is not None:
        if not isinstance(config, dict):
            raise ValueError(f"{where}: its saved config is a {type(config).__name__}, expected a JSON object.")

        diff = integrity.config_differences(
            upgrade_config(config)[0], json.loads(json.dumps(critic.get_config(), default=str)), IGNORED_CONFIG_KEYS
        )
        if diff:
            raise ValueError(f"{where} holds another critic configuration: {'; '.join(diff)}.")
    with tempfile.TemporaryDirectory() as folder:
        own = os.path.join(folder, "own.weights.h5")
        save_fn(own)
        with h5py.File(own, "r") as f:
            layout = {name: (tuple(a.shape), str(a.dtype)) for name, a in _datasets(f).items()}
        # A compiled critic's file also holds its optimizer's slots: they load
        # when both sides have them; otherwise the model loads alone (the
        # optimizer, if any, keeps its state), as Keras's `load_weights` does.
        file_has = any(k.startswith(OPTIMIZER_GROUP + "/") for k in arrays)
        own_has = any(k.startswith(OPTIMIZER_GROUP + "/") for k in layout)
        if file_has != own_has:
            arrays = {k: v for k, v in arrays.items() if not k.startswith(OPTIMIZER_GROUP + "/")}
            layout = {k: v for k, v in layout.items() if not k.startswith(OPTIMIZER_GROUP + "/")}
        integrity.check_arrays(where, arrays, layout)
        checked = os.path.join(folder, "checked.weights.h5")
        with open(checked, "wb") as f:
            f.write(h5_bytes)
        if file_has != own_has:
            with h5py.File(checked, "a") as f, h5py.File(own, "r") as mine:
                if OPTIMIZER_GROUP in f:
                    del f[OPTIMIZER_GROUP]
                if own_has:
                    mine.copy(mine[OPTIMIZER_GROUP], f, OPTIMIZER_GROUP)
        load_fn(checked)


def save_weights(critic, filepath, overwrite, save_fn) -> str:
    """`CriticNetwork.save_weights`: `save` to `filepath`, refused when it exists and `overwrite` is False."""
    path = os.fspath(filepath)
    if not overwrite and os.path.exists(path):
        raise ValueError(f"filepath: {path!r} exists and overwrite=False.")
    return save(critic, path, save_fn)


def load_weights(critic, filepath, skip_mismatch, save_fn, load_fn) -> None:
    """`CriticNetwork.load_weights`: `load`, all or nothing (the weights are put back after a failure inside
    Keras), every error a `ValueError` saying the weights are unchanged."""
    if not critic.built:
        raise ValueError("load_weights: the critic has no variables yet; call it once or give its input sizes first.")
    if skip_mismatch:
        raise ValueError("skip_mismatch: got True, expected False (a critic loads whole or not at all).")
    saved = [np.array(ops.convert_to_numpy(v.value)) for v in critic.weights]
    try:
        load(critic, filepath, save_fn, load_fn)
    except ValueError as err:  # raised by the checks, before any assignment
        raise ValueError(
            f"load_weights: could not load {str(filepath)!r} into this critic; its weights are unchanged. {err}"
        ) from err
    except Exception as err:  # a failure inside Keras after the checks: put everything back
        for var, value in zip(critic.weights, saved):
            var.assign(value)
        raise ValueError(
            f"load_weights: could not load {str(filepath)!r} into this critic; its weights are unchanged. Cause: {err}"
        ) from err
