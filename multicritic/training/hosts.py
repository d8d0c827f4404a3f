"""Training on several hosts: one checkpoint writer, and every host checked to run the same training.

A data-parallel run over several hosts (JAX processes after
`jax.distributed.initialize`, `torch.distributed` ranks started by `torchrun`
or Ray Train, TensorFlow `MultiWorkerMirroredStrategy` workers) holds one copy
of the critic, EMA copy and optimizer slots per host; each engine's gradient
all-reduce keeps the copies equal. What the engines do not check is checked
here, with one small collective of the backend's (`Backend.gather_hosts`)
before any collective of the training:

- `agree`: every host gives the same value (a config, a seed), else every
  host raises a `ValueError` naming the first option that differs and each
  host's value. `CriticTrainer` checks its critic config, dtype policy,
  options, optimizer and state variables this way when it is built; a host
  that builds its critic under a distribution (JAX, TensorFlow) checks the
  critic it asks for with `agree_critic` first: the configs the hosts' specs
  resolve to (`critic_config`, every default filled in), so that an option
  one host leaves at its default and another sets is named with both values.
- `save`: host 0 (the chief) alone writes the sealed checkpoint (atomically,
  `multicritic.files.integrity`); every host returns when it is written, or raises
  the chief's error.
- `restore`: every host reads and checks the file, the hosts compare their
  files' SHA-256, and only if every host read the same intact checkpoint does
  any host assign it. A checkpoint saved on another number of hosts restores
  (the state is the same on every host) with a warning saying so.

Every exchange carries a kind ("agree critic", "preempt", "checkpoint", ...):
hosts whose programs diverged (host 0 checkpoints where host 1 checks for a
preemption) raise `HostsOutOfStep` on every host at that exchange, instead of
reading each other's messages as their own.

On one host every function here is the single-host behaviour, with no
collective.
"""

from __future__ import annotations

import inspect
import json
import signal
import threading
import warnings
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import keras
import numpy as np

from multicritic.backend import contract as backend
from multicritic.training import checkpoint


class DifferentCheckpoints(ValueError):
    """The hosts read intact checkpoints that differ (`restore`): no older checkpoint makes them agree."""


class HostsOutOfStep(RuntimeError):
    """The hosts made different exchanges at once (one checkpoints, another checks for a preemption): their
    programs diverged, and no host can go on. Not a `ValueError`: no other input makes this exchange agree."""


# Bytes each host contributes to an exchange's first round (JSON, zero-padded): a message that fits (a flag,
# a status, a batch's shapes) takes one collective; a larger one (a whole config) a second round, of the
# largest host's size.
EXCHANGE_BYTES = 1024
# The most JSON one host may send in one exchange (every host sends as much in the second round).
EXCHANGE_LIMIT = 1 << 20
_MESSAGE_CHARS = 900
# How many more differing options an `agree` error lists after the first.
_MORE_OPTIONS = 4


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


