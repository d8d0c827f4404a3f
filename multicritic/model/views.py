"""The critic as PyTorch `nn.Module`s: the methods `CriticNetwork` gives hosts' training code.

The views themselves are the PyTorch backend's (`multicritic.backend.torch_views`): modules holding the
critic's own tensors, so that a host's optimizer, `state_dict()` and soft updates act on the critic.
"""

from __future__ import annotations

from typing import List

from multicritic.backend import contract
from multicritic.math import ema


# On PyTorch the critic is itself a `torch.nn.Module`, and torch calls its module methods on it (`half()` calls
# `self._apply`): the backend's base class gives the critic its views' (dtype conversions refused, the slow critic
# never requiring gradients, all-or-nothing loads).
class ModuleViews(contract.current().critic_module_methods):
    """`fast_module`, `ema_module`, `torch_module` and `view_names` of a critic (a mixin of `CriticNetwork`)."""

    def fast_module(self, outputs: str = "logits", layout=None):
        """A PyTorch `nn.Module` holding only the fast critic's parameters (the critic's own tensors).

        For a host's optimizer and soft-update code: `fast_module()` and
        `ema_module()` list their parameters in the same order under the same
        names (`mlp_dense_0_kernel`, ..., Keras's `[in, out]` layout), and the
        EMA view's do not require gradients. `forward(latent)` (or
        `forward(h, z)`; a features critic's `forward(x)`) returns the logits (`outputs="logits"`, as sheeprl's,
        NM512's and TorchRL's critics), the symlog value (`"value"`) or both
        (`"both"`). `layout`: `[(name, variable, transpose), ...]`, a host's
        parameter names, order and shapes (`multicritic.interop`'s
        `*_modules` give them), so that the module's `state_dict()` and an
        optimizer's state over it are the host's own critic's. PyTorch
        backend only.
        """
        return contract.current().module_view(self, use_ema=False, outputs=outputs, layout=layout)

    def ema_module(self, outputs: str = "logits", layout=None):
        """`fast_module`'s twin holding only the EMA (slow, target) critic's parameters."""
        return contract.current().module_view(self, use_ema=True, outputs=outputs, layout=layout)

    def torch_module(self, layout=None):
        """The whole critic as one PyTorch `nn.Module` with the interface of RLlib's PyTorch `CriticNetwork`:
        `forward(h, z=None, return_logits=False, use_ema=False)` (the symlog value, and the logits; `z=None`:
        `h` is a flat latent, a features critic's `x`), `init_ema()`, `update_ema()`; `fast` and `ema` views as
        submodules, so `parameters()` lists the fast weights then the frozen EMA copy. `layout`: `(fast, ema)`
        layouts (see `fast_module`), whose names the module's own parameters take. PyTorch backend only."""
        return contract.current().module_view(self, use_ema=None, outputs="both", layout=layout)

    def view_names(self) -> List[str]:
        """The parameter names of `fast_module()` / `ema_module()`, in the order of `fast_weights`."""
        keys = ema.relative_keys(self.fast_weights, ("mlp", "mlp"), ("return_layer", "head"))
        return [key.replace("/", "_") for key in keys]
