"""The critic's trunks (the network between the state and the head), registered by the name the critic's
`trunk` option takes.

`TRUNKS` maps each name to its class, imported on first use (the names are
read before Keras is imported). A new trunk is one module plus its line here.
"""

from multicritic.registry import Registry, declare

# Options the critic gives every trunk: its sizes and normalisation.
SHARED = (
    "model_size",
    "num_dense_layers",
    "dense_hidden_units",
    "norm",
    "norm_epsilon",
    "use_bias",
    "kernel_initializer",
)
"""The options the critic gives every trunk (its sizes and normalisation); a trunk's own options are the rest."""

TRUNKS = Registry(
    "trunk",
    {
        "mlp": declare("multicritic.layers.mlp:MLP"),
        "residual": declare("multicritic.trunks.residual:ResidualTrunk"),
        "simba_v2": declare("multicritic.trunks.simba_v2:SimbaV2Trunk"),
        "xqc": declare("multicritic.trunks.xqc:XQCTrunk"),
    },
    shared=SHARED,
)
"""The trunks by the name `CriticNetwork(trunk=...)` takes (`mlp` is the reference's); the docs' Parts page lists
them with their options."""


def __getattr__(name):
    # The classes load with Keras, on first use: `TRUNKS`'s names are read before Keras is imported.
    module = TRUNKS.modules().get(name)
    if module is not None:
        import importlib

        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'multicritic.trunks' has no attribute {name!r}")


__all__ = ["SHARED", "TRUNKS", *TRUNKS.modules()]
