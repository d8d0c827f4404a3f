"""Trainer checkpoints: critic (fast and EMA), optimizer slots and step counter in one sealed file.

The file is a numpy `.npz` archive (it loads on any backend) with a JSON
`meta` entry (format, critic config, trainer options, optimizer config, the
number of hosts of the run that saved it) and
one array per state variable, keyed by its path relative to the trainer
(`critic/mlp/dense_0/kernel`, `optimizer/iteration`, `trainer/steps`; a
loss-scale optimizer's inner optimizer under `optimizer/inner/`), so
neither the critic's `name` nor the order of variables matters. The file ends
with a SHA-256 seal (`multicritic.files.integrity`). Restoring checks the seal,
the metadata, the configs and every array before it assigns anything.

Format 1 files (arrays by position, no seal) still restore: their saved
variable paths give the keys.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import zipfile
from typing import Dict, List, Optional

import keras
import numpy as np

from multicritic.files import integrity
from multicritic.model.options import upgrade_config
from multicritic.training.options import TrainerOptions

FORMAT = "multicritic-trainer-checkpoint-2"
LEGACY_FORMATS = ("multicritic-trainer-checkpoint-1",)
# Keys of the critic config that are not part of what it computes.
IGNORED_CRITIC_KEYS = ("name", "dtype", "trainable", "kernel_initializer")  # (the last: how new weights start)
# Trainer options that change the math of a step (the rest say how it runs).
MATH_OPTIONS = (
    "gamma",
    "lambda_",
    "grad_clip",
    "ema_update_period",
    "ema_regularizer_weight",
    "ema_regularizer",
    "ema_targets",
    "ema_update_first",
    "value_loss_weight",
    "replay_loss_weight",
    "replay_discount",
)
# The values files written before an option existed meant.
_OPTION_DEFAULTS = TrainerOptions.defaults(
    (
        "ema_update_period",
        "ema_regularizer_weight",
        "ema_regularizer",
        "ema_targets",
        "ema_update_first",
        "value_loss_weight",
        "replay_loss_weight",
        "replay_discount",
    )
)


def _key(var, critic_name: str, optimizer_vars: set, steps, inner_vars: frozenset = frozenset()) -> str:
    path = var.path
    if var is steps:
        return "trainer/steps"
    if id(var) in optimizer_vars:
        # `adam/<critic>_mlp_dense_0_kernel_momentum` -> `optimizer/critic_mlp_dense_0_kernel_momentum`
        name = path.split("/", 1)[-1]
        if name.startswith(critic_name + "_"):
            name = "critic_" + name[len(critic_name) + 1 :]
        # A wrapped optimizer's own (a LossScaleOptimizer's inner Adam: its `iteration` and `learning_rate`
        # share the wrapper's names).
        return ("optimizer/inner/" if id(var) in inner_vars else "optimizer/") + name
    if path.startswith(critic_name + "/"):
        path = path[len(critic_name) + 1 :]
    return "critic/" + path


def _unnamed(config):
    """A serialized config without its `name`s, at every depth (a loss-scale optimizer's inner optimizer is
    named `adam_1` in a second trainer of the same process: names do not change the math)."""
    if isinstance(config, dict):
        return {k: _unnamed(v) for k, v in config.items() if k != "name"}
    if isinstance(config, list):
        return [_unnamed(v) for v in config]
    return config


def keyed_variables(trainer) -> Dict[str, object]:
    """`{key: variable}` for every state variable of `trainer`, keys independent of names given by the user."""
    critic_name = trainer.critic.name
    optimizer_vars = {id(v) for v in trainer.optimizer.variables}
    inner = getattr(trainer.optimizer, "inner_optimizer", None)
    inner_vars = frozenset(id(v) for v in inner.variables) if inner is not None else frozenset()
    out = {}
    for var in trainer.state_variables:
        key = _key(var, critic_name, optimizer_vars, trainer.steps, inner_vars)
        if key in out:
            raise ValueError(f"checkpoint: two state variables share the key {key!r}; cannot save this trainer.")
        out[key] = var
    return out


def _legacy_keys(trainer, meta) -> List[str]:
    """Keys for format-1 arrays (stored by position with their full variable paths)."""
    critic_name = meta["critic_config"].get("name", "critic")
    keys = []
    for path in meta["state_paths"]:
        if path == "critic_trainer_steps":
            keys.append("trainer/steps")
        elif path.startswith(critic_name + "/"):
            keys.append("critic/" + path[len(critic_name) + 1 :])
        else:
            name = path.split("/", 1)[-1]
            if name.startswith(critic_name + "_"):
                name = "critic_" + name[len(critic_name) + 1 :]
            keys.append("optimizer/" + name)
    return keys


def _to_numpy(var):
    return np.array(keras.ops.convert_to_numpy(var.value))


def _meta(trainer, hosts: int) -> dict:
    return {
        "format": FORMAT,
        "critic_config": trainer.critic.get_config(),
        "trainer_options": trainer.options(),
        "optimizer": keras.optimizers.serialize(trainer.optimizer),
        "hosts": hosts,
    }


def save(trainer, path, hosts: int = 1) -> str:
    """Writes `trainer`'s full state to `path` (`.npz` is appended if missing); returns the path. `hosts`:
    the number of hosts of the run, recorded in the metadata."""
    path = os.fspath(path)
    if not path.endswith(".npz"):
        path += ".npz"
    arrays = {key: _to_numpy(var) for key, var in keyed_variables(trainer).items()}
    meta = json.dumps(_meta(trainer, hosts), default=str)

    def write(tmp):
        with open(tmp, "wb") as f:
            np.savez(f, meta=np.array(meta), **arrays)

    return integrity.write_sealed(path, write, ".npz")


def _read(path):
    what = "path"
    data, sealed = integrity.read_file(path, what)
    digest = hashlib.sha256(data).hexdigest()
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            names = list(archive.files)
            if "meta" not in names:
                raise ValueError("it has no 'meta' entry")
            meta = json.loads(str(archive["meta"][()]))
            arrays = {name: archive[name] for name in names if name != "meta"}
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError, json.JSONDecodeError) as err:
        raise ValueError(
            f"path: {os.fspath(path)!r} is not a readable multicritic trainer checkpoint ({err})."
        ) from err
    if not isinstance(meta, dict):
        raise ValueError(f"path: {os.fspath(path)!r}: its metadata is a {type(meta).__name__}, expected a JSON object.")
    fmt = meta.get("format")
    if fmt != FORMAT and fmt not in LEGACY_FORMATS:
        raise ValueError(f"path: {os.fspath(path)!r} has format {fmt!r}, expected {FORMAT!r}.")
    if fmt == FORMAT and not sealed:
        raise ValueError(f"path: {os.fspath(path)!r} has no SHA-256 seal (truncated, or not written by multicritic).")
    for key, kind in (("critic_config", dict), ("trainer_options", dict), ("optimizer", dict)):
        if not isinstance(meta.get(key), kind):
            raise ValueError(
                f"path: {os.fspath(path)!r}: metadata {key!r} is {type(meta.get(key)).__name__}, "
                "expected a JSON object."
            )
    if fmt in LEGACY_FORMATS:
        paths = meta.get("state_paths")
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise ValueError(f"path: {os.fspath(path)!r}: metadata 'state_paths' is not a list of strings.")
        by_position = [f"state_{i:04d}" for i in range(len(paths))]
        if sorted(arrays) != sorted(by_position):
            raise ValueError(
                f"path: {os.fspath(path)!r}: holds arrays {sorted(arrays)[:4]}..., expected {len(paths)} state arrays."
            )
        return meta, fmt, arrays, by_position, digest
    return meta, fmt, arrays, None, digest


@dataclasses.dataclass(frozen=True)
class Checked:
    """A checkpoint read and checked against a trainer, not assigned yet.

    Attributes:
        values: `{key: numpy array}`, one per state variable of the trainer.
        digest: the SHA-256 (hex) of the file's content, its seal's.
        hosts: the number of hosts of the run that saved it (None: written
            before files recorded it).
    """

    values: Dict[str, np.ndarray]
    digest: str
    hosts: Optional[int]


def load(trainer, path) -> None:
    """Restores a state written by `save` into `trainer`; all or nothing."""
    assign(trainer, check(trainer, path))


def assign(trainer, checked: Checked) -> None:
    """Assigns a `check`ed state to `trainer`'s variables."""
    for key, var in keyed_variables(trainer).items():
        var.assign(checked.values[key])


