"""Trainer checkpoints: critic (fast and EMA), optimizer slots and step counter in one file.

The file is a numpy `.npz` archive, so it loads on any backend: arrays are
stored in the fixed order of `CriticTrainer.state_variables` next to the
critic's config and the trainer's options as JSON.
"""

from __future__ import annotations

import json
import os
import zipfile

import keras
import numpy as np

FORMAT = "multicritic-trainer-checkpoint-1"
# Config keys that fix the shapes of the critic's variables.
SHAPE_KEYS = (
    "num_buckets",
    "gru_units",
    "num_z_categoricals",
    "num_z_classes",
    "dense_hidden_units",
    "num_dense_layers",
)


def _to_numpy(var):
    return np.array(keras.ops.convert_to_numpy(var.value))


def save(trainer, path) -> str:
    """Writes `trainer`'s full state to `path` (`.npz` is appended if missing)."""
    path = os.fspath(path)
    if not path.endswith(".npz"):
        path += ".npz"
    arrays = {f"state_{i:04d}": _to_numpy(v) for i, v in enumerate(trainer.state_variables)}
    meta = {
        "format": FORMAT,
        "critic_config": trainer.critic.get_config(),
        "trainer_options": trainer.options(),
        "optimizer": keras.optimizers.serialize(trainer.optimizer),
        "state_paths": [v.path for v in trainer.state_variables],
    }
    tmp = path + ".tmp.npz"
    np.savez(tmp, meta=np.array(json.dumps(meta)), **arrays)
    os.replace(tmp, path)  # never leave a half-written checkpoint behind
    return path


def load(trainer, path) -> None:
    """Restores a state written by `save` into `trainer`; all or nothing."""
    path = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            meta = json.loads(str(archive["meta"]))
            arrays = [archive[f"state_{i:04d}"] for i in range(len(meta["state_paths"]))]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, json.JSONDecodeError) as err:
        raise ValueError(f"path: {path!r} is not a readable multicritic trainer checkpoint ({err}).") from err
    if meta.get("format") != FORMAT:
        raise ValueError(f"path: {path!r} has format {meta.get('format')!r}, expected {FORMAT!r}.")
    want = trainer.critic.get_config()
    for key in SHAPE_KEYS:
        if meta["critic_config"].get(key) != want.get(key):
            raise ValueError(
                f"path: {path!r} holds a critic with {key}={meta['critic_config'].get(key)!r}, "
                f"expected {key}={want.get(key)!r} (this trainer's critic)."
            )
    variables = trainer.state_variables
    if len(arrays) != len(variables):
        raise ValueError(
            f"path: {path!r} holds {len(arrays)} state arrays, expected {len(variables)} "
            f"(is the optimizer the same kind? saved: {meta['optimizer'].get('class_name')})."
        )
    for var, array, saved_path in zip(variables, arrays, meta["state_paths"]):
        if tuple(array.shape) != tuple(var.shape):
            raise ValueError(
                f"path: {path!r}: {saved_path} has shape {list(array.shape)}, expected {list(var.shape)} ({var.path})."
            )
    for var, array in zip(variables, arrays):
        var.assign(array.astype(keras.backend.standardize_dtype(var.dtype)))
