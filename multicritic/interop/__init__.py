"""Weights in and out of the DreamerV3 critics people run: one module per codebase.

`rllib` (RLlib's TensorFlow and PyTorch critics), `sheeprl`, `dreamerv3` (the
official JAX code), `nm512` (NM512/dreamerv3-torch), `r2dreamer` (NM512/r2dreamer)
and `torchrl`. Each has
`load_*(critic, ...)` / `export_*(critic, ...)` for the fast and the slow
(EMA, target) critic, all or nothing, and `CRITIC_OPTIONS`: the
`CriticNetwork` options that reproduce the codebase's forward pass.

`HOSTS` gives each as a `HostAdapter` with one interface (`load`, `export`,
`build`, `modules`, `key`, `options`), imported on first use: what the tests,
the docs' host table and `multicritic check` loop over. A new host is one
module (ending in its `ADAPTER`) plus its line here, and its goldens.
"""

from multicritic.registry import Registry, declare

HOSTS = Registry(
    "host",
    {
        "rllib": declare("multicritic.interop.rllib:ADAPTER"),
        "rllib_torch": declare("multicritic.interop.rllib:TORCH_ADAPTER"),
        "sheeprl": declare("multicritic.interop.sheeprl:ADAPTER"),
        "dreamerv3": declare("multicritic.interop.dreamerv3:ADAPTER"),
        "nm512": declare("multicritic.interop.nm512:ADAPTER"),
        "r2dreamer": declare("multicritic.interop.r2dreamer:ADAPTER"),
        "torchrl": declare("multicritic.interop.torchrl:ADAPTER"),
    },
    shared=(),
)
"""The host codebases by name, each a `HostAdapter` (see `multicritic.interop.adapter`)."""

__all__ = ["HOSTS"]
