"""Weights in and out of NM512/dreamerv3-torch's critic (`ImagBehavior.value` and `_slow_value`).

Checked against commit 6ef8646d807cd10ce0c88e10a7e943211e7fc44c
(`tests/data/interop/nm512/`, written by running that code; NM512 is not on
PyPI).

Source layout: `networks.MLP(..., name="Value")`, whose `state_dict()` holds
`layers.Value_linear{i}.weight` `[units, in]` (`nn.Linear(bias=False)`),
`layers.Value_norm{i}.weight` / `.bias` (`nn.LayerNorm(eps=1e-3)`) and the
head `mean_layer.weight` `[255, units]` / `mean_layer.bias` (zero-initialised,
`outscale=0`). Linear weights are transposed to Keras kernels. Per layer:
Linear -> LayerNorm -> SiLU (2 layers of the global `units`, 512, by
default); hidden weights `tools.weight_init` (truncated normal, std
`sqrt(1 / mean(fan_in, fan_out)) / 0.8796`), LayerNorm weight 1, bias 0. The
feature is `get_feat(state) = cat([flatten(stoch), deter])`: z first, our
`input_layout="z_h"`. `DiscDist`: 255 buckets
`linspace(-20, 20)` in symlog space, `mean()` = `mode()` =
`symexp(sum(probs * buckets))`: our `bin_scheme="uniform_symlog"`. Keys
prefixed by a torch.compile / DDP / Fabric wrapper (`_orig_mod.`, `module.`,
`_forward_module.`) are accepted.

The slow critic (`_slow_value`, a deepcopy at construction) is mixed with
fraction 0.02 every `slow_target_update` (1) updates, BEFORE each update's
loss, from the first one on: `critic.update_ema(tau=0.02)` before the step
(`CriticTrainer(..., ema_update_first=True)`). The value loss is
`mean(weights * (-log_prob(target) - log_prob(slow.mode())))`:
`critic_loss(logits, target, None, weights, ema_logits=slow_logits)`.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

from multicritic.interop import _common
from multicritic.interop.state_dicts import StateDictHost

CRITIC_OPTIONS = dict(input_layout="z_h", **_common.ARCHITECTURE_2023)
_HOST = StateDictHost("nm512", "NM512", CRITIC_OPTIONS, layers="layers.Value", head="mean_layer")


def load_nm512(
    critic, value_state: Mapping, slow_value_state: Optional[Mapping] = None, member: Optional[int] = None
) -> None:
    """Loads `ImagBehavior.value.state_dict()` (and `_slow_value.state_dict()`; without it the EMA copy
    becomes the fast critic) into `critic`, all or nothing (keys prefixed by a torch.compile / DDP / Fabric
    wrapper are accepted)."""
    _HOST.load(critic, value_state, slow_value_state, member)


def export_nm512(critic, member: Optional[int] = None) -> Tuple[Dict[str, object], Dict[str, object]]:
    """`(value_state, slow_value_state)`: numpy state dicts for `ImagBehavior.value` / `_slow_value`
    (`load_state_dict` takes them after `torch.as_tensor`)."""
    return _HOST.export(critic, member)


def nm512_critic(
    value_state, slow_value_state=None, *, gru_units: int, num_z_categoricals: int, num_z_classes: int, **kwargs
):
    """A `CriticNetwork` of NM512's critic size, loaded (`gru_units` = `dyn_deter`, `num_z_categoricals` =
    `dyn_stoch`, `num_z_classes` = `dyn_discrete`)."""
    sizes = dict(gru_units=gru_units, num_z_categoricals=num_z_categoricals, num_z_classes=num_z_classes)
    return _HOST.build(value_state, slow_value_state, **sizes, **kwargs)


def nm512_modules(critic, outputs: str = "logits"):
    """The critic as NM512's `ImagBehavior.value` and `_slow_value` modules, in NM512's checkpoint layout.

    Two `torch.nn.Module` views of `critic`'s own tensors whose parameters
    are named, ordered and shaped as NM512's `networks.MLP(name="Value")`
    (`layers.Value_linear0.weight` `[units, in]`, ..., `mean_layer.bias`):
    `state_dict()`, `load_state_dict()` and a `torch.optim` optimizer's state
    over `parameters()` are those of NM512's critic, so an agent checkpoint
    (`agent.state_dict()`, the optimizers' state dicts) written with the swap
    loads into NM512's agent and one written by it loads with the swap.
    `forward(feat)` returns logits, not NM512's `DiscDist`: wrap them where
    NM512 expects a distribution. PyTorch backend only. `critic`: a built
    single `CriticNetwork` with `CRITIC_OPTIONS` (`nm512_critic` builds one
    from NM512's state dicts); `outputs`, the pair returned and the errors:
    `StateDictHost.modules`.

    Examples:
        >>> ours = nm512_critic(behavior.value.state_dict(), behavior._slow_value.state_dict(),
        ...                     gru_units=..., num_z_categoricals=..., num_z_classes=...)
        >>> value, slow_value = nm512_modules(ours)
    """
    return _HOST.modules(critic, outputs)


ADAPTER = _HOST.adapter("nm512", "NM512/dreamerv3-torch", load_nm512, export_nm512, nm512_critic, nm512_modules)
