"""The critic's value heads, registered by the name the critic's `head` option takes.

`HEADS` maps each name to its class, imported on first use (the names are read
before Keras is imported). A new head is one module plus its line here.
"""

from multicritic.registry import Registry, declare

# Options the critic gives every head: the value support.
SUPPORT = ("num_buckets", "lower_bound", "upper_bound", "bin_scheme")
"""The options the critic gives every head (the value support); a head's own options are the rest."""

HEADS = Registry(
    "head",
    {
        "two_hot": declare("multicritic.heads.two_hot:TwoHotHead"),
        "hl_gauss": declare("multicritic.heads.hl_gauss:HLGaussHead", bin_schemes=("uniform_symlog",)),
        "mse": declare("multicritic.heads.mse:MSEHead"),
        "quantile": declare("multicritic.heads.quantile:QuantileHead"),
        "adaptive": declare("multicritic.heads.adaptive:AdaptiveSupportHead", bin_schemes=("uniform_symlog",)),
    },
    shared=SUPPORT,
)
"""The value heads by the name `CriticNetwork(head=...)` takes (`two_hot` is the reference's); the docs' Parts
page lists them with their options."""

# What the package exports besides the registered heads' classes: their base and the reference's old name.
_EXTRA_EXPORTS = {"ValueHead": "multicritic.heads.base", "RewardPredictorLayer": "multicritic.heads.two_hot"}


def __getattr__(name):
    # The classes load with Keras, on first use: `HEADS`'s names are read before Keras is imported.
    module = {**HEADS.modules(), **_EXTRA_EXPORTS}.get(name)
    if module is not None:
        import importlib

        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'multicritic.heads' has no attribute {name!r}")


def get(name):
    """The head class registered as `name`, else a `ValueError` naming `head`."""
    return HEADS[HEADS.checked_name(name)]


def legacy_spec(head, hl_gauss_sigma=None):
    """The spec a config written by 0.1.0 meant: `head` a name, with the critic's `hl_gauss_sigma` option
    (since moved into `HLGaussHead(sigma=...)`)."""
    if not isinstance(head, str):
        return head
    options = {} if hl_gauss_sigma is None or head != "hl_gauss" else {"sigma": float(hl_gauss_sigma)}
    return {"class_name": head, "config": options}


__all__ = ["HEADS", "SUPPORT", "get", "legacy_spec", *_EXTRA_EXPORTS, *HEADS.modules()]