def gather(value, variables: Sequence = (), kind: str = "gather") -> List:
    """`value` (JSON-serialisable, at most `EXCHANGE_LIMIT` bytes as JSON) from every host, in host order.

    A collective: every host must call it, in the same order as the others. `kind` names the exchange;
    if another host's kind differs, every host raises `HostsOutOfStep` naming both.
    """
    index, count = topology(variables)
    if count == 1:
        return [value]
    # (Keys in the order given: `agree` names the first option that differs in the config's own order.)
    data = json.dumps(value, default=str).encode()
    head = json.dumps({"kind": kind, "value": json.loads(data)}).encode()
    if len(head) > EXCHANGE_BYTES:
        head = json.dumps({"kind": kind, "bytes": len(data)}).encode()
    messages = [json.loads(row) for row in _exchange(head, EXCHANGE_BYTES, variables)]
    kinds = [m["kind"] for m in messages]
    if any(k != kind for k in kinds):
        other = next(h for h, k in enumerate(kinds) if k != kind)
        every = ", ".join(f"host {h} {k!r}" for h, k in enumerate(kinds))
        raise HostsOutOfStep(
            f"hosts out of step: host {index} expected a {kind!r} message and got a {kinds[other]!r} message from "
            f"host {other} ({every}); expected every host to make the same exchanges in the same order (the same "
            "program, options and checkpoint schedule on every host)."
        )
    if all("value" in m for m in messages):
        return [m["value"] for m in messages]
    # The second round: each host's whole value, padded to the largest (every host knows every size now).
    sizes = [m.get("bytes", 0) for m in messages]
    if max(sizes) > EXCHANGE_LIMIT:
        host = sizes.index(max(sizes))
        raise ValueError(
            f"value: got {max(sizes)} bytes of JSON to exchange on host {host}, expected at most "
            f"{EXCHANGE_LIMIT} ({kind!r})."
        )
    width = -(-max(sizes) // EXCHANGE_BYTES) * EXCHANGE_BYTES  # a few sizes: each may compile a collective
    return [json.loads(row) for row in _exchange(data, width, variables)]


def _exchange(data: bytes, width: int, variables) -> List[bytes]:
    buffer = np.zeros(width, np.uint8)
    buffer[: len(data)] = np.frombuffer(data, np.uint8)
    table = backend.current().gather_hosts(buffer, variables)
    return [bytes(row).rstrip(b"\0") for row in table]  # (JSON escapes NUL: the padding alone is stripped)


_MISSING = object()


def _keyed(node) -> bool:
    """A Keras-style `{"class_name": ..., "config": {...}}` spec: its options are named as the critic takes them
    (`head.sigma`, not `head.config.sigma`)."""
    return isinstance(node, dict) and "class_name" in node and isinstance(node.get("config"), dict)


def _differences(values: Sequence, path: Tuple = ()) -> List[Tuple]:
    """The paths (`(key, ...)`, in order) of the leaves at which the hosts' `values` differ."""
    if all(_keyed(v) for v in values) and all(
        {k: v[k] for k in v if k != "config"} == {k: values[0][k] for k in values[0] if k != "config"} for v in values
    ):
        return _differences([v["config"] for v in values], path)
    if all(isinstance(v, dict) and not _keyed(v) for v in values):
        keys = list(dict.fromkeys(k for v in values for k in v))
        return [d for k in keys for d in _differences([v.get(k, _MISSING) for v in values], path + (k,))]
    if all(isinstance(v, list) for v in values) and len({len(v) for v in values}) == 1:
        return [d for i in range(len(values[0])) for d in _differences([v[i] for v in values], path + (i,))]
    return [] if all(v == values[0] for v in values) else [path]


def _at(node, path: Tuple):
    for key in path:
        if _keyed(node):
            node = node["config"]
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return node


def _named(part: str, path: Tuple) -> str:
    """`critic option 'head.sigma'`: the part and the option's path in it."""
    text = "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in path).lstrip(".")
    return " ".join(filter(None, [part, repr(text) if text else ""])) or "the value"


def _shown(value, whole: bool = False) -> str:
    """A host's value at a differing option: a part spec by its name, unless `whole` (every host's spec has the
    same name: then the name tells the hosts apart by nothing)."""
    if value is _MISSING:
        return "no such option"
    text = repr(value["class_name"] if _keyed(value) and not whole else value)
    return text if len(text) <= 120 else text[:117] + "..."


def agree(what: str, value, variables: Sequence = ()) -> None:
    """Raises a `ValueError` on every host unless every host passed an equal `value`.

    `value` is a JSON-serialisable object (a critic config, a seed) or a
    `{part: object}` dict (`{"critic option": config, "seed": 0}`). The hosts
    exchange their values, so the error names the first option that differs
    and each host's value (`hosts disagree on critic option 'head.sigma': host
    0 has 0.75, host 1 has 1.0`), and the next few that differ. Call it on
    every host, before the first collective that `value` would break (the
    first train step). Values are compared as given: an option one host
    leaves out is `no such option` there, whatever its default; before
    building a critic, `agree_critic` compares what the specs resolve to.

    Args:
        what: what is compared, for the error message.
        value: this host's value.
        variables: as `topology`.

    Examples:
        >>> hosts.agree("run", {"run option": {"steps": 100, "seed": 0}})
    """
    parts = {str(name): part for name, part in value.items()} if isinstance(value, Mapping) else {"": value}
    if topology(variables)[1] == 1:
        return
    _refuse_differences(what, gather(parts, variables, kind=f"agree {what}"))


def _refuse_differences(what: str, everyone: List[Dict]) -> None:
    """`agree`'s error, raised unless every host's `{part: value}` (in host order) is the same."""
    found = [
        (part, path)
        for part in dict.fromkeys(name for theirs in everyone for name in theirs)
        for path in _differences([theirs.get(part, _MISSING) for theirs in everyone])
    ]
    if not found:
        return
    part, path = found[0]
    at = [_at(theirs.get(part, _MISSING), path) for theirs in everyone]
    names = {v["class_name"] if _keyed(v) else None for v in at}
    values = ", ".join(f"host {h} has {_shown(v, whole=len(names) == 1)}" for h, v in enumerate(at))
    more = ", ".join(_named(p, q) for p, q in found[1 : 1 + _MORE_OPTIONS])
    more = f"; they also differ on {more}{' and more' if len(found) > 1 + _MORE_OPTIONS else ''}" if more else ""
    raise ValueError(
        f"{what}: hosts disagree on {_named(part, path)}: {values}{more}; expected the same on every host "
        "(build the same critic and trainer, with the same seed and options, on every host)."
    )


def critic_config(spec: Mapping) -> Dict[str, object]:
    """The config of the critic `spec` asks for, every default filled in, without building it.

    What `CriticNetwork(**spec)` (or `MultiCritic(**spec)`, for a spec with
    `critics`) would return from `get_config()`: sizes resolved from
    `model_size`, the head and trunk as their canonical specs (a head given
    by name holds its default options), the dtype policy the critic would
    take (the global one unless `dtype` is given), the normalisers' options.
    No variable is created: building a critic under a JAX or TensorFlow
    distribution is itself a collective, which hosts that disagree must not
    enter.

    Raises:
        ValueError: for an option the critic would refuse, named as it names
            it (not every check of the critic's own is made here).
    """
    return _resolved(spec, serialized=True)


def _resolved(spec: Mapping, serialized: bool) -> Dict[str, object]:
    """`critic_config`; without `serialized`, the dtype policies as their names and no kernel initializer (Keras's
    serialization imports TensorFlow where it is installed: seconds, before a refusal that takes milliseconds)."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"spec: got a {type(spec).__name__}, expected a dict of CriticNetwork or MultiCritic options.")
    if "critics" in spec:
        return _multi_critic_config(spec, serialized)
    return _critic_config(spec, "spec", serialized)


def _policy(dtype, serialized: bool, default=None):
    """The dtype policy a layer given `dtype` takes (the global one for None, unless `default`), serialized or
    as its name."""
    if dtype is None:
        dtype = default
    try:
        policy = keras.config.dtype_policy() if dtype is None else keras.dtype_policies.get(dtype)
    except (ValueError, TypeError) as err:
        raise ValueError(f"dtype: got {dtype!r}, expected a Keras dtype policy or its name ({err}).") from None
    return keras.dtype_policies.serialize(policy) if serialized else policy.name


def _critic_class():
    """`CriticNetwork`, as Keras deserializes a critic's config with it: not imported, as the critic imports this
    module (its `fit` trains through `CriticTrainer`'s step, which checks the hosts here)."""
    return keras.saving.get_registered_object("multicritic>CriticNetwork")


def _keyword_defaults(cls) -> Dict[str, object]:
    return {
        name: p.default for name, p in inspect.signature(cls.__init__).parameters.items() if p.kind is p.KEYWORD_ONLY
    }


def _critic_config(spec: Mapping, what: str, serialized: bool) -> Dict[str, object]:
    from multicritic import heads, trunks
    from multicritic.model import options as critic_options

    defaults = _keyword_defaults(_critic_class())
    layer = {"name": "critic", "trainable": True, "dtype": None}
    unknown = sorted(
        str(k) for k in spec if k not in defaults and k not in layer and k not in critic_options.TRAINING_OPTIONS
    )
    if unknown:
        raise ValueError(f"{what}: got the option {unknown[0]!r}, expected options of CriticNetwork.")
    given = {**defaults, **{k: v for k, v in spec.items() if k in defaults}}
    moved = {k: v for k, v in spec.items() if k in critic_options.TRAINING_OPTIONS}
    dims, _, _, initializer = critic_options.check_options(moved, **given)
    support = {key: given[key] for key in heads.SUPPORT}
    trunk_shared = dict(
        model_size=given["model_size"],
        num_dense_layers=dims["num_dense_layers"],
        dense_hidden_units=dims["dense_hidden_units"],
        norm=given["norm"],
        norm_epsilon=given["norm_epsilon"],
        use_bias=given["use_bias"],
        kernel_initializer=initializer,
    )
    return {
        "name": spec.get("name", layer["name"]),
        "trainable": spec.get("trainable", layer["trainable"]),
        "dtype": _policy(spec.get("dtype"), serialized),
        "model_size": given["model_size"],
        "num_buckets": int(given["num_buckets"]),
        "lower_bound": float(given["lower_bound"]),
        "upper_bound": float(given["upper_bound"]),
        "ema_decay": float(given["ema_decay"]),
        "bin_scheme": given["bin_scheme"],
        **{key: dims[key] for key in ("num_dense_layers", "dense_hidden_units", "gru_units")},
        **{key: dims[key] for key in ("num_z_categoricals", "num_z_classes")},
        "head": _part(heads.HEADS, heads.legacy_spec(given["head"], given["hl_gauss_sigma"]), support, serialized),
        "trunk": _part(trunks.TRUNKS, given["trunk"], trunk_shared, serialized),
        "ensemble_size": int(given["ensemble_size"]),
        "aggregation": given["aggregation"],
        "aggregation_subset": int(given["aggregation_subset"]),
        "norm": given["norm"],
        "norm_epsilon": float(given["norm_epsilon"]),
        "use_bias": bool(given["use_bias"]),
        "kernel_initializer": keras.initializers.serialize(initializer) if serialized else None,
        "input_layout": dims["input_layout"],
        "input_size": dims["input_size"],
    }


def _part(registry, part, shared: Mapping, serialized: bool) -> Dict[str, object]:
    """The spec the critic stores for `part` (`registry.canonical`); without `serialized`, a part given by name or
    spec gets its own options' defaults from its class's signature instead of from a built part's `get_config()`
    (which serializes its dtype policy: see `_resolved`)."""
    if serialized or not isinstance(part, (str, Mapping)):
        return registry.canonical(part, shared)
    from multicritic.registry import LAYER_KEYS

    cls, options = registry.resolve(part, shared)  # (checks the options)
    defaults = {
        name: p.default
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if p.kind is p.KEYWORD_ONLY and name not in LAYER_KEYS and name not in registry.shared
    }
    return {"class_name": registry.name_of(cls), "config": {**defaults, **options}}


def _multi_critic_config(spec: Mapping, serialized: bool) -> Dict[str, object]:
    from multicritic.model.normalizer import ReturnNormalizer
    from multicritic.model.options import TRAINING_OPTIONS, upgrade_config
    from multicritic.validation import integer, number

    critic_class = _critic_class()
    # What a stream given as a dict may hold (as `MultiCritic` takes it): the critic's options, what its
    # `get_config()` writes, and the training options older configs hold.
    stream_keys = {*_keyword_defaults(critic_class), "name", "dtype", "trainable", *TRAINING_OPTIONS}

    unknown = sorted(
        str(k) for k in spec if k not in ("critics", "stream_weights", "normalizers", "name", "dtype", "trainable")
    )
    if unknown:
        raise ValueError(f"spec: got the option {unknown[0]!r}, expected options of MultiCritic.")
    critics = spec["critics"]
    if not isinstance(critics, Mapping) or not critics:
        raise ValueError(f"critics: got {critics!r}, expected a non-empty dict {{stream: CriticNetwork}}.")
    configs = {}
    for stream, critic in critics.items():
        if isinstance(critic, critic_class):
            configs[stream] = critic.get_config()
        elif isinstance(critic, Mapping):
            unknown = sorted(str(k) for k in critic if k not in stream_keys)
            if unknown:
                raise ValueError(
                    f"critics[{stream!r}]: got the option {unknown[0]!r}, expected options of CriticNetwork (or its "
                    "get_config())."
                )
            # As MultiCritic builds it: `CriticNetwork.from_config`, named after its stream.
            config = upgrade_config(dict(critic, name=stream))[0]
            configs[stream] = _critic_config(config, f"critics[{stream!r}]", serialized)
        else:
            raise ValueError(f"critics[{stream!r}]: got {type(critic).__name__}, expected a CriticNetwork.")
    given = {}
    for what in ("stream_weights", "normalizers"):
        given[what] = spec.get(what) or {}
        if not isinstance(given[what], Mapping):
            raise ValueError(f"{what}: got a {type(given[what]).__name__}, expected a dict {{stream: value}} or None.")
        unknown = sorted(map(str, set(given[what]) - set(critics)))
        if unknown:
            raise ValueError(f"{what}: got streams {unknown}, expected some of {list(critics)}.")
    normalizer = _keyword_defaults(ReturnNormalizer)
    normalizers = {}
    for stream in critics:
        norm = given["normalizers"].get(stream, "perc_ema")
        if isinstance(norm, ReturnNormalizer):
            normalizers[stream] = norm.get_config()
            continue
        norm = {"impl": norm} if isinstance(norm, str) else norm
        if not isinstance(norm, Mapping):
            raise ValueError(
                f"normalizers[{stream!r}]: got {norm!r}, expected 'perc_ema', 'none' or a ReturnNormalizer."
            )
        options = {**normalizer, **{k: v for k, v in norm.items() if k in normalizer}}
        if options["rate"] is not None:
            decay = 1.0 - number("rate", options["rate"], low=0.0, high=1.0, low_open=True)
        else:
            decay = number("decay", 0.99 if options["decay"] is None else options["decay"], low=0.0, high=1.0)
        normalizers[stream] = {
            "name": f"normalizer_{stream}",
            "trainable": norm.get("trainable", True),
            "dtype": _policy(norm.get("dtype"), serialized, default="float32"),
            "impl": options["impl"],
            "decay": decay,
            "low_percentile": number("low_percentile", options["low_percentile"], low=0.0, high=100.0),
            "high_percentile": number("high_percentile", options["high_percentile"], low=0.0, high=100.0),
            "limit": number("limit", options["limit"], low=0.0, low_open=True),
            "debias": options["debias"],
        }
        if options["num_tasks"] is not None:  # (written only per task, as `ReturnNormalizer.get_config`)
            normalizers[stream]["num_tasks"] = integer("num_tasks", options["num_tasks"])
    return {
        "name": spec.get("name", "multi_critic"),
        "trainable": spec.get("trainable", True),
        "dtype": _policy(spec.get("dtype"), serialized),
        "critics": configs,
        "stream_weights": {
            s: number(f"stream_weights[{s!r}]", given["stream_weights"].get(s, 1.0), low=0.0) for s in critics
        },
        "normalizers": normalizers,
    }


def agree_critic(what: str, spec: Mapping, others: Optional[Mapping] = None, variables: Sequence = ()) -> None:
    """Before each host builds the critic of `spec`: every host asks for the same critic, else a `ValueError` on
    every host naming the first option that differs and each host's value.

    The hosts compare what their specs resolve to (`critic_config`: every
    default filled in), so a head given by name on one host and as a spec
    on another is compared by its options (`critic option 'head.sigma':
    host 0 has 0.75, host 1 has 1.0`), and an option one host leaves at its
    default is named with that default. The dtype policies (the global one
    and the critic's) come first, then the critic's options; `others` (a
    `{part: value}` dict, such as a run's options) before both. A spec that
    a host cannot resolve is refused on every host, naming that host. A
    collective, as `agree`; it creates no variable. What `CriticTrainer`
    leaves out of its own check is left out here: the critic's name and
    kernel initializer (how new weights start).

    Args:
        what: what is compared, for the error message (`"critic 'single'"`).
        spec: this host's `CriticNetwork` (or `MultiCritic`) options.
        others: more `{part: value}` to compare, before the critic.
        variables: as `topology`.

    Examples:
        >>> hosts.agree_critic("critic", spec, {"run option": {"steps": 100}})   # on every host, then:
        >>> critic = CriticNetwork(**spec)
    """
    try:
        config, failure = _resolved(spec, serialized=False), None
        message = {
            "parts": {
                **{str(name): part for name, part in (others or {}).items()},
                "dtype policy": {"global": keras.config.dtype_policy().name, "critic": config["dtype"]},
                "critic option": {k: v for k, v in config.items() if k not in checkpoint.IGNORED_CRITIC_KEYS},
            }
        }
    except ValueError as err:  # re-raised below, once the other hosts know
        failure, message = err, _error(err)
    if topology(variables)[1] == 1:
        if failure is not None:
            raise failure
        return
    # One exchange, the refusal of a spec included (a nano critic's fits one round of EXCHANGE_BYTES).
    everyone = gather(message, variables, kind=f"agree {what}")
    if failure is not None:
        raise failure
    for host, theirs in enumerate(everyone):
        if "error" in theirs:
            raise ValueError(
                f"{what}: host {host} cannot build the critic it asks for ({theirs['error']}); expected a critic "
                "every host can build."
            )
    _refuse_differences(what, [theirs["parts"] for theirs in everyone])


def same(what: str, value, expected: str, variables: Sequence = ()) -> None:
    """Raises a `ValueError` on every host, naming each host's value, unless every host passed an equal `value`.

    For small values quoted whole (a resume step's list of checkpoints); `agree` names the option that differs
    in a config. A collective, as `agree`.

    Args:
        what: the argument or quantity compared, for the error message.
        value: this host's value (JSON-serialisable).
        expected: what the hosts should have done, for the error message.
        variables: as `topology`.
    """
    if topology(variables)[1] == 1:
        return
    everyone = gather(value, variables, kind=f"same {what}")
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
            "critic option": config,
            "dtype policy": dtype_policies(critic),
            "trainer option": options,
            "optimizer": requested,
        },
        critic.weights,
    )


