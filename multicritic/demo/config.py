"""The demo's settings and their checks. Pure Python and numpy: no Keras here,
so that `multicritic demo` refuses a bad setting before Keras (and a backend
that may print log lines) is imported.

Reward scales: every exact value of the demo's MDP, `scale * V(s)`, must lie
inside the critic's value support, `|v| <= symexp(20) ~ 4.85e8` (the default
`upper_bound` of 20 in symlog space, for both bin schemes): outside it the
two-hot targets are clipped and the critic cannot represent the value at all.
The exact values at scale 1 are below about 30 in magnitude (rewards ~ N(0, 1)
shifted by +-0.5, gamma 0.9), so scales up to about 1e7 pass; the limit for
the chosen seed is in the error message. Scales must also be at least
`MIN_SCALE` = 1e-6: below it the values sink towards the float32 resolution
of the decoded value (about 1e-8 near 0) and the relative error measures
rounding, not learning. Non-finite scales are refused.

Parts and ensembles: `head` is the critic's value head and `trunk` its trunk
(registered names: `multicritic.heads.HEADS`, `multicritic.trunks.TRUNKS`;
"two_hot" and "mlp" are the reference), `ensemble` its number of members K (1 to
`MAX_ENSEMBLE`) and `aggregation` how the members' values are reduced, for
the lambda-return targets and for the value the demo scores ("members":
each member learns from its own targets and the demo scores their mean).
A head may support some bin schemes only (its registered `bin_schemes`:
HL-Gauss needs "uniform_symlog"); when `bin_scheme` is not given (None) it is
"symexp" where the head supports it, else the head's first scheme.
"min_of_random" draws 2 members, so it needs an ensemble of 2 or more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Optional, Sequence

import numpy as np

from multicritic.demo.mdp import MDP, random_mdp
from multicritic.heads import HEADS as HEAD_REGISTRY
from multicritic.trunks import TRUNKS as TRUNK_REGISTRY

DEFAULT_SCALES = (1.0, 1e3, 1e6)
# Copies of multicritic.model.sizes.MODEL_SIZES and multicritic.math.bins.BIN_SCHEMES,
# which import Keras (tests/demo/test_config.py keeps them equal).
MODEL_SIZES = ("nano", "micro", "mini", "XXS", "XS", "S", "M", "L", "XL")
BIN_SCHEMES = ("uniform_symlog", "symexp")
# The registries' names (read without Keras); a copy of multicritic.model.critic.AGGREGATIONS (same test).
HEADS = tuple(HEAD_REGISTRY)
TRUNKS = tuple(TRUNK_REGISTRY)
AGGREGATIONS = ("mean", "min", "min_of_random", "members")
# A copy of multicritic.training.presets.PRESETS (same test).
PRESETS = ("rllib-2023", "dreamerv3-2024")
_PRESET_BINS = {"rllib-2023": "uniform_symlog", "dreamerv3-2024": "symexp"}
_PRESET_PARTS = {"head": "two_hot", "trunk": "mlp"}  # both presets' parts
MAX_ENSEMBLE = 64
MIN_OF_RANDOM_SUBSET = 2  # the critic's default aggregation_subset
# The critic's default value support: symexp(upper_bound=20).
MAX_ABS_VALUE = math.expm1(20.0)
MIN_SCALE = 1e-6
MAX_SEED = 2**32 - 1  # numpy's and keras.utils.set_random_seed's limit


@dataclass
class DemoConfig:
    """The demo's hyperparameters. They are chosen for a small MDP and are
    not DreamerV3's: learning rate 3e-3 with cosine decay to 2% (DreamerV3's
    critic: a constant 3e-5, the `CriticTrainer` default) and gamma 0.9
    (DreamerV3: 0.997); horizon 15, lambda 0.95 and the Adam epsilon 1e-5
    are DreamerV3's.

    `bin_scheme=None` picks the head's default: "symexp" where the head
    supports it, else the first scheme it supports.

    `preset` ("rllib-2023" or "dreamerv3-2024", see `multicritic.training.presets`)
    takes the preset's critic architecture (bins, norm, biases,
    initialisers; the layer count and width stay the demo size's), its
    optimizer (Adam or LaProp + AGC, on the demo's learning-rate schedule)
    and its slow-critic and loss options; gamma stays the MDP's."""

    size: str = "mini"
    steps: int = 1500
    seed: int = 0
    bin_scheme: Optional[str] = None
    scales: Sequence[float] = DEFAULT_SCALES
    num_states: int = 48
    noise: float = 0.05
    batch: int = 64
    horizon: int = 15
    gamma: float = 0.9
    lambda_: float = 0.95
    learning_rate: float = 3e-3
    eval_every: int = 100
    head: str = "two_hot"
    trunk: str = "mlp"
    ensemble: int = 1
    aggregation: str = "mean"
    preset: Optional[str] = None

    def __post_init__(self):
        if self.bin_scheme is None:
            self.bin_scheme = _PRESET_BINS.get(self.preset) or default_bin_scheme(self.head)


def head_bin_schemes(head) -> tuple:
    """The bin schemes `head` (a registered name) supports."""
    if head not in HEAD_REGISTRY:
        return BIN_SCHEMES
    return tuple(HEAD_REGISTRY.traits(head).get("bin_schemes") or BIN_SCHEMES)


def default_bin_scheme(head) -> str:
    """The demo's bins for `head`: "symexp" where the head supports it, else its first scheme."""
    schemes = head_bin_schemes(head)
    return "symexp" if "symexp" in schemes else schemes[0]


def demo_mdp(config: DemoConfig, rng: Optional[np.random.Generator] = None) -> MDP:
    """The demo's MDP at reward scale 1 (the first draw from `default_rng(seed)`)."""
    rng = np.random.default_rng(config.seed) if rng is None else rng
    return random_mdp(rng, num_states=config.num_states, noise=config.noise, gamma=config.gamma)


def _is_int(x) -> bool:
    return isinstance(x, Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


def check_config(config: DemoConfig, flags: Optional[dict] = None) -> None:
    """Raises a one-line `ValueError` for a setting the demo cannot run with,
    naming the field (or its command-line flag, from `flags`)."""
    flags = flags or {}

    def fail(field: str, got, expected: str):
        raise ValueError(f"{flags.get(field, field)}: got {got!r}, expected {expected}")

    if config.preset is not None:
        if config.preset not in PRESETS:
            fail("preset", config.preset, f"one of {list(PRESETS)}")
        for part, name in _PRESET_PARTS.items():
            if getattr(config, part) != name:
                fail(
                    part, getattr(config, part), f"{name!r} with {flags.get('preset', 'preset')} (the presets' {part})"
                )
        if config.bin_scheme != _PRESET_BINS[config.preset]:
            fail(
                "bin_scheme",
                config.bin_scheme,
                f"{_PRESET_BINS[config.preset]!r} with "
                f"{flags.get('preset', 'preset')} {config.preset} (or none: the preset sets it)",
            )
    if config.size not in MODEL_SIZES:
        fail("size", config.size, f"one of {list(MODEL_SIZES)}")
    if config.bin_scheme not in BIN_SCHEMES:
        fail("bin_scheme", config.bin_scheme, f"one of {list(BIN_SCHEMES)}")
    if not isinstance(config.head, str) or config.head not in HEADS:
        fail("head", config.head, f"one of {list(HEADS)}")
    if not isinstance(config.trunk, str) or config.trunk not in TRUNKS:
        fail("trunk", config.trunk, f"one of {list(TRUNKS)}")
    schemes = head_bin_schemes(config.head)
    if config.bin_scheme not in schemes:
        fail(
            "bin_scheme",
            config.bin_scheme,
            f"one of {list(schemes)} with {flags.get('head', 'head')} {config.head} (the schemes the head supports)",
        )
    if not _is_int(config.ensemble) or not 1 <= config.ensemble <= MAX_ENSEMBLE:
        fail("ensemble", config.ensemble, f"an integer in [1, {MAX_ENSEMBLE}]")
    if not isinstance(config.aggregation, str) or config.aggregation not in AGGREGATIONS:
        fail("aggregation", config.aggregation, f"one of {list(AGGREGATIONS)}")
    if config.aggregation == "min_of_random" and config.ensemble < MIN_OF_RANDOM_SUBSET:
        raise ValueError(
            f"{flags.get('aggregation', 'aggregation')}: got 'min_of_random' with "
            f"{flags.get('ensemble', 'ensemble')} {config.ensemble}, expected an ensemble of {MIN_OF_RANDOM_SUBSET} "
            f"or more (it takes the minimum of {MIN_OF_RANDOM_SUBSET} random members)"
        )
    for field, low in (("steps", 1), ("batch", 1), ("horizon", 1), ("eval_every", 1), ("num_states", 4)):
        value = getattr(config, field)
        if not _is_int(value) or value < low:
            fail(field, value, f"an integer >= {low}")
    if not _is_int(config.seed) or not 0 <= config.seed <= MAX_SEED:
        fail("seed", config.seed, f"an integer in [0, {MAX_SEED}] (2**32 - 1)")
    for field, low, high, high_open in (
        ("gamma", 0.0, 1.0, True),
        ("lambda_", 0.0, 1.0, False),
        ("noise", 0.0, 1.0, False),
    ):
        value = getattr(config, field)
        if not _is_real(value) or not (low <= value < high if high_open else low <= value <= high):
            fail(field, value, f"a number in [{low}, {high}{')' if high_open else ']'}")
    if not _is_real(config.learning_rate) or not (math.isfinite(config.learning_rate) and config.learning_rate > 0):
        fail("learning_rate", config.learning_rate, "a finite number > 0")
    check_scales(config, flags.get("scales", "scales"))


def check_scales(config: DemoConfig, name: str = "scales") -> None:
    """Refuses reward scales whose exact values the critic cannot represent (see the module doc)."""
    scales = list(config.scales) if not isinstance(config.scales, (str, bytes)) else [config.scales]
    if not scales:
        raise ValueError(f"{name}: got no reward scale, expected at least one")
    for s in scales:
        if not _is_real(s) or not math.isfinite(s) or s <= 0:
            raise ValueError(f"{name}: got {s!r}, expected finite numbers > 0")
        if s < MIN_SCALE:
            raise ValueError(
                f"{name}: got {s:g}, expected scales >= {MIN_SCALE:g} "
                "(smaller values approach the float32 resolution of the critic's value)"
            )
    peak = float(np.max(np.abs(demo_mdp(config).values())))
    limit = MAX_ABS_VALUE / peak
    for s in scales:
        if s * peak > MAX_ABS_VALUE:
            raise ValueError(
                f"{name}: got {s:g}, whose exact values reach {s * peak:.3g}, outside the critic's value "
                f"support +-{MAX_ABS_VALUE:.3g} (largest scale for this MDP and seed: {limit:.3g})"
            )
