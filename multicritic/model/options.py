"""The critic's constructor options: their names, ranges and defaults, checked before anything is built.

`CriticNetwork.__init__` calls `check_options`; `upgrade_config` reads
configs written by earlier versions (checkpoints and weights files check
against it). No Keras model here: the modules that read configs import this
one, not the critic.
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import keras

from multicritic import heads, trunks
from multicritic.layers.mlp import NORMS
from multicritic.model.sizes import get_model_dims
from multicritic.validation import h_z_pair, integer, number

AGGREGATIONS = ("mean", "min", "min_of_random", "members")
# What the trunk takes. A world model's state in two parts: RLlib, TorchRL and the official code concatenate h
# first, sheeprl and NM512 put the flattened z first. Or one flat feature vector (a model-free agent's
# observation, any backbone's embedding): `FEATURES`.
FEATURES = "features"
INPUT_LAYOUTS = ("h_z", "z_h", FEATURES)
# The sizes of `(h, z)`, which a features critic has none of.
LATENT_SIZES = ("gru_units", "num_z_categoricals", "num_z_classes")
# Options that moved to `CriticTrainer` (they say how the critic is trained).
TRAINING_OPTIONS = ("ema_update_period", "ema_regularizer_weight", "ema_regularizer", "ema_targets")


# Options added after configs were first saved, with the value older configs meant.
_ADDED_OPTIONS = {
    "head": "two_hot",
    "trunk": "mlp",
    "ensemble_size": 1,
    "aggregation": "mean",
    "aggregation_subset": 2,
    "norm": "layer",
    "norm_epsilon": 1e-3,
    "use_bias": False,
    "kernel_initializer": "glorot_uniform",
    "input_layout": "h_z",
    "input_size": None,
}


def support_of(config: Dict) -> Dict:
    """The options a critic (or its config) gives its head."""
    return {key: config[key] for key in heads.SUPPORT}


def trunk_options_of(config: Dict) -> Dict:
    """The options a critic (or its config) gives its trunk."""
    return {key: config[key] for key in trunks.SHARED}


def upgrade_config(config: Dict) -> Tuple[Dict, Dict]:
    """A saved critic config as today's critic would write it, and the training options it carried.

    Configs written before the training options moved to `CriticTrainer`
    hold them; configs written before heads and ensembles lack those options
    (whose defaults are what they computed).
    """
    training = {k: config[k] for k in TRAINING_OPTIONS if k in config}
    config = {k: v for k, v in config.items() if k not in TRAINING_OPTIONS}
    if "input_layout" not in config:  # (an input_size given alone is a features critic's)
        config["input_layout"] = FEATURES if config.get("input_size") is not None else "h_z"
    for key, value in _ADDED_OPTIONS.items():
        config.setdefault(key, value)
    # 0.1.0 named the head and kept HL-Gauss's sigma beside it; the parts' specs now carry their options.
    config["head"] = heads.legacy_spec(config["head"], config.pop("hl_gauss_sigma", None))
    if all(config.get(key) is not None for key in heads.SUPPORT):
        config["head"] = heads.HEADS.canonical(config["head"], support_of(config))
    if all(key in config for key in trunks.SHARED):
        dims = get_model_dims(
            config["model_size"],
            num_dense_layers=config["num_dense_layers"],
            dense_hidden_units=config["dense_hidden_units"],
        )
        if None not in (dims["num_dense_layers"], dims["dense_hidden_units"]):
            config["trunk"] = trunks.TRUNKS.canonical(config["trunk"], trunk_options_of(config))
    return config, training


def resolve_input(input_layout, input_size, **latent_sizes) -> Tuple[str, Optional[int]]:
    """`(input_layout, input_size)` as the critic keeps them, else a `ValueError` naming the option.

    `input_layout=None` is `"features"` when `input_size` is given, else `"h_z"`. A features critic takes one
    input `x [..., input_size]` (`input_size=None`: its size from the first call) and none of `latent_sizes`
    (`gru_units`, `num_z_categoricals`, `num_z_classes`); an `(h, z)` critic no `input_size`.
    """
    if input_size is not None:
        input_size = integer("input_size", input_size)
    if input_layout is None:
        input_layout = FEATURES if input_size is not None else "h_z"
    if not isinstance(input_layout, str) or input_layout not in INPUT_LAYOUTS:
        raise ValueError(f"input_layout: got {input_layout!r}, expected one of {list(INPUT_LAYOUTS)} or None.")
    if input_layout != FEATURES and input_size is not None:
        raise ValueError(
            f"input_size: got {input_size!r} with input_layout={input_layout!r}, expected None: an (h, z) critic's "
            "input sizes are gru_units, num_z_categoricals and num_z_classes (input_layout='features', or None, "
            "for a critic of one feature vector x [..., input_size])."
        )
    if input_layout == FEATURES:
        for name, value in latent_sizes.items():
            if value is not None:
                raise ValueError(
                    f"{name}: got {value!r} for a features critic (input_layout='features'), expected None: its one "
                    "input is x [..., input_size]; give its size as input_size."
                )
    return input_layout, input_size


def call_inputs(input_layout: str, h, z) -> Tuple:
    """A critic's call arguments as the tuple of its inputs: `(h, z)` (from two arguments, or one `(h, z)` pair:
    Keras's `predict` passes `x` as one argument), or a features critic's `(x,)`, which takes no `z`."""
    if input_layout != FEATURES:
        return h_z_pair(h, z)
    if z is not None:
        got = repr(z) if isinstance(z, (bool, int, float, str)) else f"a {type(z).__name__}"
        raise ValueError(
            f"z: got {got}, expected none: a features critic (input_layout='features') takes one input, "
            "critic(x) with x [..., input_size] (use_ema by keyword: critic(x, use_ema=True))."
        )
    return (h,)


def latent_size(dims: Dict) -> int:
    """The width of the trunk's input for the sizes `dims` (a critic, its config or `check_options`'s dims);
    0 where a size is not known yet."""
    if dims.get("input_layout") == FEATURES:
        return int(dims.get("input_size") or 0)
    sizes = [dims.get(key) for key in LATENT_SIZES]
    return 0 if None in sizes else sizes[0] + sizes[1] * sizes[2]


def _machine_memory() -> Optional[int]:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def check_ensemble_fits(
    ensemble_size, *, latent_size, num_dense_layers, dense_hidden_units, output_units, use_bias, norm
) -> None:
    """Refuses an ensemble whose weights cannot fit in this machine's memory, before anything is allocated.

    The critic holds `2 * K * P` float32 numbers (fast and EMA copies of `K` members of `P` parameters:
    each hidden layer's kernel, bias, norm scale (and offset for "layer"), then the head's kernel and
    bias; an unknown input size counts as 0), `8 * K * P` bytes, and they are drawn member by member: more
    than the machine's physical memory cannot be held anywhere the critic runs from.
    """
    units, layers = int(dense_hidden_units or 0), int(num_dense_layers or 0)
    per_member, width = 0, int(latent_size or 0)
    for _ in range(layers):
        per_member += width * units + units * (int(bool(use_bias)) + (2 if norm == "layer" else 1))
        width = units
    per_member += width * output_units + output_units
    memory = _machine_memory()
    need = 8 * int(ensemble_size) * per_member
    if memory is not None and need > memory:
        most = max(memory // max(8 * per_member, 1), 1)
        raise ValueError(
            f"ensemble_size: got {ensemble_size!r}, expected at most {most} for this critic: its fast and EMA "
            f"copies of {ensemble_size} members of {per_member} parameters need {need:.3g} bytes of float32 "
            f"weights, more than this machine's {memory:.3g} bytes of memory."
        )


def check_ensemble_options(ensemble_size, aggregation, aggregation_subset):
    """Raises a `ValueError` for ensemble options outside their range."""
    integer("ensemble_size", ensemble_size)
    if not isinstance(aggregation, str) or aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation: got {aggregation!r}, expected one of {list(AGGREGATIONS)}.")
    integer("aggregation_subset", aggregation_subset)
    if aggregation == "min_of_random" and aggregation_subset > ensemble_size:
        raise ValueError(
            f"aggregation_subset: got {aggregation_subset} with ensemble_size={ensemble_size}, expected at most "
            "ensemble_size members to take the minimum of."
        )


def check_options(
    kwargs,
    *,
    model_size,
    num_buckets,
    lower_bound,
    upper_bound,
    ema_decay,
    bin_scheme,
    num_dense_layers,
    dense_hidden_units,
    gru_units,
    num_z_categoricals,
    num_z_classes,
    head,
    hl_gauss_sigma,
    trunk,
    ensemble_size,
    aggregation,
    aggregation_subset,
    norm,
    norm_epsilon,
    use_bias,
    kernel_initializer,
    input_layout,
    input_size=None,
):
    """Checks `CriticNetwork`'s arguments (and refuses the training options in Keras's `kwargs`).

    Returns:
        `(dims, (head_class, head_options), (trunk_class, trunk_options), kernel_initializer)`: the sizes
        `get_model_dims` resolves (a features critic's `(h, z)` sizes None) with the input's own,
        `input_layout` (resolved, see `resolve_input`) and `input_size`; each part's class and own options
        (see `multicritic.registry`), and the Keras initializer.
    """
    moved = [k for k in TRAINING_OPTIONS if k in kwargs]
    if moved:
        raise ValueError(
            f"{moved[0]}: a training option, now given to CriticTrainer (CriticTrainer(critic, {moved[0]}=...)), "
            "not to the critic."
        )
    input_layout, input_size = resolve_input(
        input_layout,
        input_size,
        gru_units=gru_units,
        num_z_categoricals=num_z_categoricals,
        num_z_classes=num_z_classes,
    )
    dims = get_model_dims(
        model_size,
        gru_units=gru_units,
        dense_hidden_units=dense_hidden_units,
        num_dense_layers=num_dense_layers,
        num_z_categoricals=num_z_categoricals,
        num_z_classes=num_z_classes,
    )
    if input_layout == FEATURES:
        dims.update(dict.fromkeys(LATENT_SIZES))
    dims.update(input_layout=input_layout, input_size=input_size)
    if hl_gauss_sigma is not None:
        number("hl_gauss_sigma", hl_gauss_sigma, low=0.0, low_open=True)
    support = dict(num_buckets=num_buckets, lower_bound=lower_bound, upper_bound=upper_bound, bin_scheme=bin_scheme)
    try:
        head_class, head_options = heads.HEADS.resolve(heads.legacy_spec(head, hl_gauss_sigma), support)
    except ValueError as err:
        if hl_gauss_sigma is not None and str(err).startswith("sigma:"):
            raise ValueError(f"hl_gauss_sigma:{str(err)[len('sigma:') :]}") from None
        raise
    number("ema_decay", ema_decay, low=0.0, high=1.0)
    check_ensemble_options(ensemble_size, aggregation, aggregation_subset)
    if not isinstance(norm, str) or norm not in NORMS:
        raise ValueError(f"norm: got {norm!r}, expected one of {list(NORMS)}.")
    try:
        kernel_initializer = keras.initializers.get(kernel_initializer)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"kernel_initializer: got {kernel_initializer!r}, expected a Keras initializer (an "
            f"instance, a name or a config) ({err})."
        ) from None
    trunk_part = trunks.TRUNKS.resolve(
        trunk,
        dict(
            model_size=model_size,
            num_dense_layers=dims["num_dense_layers"],
            dense_hidden_units=dims["dense_hidden_units"],
            norm=norm,
            norm_epsilon=norm_epsilon,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
        ),
    )
    check_ensemble_fits(
        ensemble_size,
        latent_size=latent_size(dims),
        num_dense_layers=dims["num_dense_layers"],
        dense_hidden_units=dims["dense_hidden_units"],
        output_units=head_class(**head_options, **support).units,
        use_bias=use_bias,
        norm=norm,
    )
    return dims, (head_class, head_options), trunk_part, kernel_initializer
