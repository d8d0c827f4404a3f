"""DreamerV3 model sizes (Hafner et al. 2023, Appendix B, plus RLlib's debug sizes)."""

from __future__ import annotations

from typing import Dict, Optional

from multicritic.validation import integer

# name: (gru_units, dense_hidden_units, num_dense_layers, num_z_categoricals,
#        num_z_classes). "nano".."XXS" are RLlib's small debug sizes.
_MODEL_DIMS = {
    "nano": (16, 16, 1, 4, 4),
    "micro": (32, 32, 1, 8, 8),
    "mini": (64, 64, 1, 16, 16),
    "XXS": (128, 128, 1, 32, 32),
    "XS": (256, 256, 1, 32, 32),
    "S": (512, 512, 2, 32, 32),
    "M": (1024, 640, 3, 32, 32),
    "L": (2048, 768, 4, 32, 32),
    "XL": (4096, 1024, 5, 32, 32),
}
_KEYS = (
    "gru_units",
    "dense_hidden_units",
    "num_dense_layers",
    "num_z_categoricals",
    "num_z_classes",
)

MODEL_SIZES = tuple(_MODEL_DIMS)

# The official 2024 code's sizes (danijar/dreamerv3 configs.yaml, `size1m` ... `size400m`): its critic input is
# the RSSM's deter state and 32 categoricals of `classes`, its value MLP 3 layers of `units`.
OFFICIAL_2024_SIZES = {
    "1m": (512, 64, 3, 32, 4),
    "12m": (2048, 256, 3, 32, 16),
    "25m": (3072, 384, 3, 32, 24),
    "50m": (4096, 512, 3, 32, 32),
    "100m": (6144, 768, 3, 32, 48),
    "200m": (8192, 1024, 3, 32, 64),
    "400m": (12288, 1536, 3, 32, 96),
}


def official_2024_dims(size: str) -> Dict[str, int]:
    """The critic dimensions of an official 2024 size (`"1m"` ... `"400m"`; `"200m"` is its default)."""
    if size not in OFFICIAL_2024_SIZES:
        raise ValueError(f"size: got {size!r}, expected one of {list(OFFICIAL_2024_SIZES)}.")
    return dict(zip(_KEYS, OFFICIAL_2024_SIZES[size]))


def get_model_dims(model_size: Optional[str], **overrides: Optional[int]) -> Dict[str, Optional[int]]:
    """Returns the network dimensions of a DreamerV3 model size.

    Args:
        model_size: one of `"nano"`, `"micro"`, `"mini"`, `"XXS"`, `"XS"`,
            `"S"`, `"M"`, `"L"`, `"XL"`, or `None` (every dimension then
            comes from `overrides` and is `None` where none is given).
        **overrides: explicit values for any of `gru_units`,
            `dense_hidden_units`, `num_dense_layers`, `num_z_categoricals`,
            `num_z_classes`; a value of `None` keeps the size's default.

    Returns:
        A dict with the five keys above.

    Raises:
        ValueError: for an unknown `model_size`, an unknown override name, or
            a non-positive override.
    """
    unknown = set(overrides) - set(_KEYS)
    if unknown:
        raise ValueError(f"get_model_dims: unknown dimension(s) {sorted(unknown)}; expected some of {list(_KEYS)}.")
    if model_size is None:
        dims = dict.fromkeys(_KEYS)
    elif isinstance(model_size, str) and model_size in _MODEL_DIMS:
        dims = dict(zip(_KEYS, _MODEL_DIMS[model_size]))
    else:
        raise ValueError(f"model_size: got {model_size!r}, expected one of {list(MODEL_SIZES)} or None.")
    for key, value in overrides.items():
        if value is None:
            continue
        dims[key] = integer(key, value)
    return dims
