"""What the importers share: the critic's variables in an upstream layout, host arrays, all-or-nothing loads."""

from __future__ import annotations

import random
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import keras
import numpy as np
from keras import ops

from multicritic import heads, trunks

# The two architectures the codebases share (with their `input_layout`): the 2023 paper's (RLlib, sheeprl,

from multicritic.model import options as critic_options

from multicritic.files import integrity

from multicritic.model import members

# NM512) and the official 2024 code's (TorchRL follows it).
ARCHITECTURE_2023 = dict(
    norm="layer",
    norm_epsilon=1e-3,
    use_bias=False,
    bin_scheme="uniform_symlog",
    lower_bound=-20.0,
    upper_bound=20.0,
    head="two_hot",
    trunk="mlp",
)
ARCHITECTURE_2024 = dict(
    norm="rms",
    norm_epsilon=1e-4,
    use_bias=True,
    bin_scheme="symexp",
    lower_bound=-20.0,
    upper_bound=20.0,
    head="two_hot",
    trunk="mlp",
)
# The critic's parts, compared as the specs its config holds.
_PARTS = {"head": (heads.HEADS, critic_options.support_of), "trunk": (trunks.TRUNKS, critic_options.trunk_options_of)}
# Not compared on load (it only says how new weights are drawn): the official fan-in truncated normal.
TRUNC_NORMAL_IN = dict(kernel_initializer=keras.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal"))

# (upstream key, fast variable, EMA variable, transpose): a torch `Linear.weight` is `[out, in]`, the
# transpose of a Keras kernel.
Entry = Tuple[str, object, object, bool]


def host_array(x) -> np.ndarray:
    """A torch / JAX / TensorFlow tensor or array-like as a numpy array (bfloat16 and float16 as float32)."""
    if hasattr(x, "detach"):  # torch
        x = x.detach().cpu()
        if str(x.dtype) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        return x.numpy()
    x = np.asarray(x)
    return x.astype(np.float32) if x.dtype.name in ("bfloat16", "float16") else x


# Wrappers whose attribute name prefixes every key of a wrapped module's state dict: torch.compile,
# DistributedDataParallel, Lightning Fabric.
_WRAPPERS = ("_orig_mod.", "module.", "_forward_module.")


def unwrap(state, wrappers=_WRAPPERS, unwrapped: Optional[Callable[[Mapping], bool]] = None):
    """`state` without the key prefixes a torch.compile / DDP / Fabric wrapper adds (when every key has one).

    `unwrapped(state)`: whether `state` is already in the codebase's own layout (for codebases whose own keys
    start like a wrapper's: TorchRL's `module.`); prefixes are taken off only until it is.
    """
    if not isinstance(state, Mapping):
        return state
    changed = True
    while changed and state and not (unwrapped is not None and unwrapped(state)):
        changed = False
        for prefix in wrappers:
            if all(isinstance(k, str) and k.startswith(prefix) for k in state):
                state = {k[len(prefix) :]: v for k, v in state.items()}
                changed = True
                break
    return state


def check_critic(critic) -> None:
    """A built `CriticNetwork`, else a `ValueError` naming `critic`."""
    from multicritic.model.critic import CriticNetwork

    if not isinstance(critic, CriticNetwork):
        raise ValueError(f"critic: got a {type(critic).__name__}, expected a CriticNetwork.")
    if not critic.built:
        raise ValueError("critic: not built yet; call it once or give its input sizes first.")


def check_options(critic, source: str, required: Mapping[str, object], builder: str) -> None:
    """Raises a `ValueError` naming `critic` when it is not a built `CriticNetwork`, or the first option that
    differs from the source's architecture."""
    check_critic(critic)
    config = critic.get_config()
    for option, want in required.items():
        if option in _PARTS:
            registry, shared = _PARTS[option]
            got, want_spec = config[option], registry.canonical(want, shared(config))
            if got != want_spec:
                got = got["class_name"] if got["class_name"] != want else got
        else:
            got, want_spec = getattr(critic, option), want
        if got != want_spec:
            raise ValueError(
                f"critic: got {option}={got!r}; {source}'s critic has {option}={want!r}. Build the critic with "
                f"{builder}."
            )


def check_member(critic, member) -> None:
    if critic.ensemble_size == 1:
        if member is not None:
            raise ValueError(f"member: got {member!r} for a single critic (ensemble_size=1), expected None.")
        return
    if member is None:
        raise ValueError(
            f"member: got None for an ensemble of {critic.ensemble_size}; expected the member index to load into "
            "or export (an upstream critic is one member)."
        )
    members.check_member(critic, member)


def entries(critic, key: Callable[[str, int], str], transpose: bool) -> List[Entry]:
    """The critic's variables as upstream `key(kind, layer)` names, kinds `kernel`, `bias`, `scale`, `offset`
    (hidden layer `layer`) and `head_kernel`, `head_bias` (`layer`: the number of hidden layers)."""
    check_critic(critic)
    out = []
    mlp, mlp_ema = critic.mlp, critic.mlp_ema
    for i, (dense, norm, dense_ema, norm_ema) in enumerate(
        zip(mlp.dense_layers, mlp.layer_normalizations, mlp_ema.dense_layers, mlp_ema.layer_normalizations)
    ):
        out.append((key("kernel", i), dense.kernel, dense_ema.kernel, transpose))
        if dense.bias is not None:
            out.append((key("bias", i), dense.bias, dense_ema.bias, False))
        out.append((key("scale", i), norm.gamma, norm_ema.gamma, False))
        if norm.beta is not None:
            out.append((key("offset", i), norm.beta, norm_ema.beta, False))
    head, head_ema = critic.return_layer.reward_buckets_layer, critic.return_layer_ema.reward_buckets_layer
    layers = len(mlp.dense_layers)
    out.append((key("head_kernel", layers), head.kernel, head_ema.kernel, transpose))
    out.append((key("head_bias", layers), head.bias, head_ema.bias, False))
    return out


def _shape(critic, var, member, transpose):
    shape = members.member_shape(var) if member is not None else tuple(var.shape)
    return shape[::-1] if transpose else shape


def load(critic, layout: List[Entry], states: Mapping[str, Optional[Mapping]], member=None) -> None:
    """Assigns `states = {"<what>": fast_state, "<what>": slow_state_or_None}` (in that order) all or nothing.

    A missing slow state (None) makes the EMA copy equal to the fast weights. Keys, shapes, dtypes and
    finiteness of every array are checked before the first assignment.
    """
    check_critic(critic)
    check_member(critic, member)
    (fast_what, fast), (slow_what, slow) = states.items()
    checked = []
    for what, state, index in ((fast_what, fast, 1), (slow_what, slow, 2)):
        if state is None:
            continue
        if not isinstance(state, Mapping):
            raise ValueError(f"{what}: got a {type(state).__name__}, expected a mapping of names to arrays.")
        arrays = {}
        for name, value in state.items():
            try:
                arrays[name] = host_array(value)
            except Exception as err:
                raise ValueError(f"{what}: {name}: got an object that is not an array ({err}).") from err
        expected = {e[0]: (_shape(critic, e[index], member, e[3]), "float32") for e in layout}
        values = integrity.check_arrays(what, arrays, expected)
        checked.append((index, values))
    if not checked or checked[0][0] != 1:
        raise ValueError(f"{fast_what}: got None, expected the fast critic's arrays.")
    if len(checked) == 1:
        checked.append((2, checked[0][1]))
    for index, values in checked:
        for entry in layout:
            value = values[entry[0]].T if entry[3] else values[entry[0]]
            if member is None:
                entry[index].assign(value)
            else:
                members.assign_member(entry[index], member, value)


def export(critic, layout: List[Entry], member=None) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
    """`(fast, slow)` dicts of numpy arrays in the upstream layout."""
    check_critic(critic)
    check_member(critic, member)
    out = ({}, {})
    for entry in layout:
        for index, state in ((1, out[0]), (2, out[1])):
            var = entry[index]
            value = (
                members.member_value(var, member) if member is not None else np.asarray(ops.convert_to_numpy(var.value))
            )
            state[entry[0]] = np.ascontiguousarray(value.T if entry[3] else value)
    return out


def build(
    load_fn,
    key: Callable[[str, int], str],
    transpose: bool,
    fast: Mapping,
    *,
    gru_units: int,
    num_z_categoricals: int,
    num_z_classes: int,
    options: Mapping,
    what: str,
    **kwargs,
):
    """A `CriticNetwork` sized from an upstream state (layers counted, width read from the first kernel) with
    `options`, loaded through `load_fn(critic)`; Python's `random` state is as it was before."""
    from multicritic.model.critic import CriticNetwork

    if not isinstance(fast, Mapping) or key("kernel", 0) not in fast:
        raise ValueError(f"{what}: expected a mapping holding {key('kernel', 0)!r} (the first hidden kernel).")
    fixed = {
        "model_size",
        "num_dense_layers",
        "dense_hidden_units",
        "gru_units",
        "num_z_categoricals",
        "num_z_classes",
        "num_buckets",
        *options,
    }
    clash = sorted(set(kwargs) & fixed)
    if clash:
        raise ValueError(
            f"{clash[0]}: got {kwargs[clash[0]]!r}, expected no {clash[0]}: the sizes come from the "
            "state and the architecture options from the codebase (CRITIC_OPTIONS)."
        )
    layers = 0
    while key("kernel", layers) in fast and key("scale", layers) in fast:  # a hidden layer has a norm
        layers += 1
    first = host_array(fast[key("kernel", 0)])
    head = host_array(fast[key("head_bias", layers)]) if key("head_bias", layers) in fast else None
    if first.ndim != 2 or head is None or head.ndim != 1:
        raise ValueError(
            f"{what}: {key('kernel', 0)!r} or {key('head_bias', layers)!r} missing or not a matrix / vector."
        )
    units = first.shape[0] if transpose else first.shape[1]
    # Keras seeds unseeded initializers from Python's `random`; their draws are overwritten by the load, so the
    # host's stream (a training loop's) is left as it was.
    python_random = random.getstate()
    try:
        critic = CriticNetwork(
            model_size=None,
            num_dense_layers=layers,
            dense_hidden_units=int(units),
            gru_units=gru_units,
            num_z_categoricals=num_z_categoricals,
            num_z_classes=num_z_classes,
            num_buckets=int(head.shape[0]),
            **options,
            **kwargs,
        )
    finally:
        random.setstate(python_random)
    load_fn(critic)
    return critic


def view_layouts(critic, layout: List[Entry]):
    """`(fast, ema)` layouts for `critic.fast_module(layout=...)` / `ema_module(layout=...)`: `[(upstream key,
    variable, transpose), ...]`. A single critic only: a host's critic is one member of an ensemble."""
    check_single(critic)
    return [(k, fast, t) for k, fast, _, t in layout], [(k, ema, t) for k, _, ema, t in layout]


def check_single(critic) -> None:
    """A `ValueError` naming `critic` when it is an ensemble: a host's module views hold a single critic."""
    if critic.ensemble_size != 1:
        raise ValueError(
            f"critic: got an ensemble of {critic.ensemble_size}; a host's module views hold a single "
            "critic (ensemble_size=1). Export one member instead (`member=`)."
        )
