"""Weights in and out of sheeprl's DreamerV3 critic and target critic (sheeprl 0.8.4).

Checked against sheeprl==0.8.4 (torch 2.13.0): live in the `interop` nox
session (`tests/interop/test_upstream_live.py`) and through the goldens its
code wrote (`tests/data/interop/sheeprl_goldens.npz`).

Source layout: `sheeprl.models.models.MLP` built by
`sheeprl/algos/dreamer_v3/agent.py` `build_agent`: `_model.{3i}.weight`
`[units, in]` (Linear without bias), `_model.{3i+1}.weight` / `.bias`
(LayerNorm, epsilon 1e-3), SiLU at `_model.{3i+2}`, then the head
`_model.{3L}.weight` `[255, units]` / `.bias` (zero-initialised). Linear
weights are transposed to Keras kernels. Hidden weights: truncated normal.
The latent is `cat([flatten(stochastic_state), recurrent_state])`: z first,
our `input_layout="z_h"`. `TwoHotEncodingDistribution`: 255 bins
`linspace(-20, 20)` in symlog space, `mean` = `symexp(sum(p * b))`: our
`bin_scheme="uniform_symlog"`. Keys prefixed by a torch.compile / Fabric /
DDP wrapper (`_orig_mod.`, `_forward_module.`, `module.`) are accepted.

`target_critic` is a deepcopy of the critic. Before each `train()` every
`per_rank_target_network_update_freq` gradient steps, sheeprl mixes
`tau = 1 if step == 0 else 0.02`:
`critic.update_ema(tau=0.02, step=step, period=freq)`. Its value loss
`mean((-log_prob(lambda) - log_prob(target.mean)) * discount)` is
`critic_loss(logits, lambda_values, None, discount, ema_logits=target_logits)`.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

from multicritic.interop import _common

CRITIC_OPTIONS = dict(input_layout="z_h", **_common.ARCHITECTURE_2023)
_BUILDER = "CriticNetwork(..., **multicritic.interop.sheeprl.CRITIC_OPTIONS)"


def _key(kind: str, i: int) -> str:
    return {
        "kernel": f"_model.{3 * i}.weight", "scale": f"_model.{3 * i + 1}.weight",
        "offset": f"_model.{3 * i + 1}.bias", "head_kernel": f"_model.{3 * i}.weight",
        "head_bias": f"_model.{3 * i}.bias",
    }[kind]


def _layout(critic):
    _common.check_options(critic, "sheeprl", CRITIC_OPTIONS, _BUILDER)
    return _common.entries(critic, _key, transpose=True)


def load_sheeprl(critic, critic_state: Mapping, target_critic_state: Optional[Mapping] = None,
                 member: Optional[int] = None) -> None:
    """Loads sheeprl's `critic.state_dict()` (and `target_critic.state_dict()`; without it the EMA copy
    becomes the critic, as sheeprl's deepcopy) into `critic`, all or nothing (a sheeprl checkpoint holds them
    as `state["critic"]` and `state["target_critic"]`)."""
    _common.load(critic, _layout(critic), {"critic_state": _common.unwrap(critic_state),
                                           "target_critic_state": _common.unwrap(target_critic_state)}, member)


def export_sheeprl(critic, member: Optional[int] = None) -> Tuple[Dict[str, object], Dict[str, object]]:
    """`(critic_state, target_critic_state)`: numpy state dicts for sheeprl's critic and target critic."""
    return _common.export(critic, _layout(critic), member)


def sheeprl_critic(critic_state: Mapping, target_critic_state: Optional[Mapping] = None, *, gru_units: int,
                   num_z_categoricals: int, num_z_classes: int, **kwargs):
    """A `CriticNetwork` of sheeprl's critic size, loaded (`gru_units` = `recurrent_state_size`,
    `num_z_categoricals` = `stochastic_size`, `num_z_classes` = `discrete_size`)."""
    return _common.build(lambda critic: load_sheeprl(critic, critic_state, target_critic_state), _key, True,
                         _common.unwrap(critic_state), gru_units=gru_units, num_z_categoricals=num_z_categoricals,
                         num_z_classes=num_z_classes, options=CRITIC_OPTIONS, what="critic_state", **kwargs)