def dtype_policies(critic) -> Dict[str, str]:
    """The dtype policies that change a step's numbers: the global one (`keras.config.set_dtype_policy`: the
    trainer's loss scaling follows it) and the critic's own (`dtype=`; a MultiCritic's streams' are in its
    config). Not part of the critic config compared otherwise: a checkpoint restores across policies."""
    return {"global": keras.config.dtype_policy().name, "critic": critic.dtype_policy.name}


def agree_batch(kind: str, shapes: Mapping[str, Sequence[int]], batch_axis: int, variables: Sequence = ()) -> None:
    """Every host passes a step batch of the same shapes (so the global batch splits evenly: the engines average
    the hosts' gradients with equal weights), else a `ValueError` on every host naming the shapes and the
    global batch. A collective: `CriticTrainer` makes it before a step kind's first step, and again where this
    host's shapes change."""
    index, count = topology(variables)
    if count == 1:
        return
    mine = {name: [int(d) for d in shape] for name, shape in shapes.items()}
    everyone = gather(mine, variables, kind=f"batch {kind}")
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
    return any(gather(_PREEMPTION["requested"], variables, kind="preempt"))


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
    """An error as a status to exchange, cut to a line's length (it is quoted in the other hosts' errors)."""
    return {"error": f"{type(err).__name__}: {err}"[:_MESSAGE_CHARS]}


def save(trainer, path) -> str:
    """`trainer`'s state written to `path` by host 0 alone (sealed, atomic); returns the path written.

    Every host must call it (it waits until host 0 has written). If host 0
    cannot write, host 0 raises its error and every other host an `OSError`
    quoting it. Host 0 writes only once every host has called it: a host
    elsewhere in its program (another checkpoint schedule) makes every host
    raise `HostsOutOfStep` with nothing written.
    """
    variables = trainer.state_variables
    index, count = topology(variables)
    if count == 1:
        return checkpoint.save(trainer, path)
    gather(None, variables, kind="checkpoint")  # every host is here: the file is one they all agreed to
    status, failure = {}, None
    if index == 0:
        try:
            status = {"path": checkpoint.save(trainer, path, hosts=count)}
        except Exception as err:  # re-raised below, once the other hosts know
            status, failure = _error(err), err
    chief = gather(status, variables, kind="checkpoint written")[0]
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
    statuses = gather(status, variables, kind="restore")
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