def check(trainer, path) -> Checked:
    """Reads `path` and checks it against `trainer` (seal, metadata, configs, every array); changes nothing."""
    meta, fmt, arrays, by_position, digest = _read(path)
    where = f"path: {os.fspath(path)!r}"
    saved_config, moved_options = meta["critic_config"], {}
    if getattr(trainer.critic, "stream_names", None) is None:  # a CriticNetwork (not a MultiCritic)
        saved_config, moved_options = upgrade_config(saved_config)
    critic_diff = integrity.config_differences(saved_config, trainer.critic.get_config(), IGNORED_CRITIC_KEYS)
    if critic_diff:
        raise ValueError(f"{where} holds another critic configuration: {'; '.join(critic_diff)}.")
    saved_options = dict(_OPTION_DEFAULTS, **moved_options, **meta["trainer_options"])
    saved_options = {k: saved_options.get(k) for k in MATH_OPTIONS}
    options = {k: trainer.options().get(k) for k in MATH_OPTIONS}
    option_diff = integrity.config_differences(saved_options, options)
    if option_diff:
        raise ValueError(f"{where} was saved with other trainer options: {'; '.join(option_diff)}.")
    saved_opt, opt = meta["optimizer"], keras.optimizers.serialize(trainer.optimizer)
    if saved_opt.get("class_name") != opt.get("class_name"):
        raise ValueError(
            f"{where} holds a {saved_opt.get('class_name')} optimizer state, "
            f"this trainer has a {opt.get('class_name')}."
        )
    opt_diff = integrity.config_differences(
        _unnamed(saved_opt.get("config") or {}),
        _unnamed(json.loads(json.dumps(opt.get("config") or {}, default=str))),
    )
    if opt_diff:
        raise ValueError(f"{where} holds an optimizer configured otherwise: {'; '.join(opt_diff)}.")
    if by_position is not None:
        arrays = dict(zip(_legacy_keys(trainer, meta), (arrays[name] for name in by_position)))
    variables = keyed_variables(trainer)
    expected = {key: (tuple(var.shape), keras.backend.standardize_dtype(var.dtype)) for key, var in variables.items()}
    hosts = meta.get("hosts")
    return Checked(integrity.check_arrays(where, arrays, expected), digest, hosts if isinstance(hosts, int) else None)
