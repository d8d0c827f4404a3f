"""Weights in and out of NM512/r2dreamer's critic (`Dreamer.value` and `_slow_value`).

Checked against commit 546e4fab8146ea4b14e1d7726bbc1a8a1d50322f
(`tests/data/interop/r2dreamer/`, written by running that code; r2dreamer is
not on PyPI). r2dreamer (ICLR 2026) is NM512's active codebase; its older
dreamerv3-torch is `multicritic.interop.nm512`.

Source layout: `networks.MLPHead(config.critic, feat_size)`, whose
`state_dict()` holds `mlp.layers.value_linear{i}.weight` `[units, in]` and
`.bias` (`nn.Linear` with bias), `mlp.layers.value_norm{i}.weight`
(`nn.RMSNorm(eps=1e-4)`, no offset) and the head `last.weight` `[255, units]`
/ `last.bias`. Linear weights are transposed to Keras kernels. Per layer:
Linear -> RMSNorm -> SiLU, 3 layers of the model's `units` (256 at size12M);
hidden weights `tools.weight_init_` (fan-in truncated normal, as the
official code), biases 0, the head scaled by `outscale=0` (all zero). The
feature is `rssm.get_feat(stoch, deter) = cat([flatten(stoch), deter])`: z
first, our `input_layout="z_h"`. `symexp_twohot`: 255 bins
`symexp(linspace(-20, 0, 128))` mirrored, `mode()` the probability-weighted
bin: our `bin_scheme="symexp"` (the official 2024 code's). The agent's
`state_dict()` (its checkpoint's `agent_state_dict`) holds both under
`value.` and `_slow_value.`; either form loads. Keys prefixed by a
torch.compile / DDP / Fabric wrapper (`_orig_mod.`, `module.`,
`_forward_module.`) are accepted.

The slow critic (`_slow_value`, a deepcopy at construction) is mixed with
fraction 0.02 every `slow_target_update` (1) updates, BEFORE each update's
loss (`Dreamer.update` calls `_update_slow_target` first), from the first
one on: `critic.update_ema(tau=0.02)` before the step
(`CriticTrainer(..., ema_update_first=True)`). The value loss is
`mean(weight * (-log_prob(target) - log_prob(slow.mode())))`:
`critic_loss(logits, target, None, weight, ema_logits=slow_logits)`; the
replay value loss (`repval`, scale 0.3) is the same on replayed features with
the targets of `multicritic.math.returns.replay_lambda_returns` (time-major;
r2dreamer's `_lambda_return` is batch-major).
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

from multicritic.interop import _common
from multicritic.interop.state_dicts import StateDictHost

CRITIC_OPTIONS = dict(input_layout="z_h", **_common.ARCHITECTURE_2024, **_common.TRUNC_NORMAL_IN)
_HOST = StateDictHost(
    "r2dreamer",
    "r2dreamer",
    CRITIC_OPTIONS,
    layers="mlp.layers.value",  # `networks.MLPHead`'s MLP
    head="last",
    checked=dict(input_layout="z_h", **_common.ARCHITECTURE_2024),
    # Where the agent's state dict holds the critic and its slow copy (`Dreamer.value`, `Dreamer._slow_value`).
    agent_prefixes=("value.", "_slow_value."),
)


def load_r2dreamer(
    critic, value_state: Mapping, slow_value_state: Optional[Mapping] = None, member: Optional[int] = None
) -> None:
    """Loads `Dreamer.value.state_dict()` (and `_slow_value.state_dict()`; without it the EMA copy becomes the
    fast critic), or the whole `Dreamer.state_dict()` holding both, into `critic`, all or nothing."""
    _HOST.load(critic, value_state, slow_value_state, member)


def export_r2dreamer(critic, member: Optional[int] = None) -> Tuple[Dict[str, object], Dict[str, object]]:
    """`(value_state, slow_value_state)`: numpy state dicts for `Dreamer.value` / `_slow_value`
    (`load_state_dict` takes them after `torch.as_tensor`; the agent's frozen copies share those parameters'
    storage, so loading into `agent.value` updates them too)."""
    return _HOST.export(critic, member)


def r2dreamer_critic(
    value_state, slow_value_state=None, *, gru_units: int, num_z_categoricals: int, num_z_classes: int, **kwargs
):
    """A `CriticNetwork` of r2dreamer's critic size, loaded from the critic's (and slow critic's) state dicts or
    the agent's (`gru_units` = `rssm.deter`, `num_z_categoricals` = `rssm.stoch`, `num_z_classes` =
    `rssm.discrete`)."""
    sizes = dict(gru_units=gru_units, num_z_categoricals=num_z_categoricals, num_z_classes=num_z_classes)
    return _HOST.build(value_state, slow_value_state, **sizes, **kwargs)


def r2dreamer_modules(critic, outputs: str = "logits"):
    """The critic as r2dreamer's `Dreamer.value` and `_slow_value` modules, in r2dreamer's checkpoint layout.

    Two `torch.nn.Module` views of `critic`'s own tensors whose parameters
    are named, ordered and shaped as r2dreamer's `networks.MLPHead` critic
    (`mlp.layers.value_linear0.weight` `[units, in]`, ..., `last.bias`):
    `state_dict()`, `load_state_dict()` and a `torch.optim` optimizer's
    state over `parameters()` are those of r2dreamer's critic.
    `forward(feat)` returns logits, not r2dreamer's `TwoHot`: wrap them
    (`distributions.symexp_twohot(logits, 255)`) where r2dreamer expects a
    distribution. PyTorch backend only. `critic`: a built single
    `CriticNetwork` with `CRITIC_OPTIONS` (`r2dreamer_critic` builds one from
    r2dreamer's or its agent's state dicts); `outputs`, the pair returned
    (`(value, slow_value)`) and the errors: `StateDictHost.modules`.

    Examples:
        >>> ours = r2dreamer_critic(agent.state_dict(), gru_units=..., num_z_categoricals=..., num_z_classes=...)
        >>> value, slow_value = r2dreamer_modules(ours)
    """
    return _HOST.modules(critic, outputs)


ADAPTER = _HOST.adapter(
    "r2dreamer", "NM512/r2dreamer", load_r2dreamer, export_r2dreamer, r2dreamer_critic, r2dreamer_modules
)
