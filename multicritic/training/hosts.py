"""Training on several hosts: one checkpoint writer, and every host checked to run the same training.

A data-parallel run over several hosts (JAX processes after
`jax.distributed.initialize`, `torch.distributed` ranks started by `torchrun`
or Ray Train, TensorFlow `MultiWorkerMirroredStrategy` workers) holds one copy
of the critic, EMA copy and optimizer slots per host; each engine's gradient
all-reduce keeps the copies equal. What the engines do not check is checked
here, with one small collective of the backend's (`Backend.gather_hosts`)
before any collective of the training:

- `agree`: every host gives the same value (a config, a seed), else every
  host raises a `ValueError` naming the hosts that differ. `CriticTrainer`
  checks its critic config, options, optimizer and state variables this way
  when it is built; a host that builds its critic under a distribution (JAX,
  TensorFlow) checks the critic's config with `agree` first.
- `save`: host 0 (the chief) alone writes the sealed checkpoint (atomically,
  `multicritic.files.integrity`); every host returns when it is written, or raises
  the chief's error.
- `restore`: every host reads and checks the file, the hosts compare their
  files' SHA-256, and only if every host read the same intact checkpoint does
  any host assign it. A checkpoint saved on another number of hosts restores
  (the state is the same on every host) with a warning saying so.

On one host every function here is the single-host behaviour, with no
collective.
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
import warnings
from typing import Dict, List, Mapping, Sequence, Tuple

import keras
import numpy as np

from multicritic.backend import contract as backend
from multicritic.training import checkpoint


class DifferentCheckpoints(ValueError):
    """The hosts read intact checkpoints that differ (`restore`): no older checkpoint makes them agree."""


# Bytes each host contributes to one exchange (JSON, zero-padded): digests and a truncated error message fit.
EXCHANGE_BYTES = 1024
_MESSAGE_CHARS = 900


def topology(variables: Sequence = ()) -> Tuple[int, int]:
    """`(index, count)`: this host's rank and the number of hosts (`(0, 1)` on one host; 0 is the chief).

    Args:
        variables: the trainer's or critic's variables (TensorFlow: the
            strategy they were created under), or none (the open scope's).
    """
    return backend.current().hosts(variables)


def is_chief(variables: Sequence = ()) -> bool:
    """Whether this host is host 0, the one that writes checkpoints and logs."""
    return topology(variables)[0] == 0


def gather(value, variables: Sequence = ()) -> List:
    """`value` (JSON-serialisable, at most `EXCHANGE_BYTES` as JSON) from every host, in host order.

    A collective: every host must call it, in the same order as the others.
    """
    if topology(variables)[1] == 1:
        return [value]
    data = json.dumps(value, sort_keys=True, default=str).encode()
    if len(data) > EXCHANGE_BYTES:
        raise ValueError(f"value: got {len(data)} bytes of JSON, expected at most {EXCHANGE_BYTES}.")
    buffer = np.zeros(EXCHANGE_BYTES, np.uint8)
    buffer[: len(data)] = np.frombuffer(data, np.uint8)
    table = backend.current().gather_hosts(buffer, variables)
    return [json.loads(bytes(row).rstrip(b"\0").decode()) for row in table]


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def agree(what: str, value, variables: Sequence = ()) -> None:
    """Raises a `ValueError` on every host unless every host passed an equal `value`.

    `value` is a JSON-serialisable object (a critic config, a seed) or a
    `{part: object}` dict, compared part by part so that the error names the
    part that differs. Only digests travel between hosts. Call it on every
    host, before the first collective that `value` would break (building a
    critic under a distribution, the first train step).

    Args:
        what: what is compared, for the error message.
        value: this host's value.
        variables: as `topology`.

    Examples:
        >>> config = {"model_size": "nano"}
        >>> hosts.agree("critic config", config)  # before building the critic on each host
        >>> critic = CriticNetwork(**config)
    """
    parts = value if isinstance(value, Mapping) else {what: value}
    mine = {str(name): _digest(part)[:16] for name, part in parts.items()}
    if topology(variables)[1] == 1:
        return
    everyone = gather(mine, variables)
    for host, theirs in enumerate(everyone):
        for name in sorted(set(mine) | set(theirs)):
            first, other = everyone[0].get(name), theirs.get(name)
            if first != other:
                raise ValueError(
                    f"{what}: got another {name} on host {host} (sha256 {other}) than on host 0 (sha256 {first}), "
                    "expected the same on every host (build the same critic and trainer, with the same seed, "
                    "on every host)."
                )


def same(what: str, value, expected: str, variables: Sequence = ()) -> None:
    """Raises a `ValueError` on every host, naming each host's value, unless every host passed an equal `value`.

    For small values worth quoting (a batch shape, a resume step): unlike `agree`, the values themselves travel
    (at most `EXCHANGE_BYTES` of JSON from each host). A collective, as `agree`.

    Args:
        what: the argument or quantity compared, for the error message.
        value: this host's value (JSON-serialisable).
        expected: what the hosts should have done, for the error message.
        variables: as `topology`.
    """
    if topology(variables)[1] == 1:
        return
    everyone = gather(value, variables)
    if any(json.dumps(v, sort_keys=True) != json.dumps(everyone[0], sort_keys=True) for v in everyone):
        got = ", ".join(f"{json.dumps(v)} on host {host}" for host, v in enumerate(everyone))
        raise ValueError(f"{what}: got {got}; expected the same on every host ({expected}).")


def agree_requested(critic, optimizer, options: Mapping[str, object]) -> None:
    """Before a trainer builds anything: every host asked for the same critic, options and optimizer, on the
    same backend (`CriticTrainer`'s first check; the second, `fingerprint`, compares what was built).

    Made before the default optimizer exists: an engine that initialises a new variable from the chief
    (TensorFlow's mirrored variables) would otherwise replace one host's learning rate by the chief's, and one
    that checks replicated values (JAX) fail with its own error.
    """
    if topology(critic.weights)[1] == 1:
        return
    config = {k: v for k, v in critic.get_config().items() if k not in checkpoint.IGNORED_CRITIC_KEYS}
    given = None if optimizer is None else _without_names(keras.optimizers.serialize(optimizer))
    options = dict(options)
    requested = {
        "default Adam": {k: options.pop(k) for k in ("learning_rate", "epsilon")} if given is None else None,
        "given": given,
    }
    agree(
        "CriticTrainer",
        {
            "backend": keras.backend.backend(),
            "critic config": config,
            "trainer options": options,
            "optimizer": requested,
        },
        critic.weights,
    )


def agree_batch(kind: str, shapes: Mapping[str, Sequence[int]], batch_axis: int, variables: Sequence = ()) -> None:
    """Every host passes a step batch of the same shapes (so the global batch splits evenly: the engines average
    the hosts' gradients with equal weights), else a `ValueError` on every host naming the shapes and the
    global batch. A collective: `CriticTrainer` makes it before a step kind's first step, and again where this
    host's shapes change."""
    index, count = topology(variables)
    if count == 1:
        return
    mine = {name: [int(d) for d in shape] for name, shape in shapes.items()}
    everyone = gather(mine, variables)
    if all(theirs == everyone[0] for theirs in everyone):
        return
    first = next(iter(mine))
    sizes = [theirs[first][batch_axis] if len(theirs[first]) > batch_axis else None for theirs in everyone]
    per_host = ", ".join(f"{theirs[first]} on host {host}" for host, theirs in enumerate(everyone))
    raise ValueError(
        f"{first}: got per-host batch shapes {per_host} for a {kind} step (a global batch of "
        f"{sum(s or 0 for s in sizes)} along axis {batch_axis}), expected the same shape on every host (a global "
        "batch that splits evenly: the engines weigh each host's mean equally); nothing was trained."
    )


_PREEMPTION = {"requested": False, "signal": None}


def watch_preemption(signals=(signal.SIGTERM,)) -> None:
    """Records a preemption request (a scheduler's SIGTERM) instead of dying: `preempted` then tells every
    host, so that they checkpoint at one step and exit cleanly. Call it on every host after the engine started
    (its own handler, e.g. JAX's or TensorFlow's coordination service's, is replaced); outside the main thread
    it does nothing (Python delivers signals to the main thread only)."""

    def handler(signum, frame):
        _PREEMPTION.update(requested=True, signal=signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        return  # Python takes signals in the main thread only (Ray Train's workers: Ray handles preemption)
    for sig in signals:
        signal.signal(sig, handler)


def preemption_signal():
    """The name of the preemption signal this host received (`"SIGTERM"`), or None."""
    return _PREEMPTION["signal"]


def preempted(variables: Sequence = ()) -> bool:
    """Whether any host has received a preemption signal since `watch_preemption`: True on every host at the
    same call, so that every host stops at the same step. A collective (a few bytes per host): call it on every
    host at the same point of each step."""
    flags = gather(_PREEMPTION["requested"], variables)
    return any(flags)


def _without_names(config):
    """A serialized config without its `name`s at every depth (Keras numbers the names of a process's
    optimizers, `adam`, `adam_1`, ...: they do not change the math)."""
    if isinstance(config, dict):
        return {k: _without_names(v) for k, v in config.items() if k != "name"}
    if isinstance(config, list):
        return [_without_names(v) for v in config]
    return config


def fingerprint(trainer) -> Dict[str, object]:
    """What every host of a data-parallel run must share: the parts `CriticTrainer` compares across hosts.

    The critic's config (without its name), the trainer's options (the
    "min_of_random" member draws' seeds included), the optimizer's config and
    the state variables' keys, shapes and dtypes. Weights are not compared:
    the engines broadcast or assign them.
    """
    critic = {k: v for k, v in trainer.critic.get_config().items() if k not in checkpoint.IGNORED_CRITIC_KEYS}
    optimizer = _without_names(keras.optimizers.serialize(trainer.optimizer))
    draws = trainer.draw_seeds
    state = [
        (key, list(var.shape), keras.backend.standardize_dtype(var.dtype))
        for key, var in checkpoint.keyed_variables(trainer).items()
    ]
    return {
        "critic config": critic,
        "trainer options": dict(trainer.options(), member_draw_seeds={str(k): v for k, v in draws.items()}),
        "optimizer": optimizer,
        "state variables": state,
    }


def _error(err: BaseException) -> Dict[str, str]:
    """An error as a status to exchange, cut to fit (a status too large to send would leave the other hosts
    waiting in the exchange)."""
    message = f"{type(err).__name__}: {err}"[:_MESSAGE_CHARS]
    while len(json.dumps({"error": message})) > EXCHANGE_BYTES - 64:
        message = message[: len(message) // 2]
    return {"error": message}


def save(trainer, path) -> str:
    """`trainer`'s state written to `path` by host 0 alone (sealed, atomic); returns the path written.

    Every host must call it (it waits until host 0 has written). If host 0
    cannot write, host 0 raises its error and every other host an `OSError`
    quoting it.
    """
    variables = trainer.state_variables
    index, count = topology(variables)
    if count == 1:
        return checkpoint.save(trainer, path)
    status, failure = {}, None
    if index == 0:
        try:
            status = {"path": checkpoint.save(trainer, path, hosts=count)}
        except Exception as err:  # re-raised below, once the other hosts know
            status, failure = _error(err), err
    chief = gather(status, variables)[0]
    if failure is not None:
        raise failure
    if "error" in chief:
        raise OSError(f"path: host 0 could not write the checkpoint {path!r} ({chief['error']}).")
    return chief["path"]


def restore(trainer, path) -> Dict[str, object]:
    """Restores a `save`d state on every host, all hosts or none.

    Each host reads and checks `path` (seal, configs, arrays: see
    `CriticTrainer.restore`); then the hosts compare the files' SHA-256. If a
    host cannot read it, or the hosts read different files, every host raises
    a `ValueError` and nothing changes anywhere. A checkpoint saved on another
    number of hosts restores, with a warning saying so.

    Returns:
        `{"step": the restored step count, "saved_on_hosts": hosts of the run
        that saved it (None if not recorded), "hosts": hosts now}`.
    """
    variables = trainer.state_variables
    count = topology(variables)[1]
    try:
        checked, failure = checkpoint.check(trainer, path), None
        status = {"sha256": checked.digest}
    except Exception as err:  # re-raised below, once the other hosts know
        checked, failure, status = None, err, _error(err)
    statuses = gather(status, variables)
    if failure is not None:
        raise failure
    for host, theirs in enumerate(statuses):
        if "error" in theirs:
            raise ValueError(f"path: host {host} cannot restore {path!r} ({theirs['error']}); no host restored it.")
    for host, theirs in enumerate(statuses):
        if theirs["sha256"] != statuses[0]["sha256"]:
            raise DifferentCheckpoints(
                f"path: got another checkpoint on host {host} (sha256 {theirs['sha256'][:16]}) than on host 0 "
                f"(sha256 {statuses[0]['sha256'][:16]}), expected the same file on every host; no host restored it."
            )
    checkpoint.assign(trainer, checked)
    if checked.hosts is not None and checked.hosts != count:
        warnings.warn(
            f"CriticTrainer.restore: {path!r} was saved by a run on {checked.hosts} host(s) and is restored on "
            f"{count}: the state is the same on every host; each host now takes 1/{count} of the global batch.",
            UserWarning,
            stacklevel=3,
        )
    step = int(np.asarray(keras.ops.convert_to_numpy(trainer.steps.value)).reshape(()))
    return {"step": step, "saved_on_hosts": checked.hosts, "hosts": count}
