"""`CriticLike`: what the trainer needs of what it trains (a `CriticNetwork` or a `MultiCritic`)."""

from __future__ import annotations

from typing import Dict, List, Optional, Protocol, Sequence, Tuple, runtime_checkable


@runtime_checkable
class CriticLike(Protocol):
    """A critic the trainer can train: one `CriticNetwork`, or several reward streams (`MultiCritic`).

    `stream_names` is `None` for one critic, else the streams' names;
    `stream_critics()` maps each stream's name (`None` for one critic) to
    its `CriticNetwork`. The fast and EMA variables pair up in order, and
    `update_ema` moves every EMA copy (`decay` or `tau`; with `step`, every
    `period`-th step, copying on the first: `multicritic.math.ema.update`).
    `input_row_shapes()` names its inputs in call order with one row's shape
    each (`{"h": ..., "z": ...}`, or a features critic's `{"x": ...}`): what
    the trainer's entries take.
    """

    stream_names: Optional[List[str]]
    built: bool

    def stream_critics(self) -> Dict[Optional[str], object]: ...

    def input_row_shapes(self) -> Dict[str, Tuple[Optional[int], ...]]: ...

    @property
    def trainable_variables(self) -> Sequence: ...

    @property
    def fast_weights(self) -> Sequence: ...

    @property
    def ema_weights(self) -> Sequence: ...

    def update_ema(
        self, decay: Optional[float] = None, *, tau: Optional[float] = None, step=None, period: int = 1
    ) -> None: ...
