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


def _contents(path):
    """`(h5 bytes, saved config or None, arrays by name)` of a `.weights.h5` or `.keras` file: its seal checked,
    and its config, where it has one, a JSON object."""
    where = f"filepath: {os.fspath(path)!r}"
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
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"{where}: its saved config is a {type(config).__name__}, expected a JSON object.")
    return h5_bytes, config, arrays


def load(critic, path, save_fn, load_fn) -> None:
    """Checks `path` in full against `critic`, then loads it with Keras's `load_weights` (`load_fn`)."""
    where = f"filepath: {os.fspath(path)!r}"
    h5_bytes, config, arrays = _contents(path)
    if config is not None:
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


def from_file(cls, filepath, overrides):
    """`CriticNetwork.from_weights_file`: `cls` built from the config `filepath` holds (with `overrides`), then
    `load_weights(filepath)` with every check that makes."""
    try:
        name = os.fspath(filepath)
    except TypeError:
        raise ValueError(f"filepath: got {filepath!r}, expected a path (a str or os.PathLike).") from None
    _, config, _ = _contents(filepath)
    if config is None:
        raise ValueError(
            f"filepath: {name!r} holds no critic configuration (a .weights.h5 written by plain Keras's "
            f"save_weights); build the critic with its options, then call load_weights({name!r})."
        )

    def not_a_critic(err):
        return ValueError(
            f"filepath: {name!r} holds a configuration that does not build a {cls.__name__} "
            f"({type(err).__name__}: {err})."
        )

    if name.endswith(".keras"):
        # A .keras archive names its model's class: another model's config would reach the critic's constructor.
        with zipfile.ZipFile(io.BytesIO(integrity.read_file(filepath, "filepath")[0])) as archive:
            saved_class = json.loads(archive.read("config.json")).get("class_name")
        if saved_class != cls.__name__:
            raise ValueError(
                f"filepath: {name!r} holds a {saved_class}, expected a {cls.__name__} (keras.models.load_model "
                "loads any model's .keras file)."
            )
    try:
        config = upgrade_config(config)[0]
    except Exception as err:  # a config this critic's upgrades cannot read
        raise not_a_critic(err) from err
    unknown = sorted(k for k in overrides if k not in config)
    if unknown:
        raise ValueError(
            f"{unknown[0]}: not an option of the critic {name!r} holds; expected some of {sorted(config)}."
        )
    try:
        critic = cls.from_config({**config, **overrides})
    except ValueError:  # the critic's own checks, which name the option
        raise
    except Exception as err:
        raise not_a_critic(err) from err
    if not critic.built:
        raise ValueError(f"filepath: {name!r} holds a configuration without the critic's input sizes.")
    critic.load_weights(filepath)
    return critic
