"""`MultiCritic`: one critic per reward stream, trained together."""

from __future__ import annotations

import inspect
from typing import Dict, List, Mapping, Optional

import keras

from multicritic.model.critic import TRAINING_OPTIONS, CriticNetwork
from multicritic.model.options import call_inputs
from multicritic.training.fit import KerasTraining
from multicritic.model.normalizer import IMPLS, ReturnNormalizer
from multicritic.validation import number

# What a critic given as a dict may hold: `CriticNetwork`'s options, what its `get_config()` writes, and the
# training options older configs hold.
_CRITIC_CONFIG_KEYS = (
    frozenset(inspect.signature(CriticNetwork.__init__).parameters) - {"self", "kwargs"}
    | {"name", "dtype", "trainable"}
    | set(TRAINING_OPTIONS)
)


@keras.saving.register_keras_serializable(package="multicritic")
class MultiCritic(KerasTraining, keras.Model):
    """Named critics, one per reward stream, each with its own return normaliser and loss weight.

    DreamerV3's exploration variant keeps one critic per reward stream (task
    and intrinsic reward): each stream has its own lambda-returns, its own
    critic (any head, any ensemble size) and its own `ReturnNormalizer`,
    and the streams' losses add up with their weights. `CriticTrainer` trains
    a `MultiCritic` in one compiled step from one batch of latent states and
    one reward array per stream (`train_on_dream(h, z, {"task": r1,
    "explore": r2}, continues)`); metrics come per stream (`"task/total"`)
    and combined (`"total"`). `compile()` / `fit()` train it as
    `CriticNetwork`'s do, with `{stream: array}` value targets or rewards.

    Args:
        critics: `{stream: CriticNetwork or its config dict}` (the critics
            must share their inputs: all `(h, z)` critics of one size, or all
            features critics of one `input_size`; a config builds a critic
            named after its stream).
        stream_weights: `{stream: loss weight >= 0}` (default 1 each).
        normalizers: `{stream: "perc_ema" | "none" | ReturnNormalizer |
            config}` (default `"perc_ema"` each).
        **kwargs: passed to `keras.Model`.

    Call arguments:
        h, z, use_ema: as `CriticNetwork` (features critics: `x`, `use_ema`).

    Returns:
        `{stream: (value_symlog, logits)}`.

    Examples:
        >>> critics = MultiCritic({"task": {"model_size": "XS"},
        ...                        "explore": {"model_size": "XS", "ensemble_size": 5}},
        ...                       stream_weights={"task": 1.0, "explore": 0.5})
        >>> trainer = CriticTrainer(critics)
        >>> metrics = trainer.train_on_dream(h, z, {"task": r, "explore": r_int}, c)

    Reference:
        Hafner et al. 2023 (arXiv 2301.04104), Sec. 3 and the exploration
        experiments' separate critics.
    """

    def __init__(
        self,
        critics: Mapping,
        stream_weights: Optional[Mapping[str, float]] = None,
        normalizers: Optional[Mapping] = None,
        **kwargs,
    ):
        if not isinstance(critics, Mapping) or not critics:
            raise ValueError(f"critics: got {critics!r}, expected a non-empty dict {{stream: CriticNetwork}}.")
        kwargs.setdefault("name", "multi_critic")
        super().__init__(**kwargs)
        built: Dict[str, CriticNetwork] = {}
        for stream, critic in critics.items():
            if not isinstance(stream, str) or not stream.isidentifier():
                raise ValueError(f"critics: stream name {stream!r} is not an identifier.")
            if isinstance(critic, Mapping):
                unknown = sorted(str(k) for k in critic if k not in _CRITIC_CONFIG_KEYS)
                if unknown:
                    raise ValueError(
                        f"critics[{stream!r}]: got the option {unknown[0]!r}, expected options of "
                        "CriticNetwork (or its get_config())."
                    )
                critic = CriticNetwork.from_config(dict(critic, name=stream))
            if not isinstance(critic, CriticNetwork):
                raise ValueError(f"critics[{stream!r}]: got {type(critic).__name__}, expected a CriticNetwork.")
            built[stream] = critic
        names = [c.name for c in built.values()]
        if len(set(names)) != len(names):
            raise ValueError(f"critics: got critics named {names}, expected distinct names (their variables' paths).")
        sizes = {tuple(c.input_row_shapes().items()) for c in built.values()}
        if len(sizes) != 1 or any(None in row for _, row in next(iter(sizes))):
            raise ValueError(
                f"critics: got input sizes {sorted(str(dict(s)) for s in sizes)}, expected built critics of one size "
                "(and one kind: (h, z) or features)."
            )
        for what, given in (("stream_weights", stream_weights), ("normalizers", normalizers)):
            if given is not None and not isinstance(given, Mapping):
                raise ValueError(f"{what}: got a {type(given).__name__}, expected a dict {{stream: value}} or None.")
        stream_weights = dict(stream_weights or {})
        normalizers = dict(normalizers or {})
        for what, given in (("stream_weights", stream_weights), ("normalizers", normalizers)):
            unknown = sorted(map(str, set(given) - set(built)))
            if unknown:
                raise ValueError(f"{what}: got streams {unknown}, expected some of {list(built)}.")
        shared = [
            s
            for s, n in normalizers.items()
            if isinstance(n, ReturnNormalizer) and sum(n is other for other in normalizers.values()) > 1
        ]
        if shared:
            raise ValueError(
                f"normalizers: got one ReturnNormalizer object for the streams {shared}, expected one "
                "per stream (each stream's returns have their own statistics)."
            )
        self.stream_names: List[str] = list(built)
        self.critics = built
        self.stream_weights = {s: number(f"stream_weights[{s!r}]", stream_weights.get(s, 1.0), low=0.0) for s in built}
        self.normalizers = {}
        for s in built:
            norm = normalizers.get(s, "perc_ema")
            if isinstance(norm, str):
                if norm not in IMPLS:
                    raise ValueError(
                        f"normalizers[{s!r}]: got {norm!r}, expected one of {list(IMPLS)}, a config "
                        "or a ReturnNormalizer."
                    )
                norm = ReturnNormalizer(impl=norm, name=f"normalizer_{s}")
            elif isinstance(norm, Mapping):
                norm = ReturnNormalizer.from_config(dict(norm, name=f"normalizer_{s}"))
            if not isinstance(norm, ReturnNormalizer):
                raise ValueError(
                    f"normalizers[{s!r}]: got {norm!r}, expected 'perc_ema', 'none' or a ReturnNormalizer."
                )
            self.normalizers[s] = norm
        self.built = True

    @property
    def streams(self) -> Dict[str, CriticNetwork]:
        return {s: self.critics[s] for s in self.stream_names}

    def stream_critics(self) -> Dict[str, CriticNetwork]:
        """`streams` (`multicritic.protocols.CriticLike`)."""
        return self.streams

    @property
    def _first(self) -> CriticNetwork:
        return self.critics[self.stream_names[0]]

    # The input sizes, the same for every stream (checked when built).
    @property
    def gru_units(self):
        return self._first.gru_units

    @property
    def num_z_categoricals(self):
        return self._first.num_z_categoricals

    @property
    def num_z_classes(self):
        return self._first.num_z_classes

    @property
    def input_layout(self):
        return self._first.input_layout

    @property
    def input_size(self):
        return self._first.input_size

    def input_row_shapes(self):
        """The streams' inputs (the same for every stream; see `CriticNetwork.input_row_shapes`)."""
        return self._first.input_row_shapes()

    def check_inputs(self, h_shape, z_shape=None):
        self._first.check_inputs(h_shape, z_shape)

    def call(self, h, z=None, use_ema=False, training=None):
        inputs = call_inputs(self.input_layout, h, z)
        # `training` only where given (a training step's passes, for parts that normalise by the batch).
        kwargs = {} if training is None else {"training": training}
        return {s: self.critics[s](*inputs, use_ema=use_ema, **kwargs) for s in self.stream_names}

    @property
    def fast_weights(self):
        return [v for s in self.stream_names for v in self.critics[s].fast_weights]

    @property
    def ema_weights(self):
        return [v for s in self.stream_names for v in self.critics[s].ema_weights]

    def init_ema(self) -> None:
        for critic in self.critics.values():
            critic.init_ema()

    def update_ema(
        self, decay: Optional[float] = None, *, tau: Optional[float] = None, step=None, period: int = 1
    ) -> None:
        """Every stream's `update_ema` with these arguments (see `CriticNetwork.update_ema`)."""
        for critic in self.critics.values():
            critic.update_ema(decay, tau=tau, step=step, period=period)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "critics": {s: self.critics[s].get_config() for s in self.stream_names},
                "stream_weights": dict(self.stream_weights),
                "normalizers": {s: self.normalizers[s].get_config() for s in self.stream_names},
            }
        )
        return config
