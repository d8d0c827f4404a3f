"""`StateDictHost`: a PyTorch codebase whose critic and slow critic are two `state_dict()`s of one layout.

NM512's dreamerv3-torch (`multicritic.interop.nm512`) and r2dreamer
(`multicritic.interop.r2dreamer`) name their critics' parameters alike (NM512's
`networks.MLP` convention) and differ only in those names' prefixes, their
options and whether the agent's whole state dict may stand for the pair: their
keys, loads, exports, builds and module views are this one piece of code, so a
fix to one is a fix to both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple

from multicritic.interop import _common
from multicritic.interop.adapter import HostAdapter

# What errors call the fast and the slow critic's state.
STATES = ("value_state", "slow_value_state")


@dataclass(frozen=True)
class StateDictHost:
    """A codebase's critic and slow critic as `(value_state, slow_value_state)`, torch `Linear` weights
    transposed to Keras kernels; keys prefixed by a torch.compile / DDP / Fabric wrapper are accepted.

    Args:
        module: the host's module under `multicritic.interop` (errors name its `CRITIC_OPTIONS`).
        source: the codebase as errors name it.
        options: `CRITIC_OPTIONS`: the options `build` gives the critic.
        layers: the hidden layers' name: layer `i` is `{layers}_linear{i}` (`nn.Linear`) and `{layers}_norm{i}`
            (the norm), as NM512's `networks.MLP` names them.
        head: the output layer's name (an `nn.Linear` with bias).
        checked: the options a critic must have to load or export (default `options`); an initializer only says
            how new weights are drawn, so a codebase may leave it out.
        agent_prefixes: `(fast, slow)`: where the agent's own `state_dict()` holds the critic and its slow copy,
            for a codebase whose agent state dict may stand for the pair; None: the two states only.
    """

    module: str
    source: str
    options: Mapping[str, object]
    layers: str
    head: str
    checked: Optional[Mapping[str, object]] = None
    agent_prefixes: Optional[Tuple[str, str]] = None

    def key(self, kind: str, i: int) -> str:
        """The state-dict name of hidden layer `i`'s `kernel`, `bias`, `scale` or `offset`, or of the head's
        `head_kernel` or `head_bias` (`HostAdapter.key`); only the kinds the options give the critic."""
        names = {"kernel": f"{self.layers}_linear{i}.weight", "scale": f"{self.layers}_norm{i}.weight"}
        if self.options["use_bias"]:
            names["bias"] = f"{self.layers}_linear{i}.bias"
        if self.options["norm"] == "layer":  # an RMS norm has no offset
            names["offset"] = f"{self.layers}_norm{i}.bias"
        return {**names, "head_kernel": f"{self.head}.weight", "head_bias": f"{self.head}.bias"}[kind]

    def layout(self, critic) -> list:
        """The critic's variables under the codebase's keys, after checking its options are the codebase's."""
        required = self.options if self.checked is None else self.checked
        builder = f"CriticNetwork(..., **multicritic.interop.{self.module}.CRITIC_OPTIONS)"
        _common.check_options(critic, self.source, required, builder)
        return _common.entries(critic, self.key, transpose=True)

    def states(self, value_state, slow_value_state=None):
        """`(value_state, slow_value_state)` without wrapper prefixes; an agent's state dict (given alone) split
        into its critic's and slow critic's (the rest of the agent is left out)."""
        value_state, slow_value_state = _common.unwrap(value_state), _common.unwrap(slow_value_state)
        prefixes = self.agent_prefixes
        if (
            prefixes is not None
            and slow_value_state is None
            and isinstance(value_state, Mapping)
            and any(isinstance(k, str) and k.startswith(prefixes[0]) for k in value_state)
        ):
            fast, slow = ({k[len(p) :]: v for k, v in value_state.items() if k.startswith(p)} for p in prefixes)
            return fast, slow or None
        return value_state, slow_value_state

    def load(self, critic, value_state: Mapping, slow_value_state: Optional[Mapping] = None, member=None) -> None:
        """Loads the pair (without a slow state the EMA copy becomes the fast critic) all or nothing."""
        value_state, slow_value_state = self.states(value_state, slow_value_state)
        _common.load(critic, self.layout(critic), dict(zip(STATES, (value_state, slow_value_state))), member)

    def export(self, critic, member=None) -> Tuple[Dict[str, object], Dict[str, object]]:
        """`(value_state, slow_value_state)`: numpy state dicts in the codebase's layout."""
        return _common.export(critic, self.layout(critic), member)

    def build(self, value_state: Mapping, slow_value_state: Optional[Mapping] = None, /, **sizes):
        """A `CriticNetwork` of the pair's size (layers and width read from the state) with `options`, loaded;
        `sizes`: `gru_units`, `num_z_categoricals`, `num_z_classes` and other `CriticNetwork` arguments."""
        value_state, slow_value_state = self.states(value_state, slow_value_state)
        return _common.build(
            lambda critic: self.load(critic, value_state, slow_value_state),
            self.key,
            True,
            value_state,
            options=self.options,
            what=STATES[0],
            **sizes,
        )

    def modules(self, critic, outputs: str = "logits"):
        """The critic as the codebase's critic and slow critic modules, in its checkpoint layout.

        Two `torch.nn.Module` views of `critic`'s own tensors whose parameters are named, ordered and shaped as
        the codebase's: `state_dict()`, `load_state_dict()` and a `torch.optim` optimizer's state over
        `parameters()` are those of its critic. PyTorch backend only.

        Args:
            critic: a built single `CriticNetwork` with the host's `CRITIC_OPTIONS`.
            outputs: what `forward(feat)` returns: `"logits"`, `"value"` (symlog) or `"both"`.

        Returns:
            `(value, slow_value)`: the fast critic (trainable) and the EMA copy (no gradients).

        Raises:
            ValueError: when `critic` is not a built single critic of the codebase's architecture, or not on the
                PyTorch backend.
        """
        fast, ema = _common.view_layouts(critic, self.layout(critic))
        return critic.fast_module(outputs=outputs, layout=fast), critic.ema_module(outputs=outputs, layout=ema)

    def adapter(self, name: str, title: str, load, export, build, modules) -> HostAdapter:
        """The host's `HostAdapter` over its module's public functions; its `state` is the pair."""
        return HostAdapter(
            name,
            title,
            self.options,
            lambda critic, state, member=None: load(critic, *state, member=member),
            export,
            lambda state, **sizes: build(*state, **sizes),
            modules,
            self.key,
        )
