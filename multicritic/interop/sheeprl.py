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
from multicritic.interop.adapter import HostAdapter

CRITIC_OPTIONS = dict(input_layout="z_h", **_common.ARCHITECTURE_2023)
_BUILDER = "CriticNetwork(..., **multicritic.interop.sheeprl.CRITIC_OPTIONS)"


def _key(kind: str, i: int) -> str:
    return {
        "kernel": f"_model.{3 * i}.weight",
        "scale": f"_model.{3 * i + 1}.weight",
        "offset": f"_model.{3 * i + 1}.bias",
        "head_kernel": f"_model.{3 * i}.weight",
        "head_bias": f"_model.{3 * i}.bias",
    }[kind]


def _layout(critic):
    _common.check_options(critic, "sheeprl", CRITIC_OPTIONS, _BUILDER)
    return _common.entries(critic, _key, transpose=True)


def load_sheeprl(
    critic, critic_state: Mapping, target_critic_state: Optional[Mapping] = None, member: Optional[int] = None
) -> None:
    """Loads sheeprl's `critic.state_dict()` (and `target_critic.state_dict()`; without it the EMA copy
    becomes the critic, as sheeprl's deepcopy) into `critic`, all or nothing (a sheeprl checkpoint holds them
    as `state["critic"]` and `state["target_critic"]`)."""
    _common.load(
        critic,
        _layout(critic),
        {"critic_state": _common.unwrap(critic_state), "target_critic_state": _common.unwrap(target_critic_state)},
        member,
    )


def export_sheeprl(critic, member: Optional[int] = None) -> Tuple[Dict[str, object], Dict[str, object]]:
    """`(critic_state, target_critic_state)`: numpy state dicts for sheeprl's critic and target critic."""
    return _common.export(critic, _layout(critic), member)


def sheeprl_critic(
    critic_state: Mapping,
    target_critic_state: Optional[Mapping] = None,
    *,
    gru_units: int,
    num_z_categoricals: int,
    num_z_classes: int,
    **kwargs,
):
    """A `CriticNetwork` of sheeprl's critic size, loaded (`gru_units` = `recurrent_state_size`,
    `num_z_categoricals` = `stochastic_size`, `num_z_classes` = `discrete_size`)."""
    return _common.build(
        lambda critic: load_sheeprl(critic, critic_state, target_critic_state),
        _key,
        True,
        _common.unwrap(critic_state),
        gru_units=gru_units,
        num_z_categoricals=num_z_categoricals,
        num_z_classes=num_z_classes,
        options=CRITIC_OPTIONS,
        what="critic_state",
        **kwargs,
    )


def sheeprl_modules(critic, outputs: str = "logits"):
    """The critic as sheeprl's `critic` and `target_critic` modules, in sheeprl's own checkpoint layout.

    Two `torch.nn.Module` views of `critic`'s own tensors (`fast_module` /
    `ema_module` with sheeprl's layout): parameters named, ordered and
    shaped as sheeprl's MLP (`_model.0.weight` `[units, in]`, ...), so that
    `state_dict()`, `load_state_dict()` and a `torch.optim` optimizer's state
    over `parameters()` are those of sheeprl's own critic. A sheeprl
    checkpoint written with the swap holds sheeprl's keys (sheeprl's critic
    loads it, `checkpoint.resume_from` resumes with or without the swap), and
    one written without it loads into these views. A host optimizer's step,
    `load_state_dict` and sheeprl's target update (`tcp.data.copy_(...)` over
    zipped parameters) change `critic`. PyTorch backend only.

    Args:
        critic: a built single `CriticNetwork` with `CRITIC_OPTIONS`
            (`sheeprl_critic` builds one from sheeprl's state dicts).
        outputs: what `forward(latent)` returns: `"logits"` (as sheeprl's
            critic), `"value"` (symlog) or `"both"`.

    Returns:
        `(critic_module, target_critic_module)`: the fast critic (trainable)
        and the EMA copy (no gradients).

    Raises:
        ValueError: when `critic` is not a built single critic of sheeprl's
            architecture, or not on the PyTorch backend.

    Example (in sheeprl's DreamerV3, after `build_agent(...)` returned
    `critic` and `target_critic`):
        >>> ours = sheeprl_critic(critic.module.state_dict(), target_critic.state_dict(),
        ...                       gru_units=..., num_z_categoricals=..., num_z_classes=...)
        >>> critic_module, target_module = sheeprl_modules(ours)
        >>> critic, target_critic = setup_module(fabric, critic_module), setup_module(fabric, target_module)
    """
    fast, ema = _common.view_layouts(critic, _layout(critic))
    return critic.fast_module(outputs=outputs, layout=fast), critic.ema_module(outputs=outputs, layout=ema)


ADAPTER = HostAdapter(
    name="sheeprl",
    title="sheeprl 0.8.4",
    options=CRITIC_OPTIONS,
    load=lambda critic, state, member=None: load_sheeprl(critic, *state, member=member),
    export=export_sheeprl,
    build=lambda state, **sizes: sheeprl_critic(*state, **sizes),
    modules=sheeprl_modules,
    key=_key,
)
