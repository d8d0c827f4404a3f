"""`HostAdapter`: the one interface every host codebase's module gives (`multicritic.interop.HOSTS`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional


@dataclass(frozen=True)
class HostAdapter:
    """A host codebase's weights, layout and options, behind one interface.

    `state` is the host's own checkpoint form, whatever it is (RLlib's
    `get_weights()` list, sheeprl's `(critic_state, target_critic_state)`
    pair, the official code's flat `params`): `load(critic, export(critic))`
    round trips for every host.

    Args:
        name: the registered name (`HOSTS[name]`).
        title: the codebase and the version it is checked against.
        options: the `CriticNetwork` options that reproduce its forward pass
            (the module's `CRITIC_OPTIONS`).
        load: `load(critic, state, member=None)`: all or nothing.
        export: `export(critic, member=None) -> state` (numpy arrays).
        build: `build(state, *, gru_units, num_z_categoricals, num_z_classes,
            **kwargs) -> CriticNetwork` sized from the state, or `None`.
        modules: `modules(critic)`: the critic as the host's PyTorch
            module(s), in its own state-dict layout, or `None`.
        key: `key(kind, layer) -> str`: the host's name of the layer's
            `kernel`, `scale`, `offset` (hidden layers) or `head_kernel`,
            `head_bias` (the head, `layer` = the number of hidden layers);
            `None` for a host without names (a list of arrays).
    """

    name: str
    title: str
    options: Mapping[str, Any] = field(repr=False)
    load: Callable = field(repr=False)
    export: Callable = field(repr=False)
    build: Optional[Callable] = field(default=None, repr=False)
    modules: Optional[Callable] = field(default=None, repr=False)
    key: Optional[Callable] = field(default=None, repr=False)
