"""Weights in and out of TorchRL's DreamerV3 value model and its slow copy (torchrl 0.14.1).

Checked against torchrl==0.14.1 (tensordict 0.14.3, torch 2.13.0): live in
the `interop` nox session and through the goldens its code wrote
(`tests/data/interop/torchrl_goldens.npz`).

Source layout: the value model of TorchRL's DreamerV3
(`TensorDictSequential(DreamerV3MLP(in_keys=["belief", "state"]), ...,
SymExpTwoHot)`), whose `state_dict()` holds
`module.0.module.model.{3i}.weight` `[units, in]` / `.bias` (Linear with
bias), `module.0.module.model.{3i+1}.weight` (RMSNorm scale, epsilon 1e-4,
no offset), SiLU at `{3i+2}`, the head `module.0.module.model.{3L}.weight`
`[255, units]` / `.bias` (scaled by `outscale=0`), and the buffer
`module.2.module.bins` (255 bins `symexp(linspace(-20, 20))`, checked
against ours, not a weight). Linear weights are transposed to Keras kernels;
hidden weights are fan-in truncated normals (as the official code). The
input is `cat([belief, state])`: h first, our `input_layout="h_z"`.
`DreamerV3ValueLoss(value_loss="two_hot", slow_critic_regularization=1.0)`'s
state dict holds the same keys under `value_model_params.` and
`target_value_model_params.`; either form loads. Keys prefixed by a
torch.compile / DDP / Fabric wrapper (`_orig_mod.`, `module.`,
`_forward_module.`) are accepted.

The slow copy: `SoftUpdate(loss, tau=0.02)` copies on construction, then
`target.lerp_(source, tau)` after each optimizer step:
`critic.update_ema(tau=0.02)` after the step.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

import numpy as np

from multicritic.math.bins import bucket_values
from multicritic.interop import _common
from multicritic.interop.adapter import HostAdapter

CRITIC_OPTIONS = dict(input_layout="h_z", **_common.ARCHITECTURE_2024, **_common.TRUNC_NORMAL_IN)
_CHECKED = dict(input_layout="h_z", **_common.ARCHITECTURE_2024)
_BUILDER = "CriticNetwork(..., **multicritic.interop.torchrl.CRITIC_OPTIONS)"
_PREFIX = "module.0.module.model."
BINS_KEY = "module.2.module.bins"
_LOSS_PREFIXES = ("value_model_params.", "target_value_model_params.")


def _key(kind: str, i: int) -> str:
    return (
        _PREFIX
        + {
            "kernel": f"{3 * i}.weight",
            "bias": f"{3 * i}.bias",
            "scale": f"{3 * i + 1}.weight",
            "head_kernel": f"{3 * i}.weight",
            "head_bias": f"{3 * i}.bias",
        }[kind]
    )


def _layout(critic):
    _common.check_options(critic, "TorchRL", _CHECKED, _BUILDER)
    return _common.entries(critic, _key, transpose=True)


def _own_layout(state) -> bool:
    """Whether `state`'s keys are TorchRL's own (which start with `module.`, as a DDP wrapper's do)."""
    return any(isinstance(k, str) and k.startswith((_PREFIX, BINS_KEY) + _LOSS_PREFIXES) for k in state)


def _unwrap(state):
    """`state` without the prefixes of torch.compile / DDP / Fabric wrappers around TorchRL's modules."""
    return _common.unwrap(state, unwrapped=_own_layout)


def _weights(critic, state, what):
    """`state` without its bins buffer, after checking the bins are this critic's."""
    if state is None or not isinstance(state, Mapping) or BINS_KEY not in state:
        return state
    try:
        bins = _common.host_array(state[BINS_KEY])
    except (TypeError, ValueError) as err:
        raise ValueError(f"{what}: {BINS_KEY}: got an object that is not a number array ({err}).") from None
    if bins.dtype.kind not in "fiu":
        raise ValueError(f"{what}: {BINS_KEY}: got dtype {bins.dtype}, expected a real number array.")
    bins = bins.astype(np.float64)
    want = bucket_values(critic.num_buckets, critic.lower_bound, critic.upper_bound, critic.bin_scheme)
    these = (
        f"this critic's {critic.num_buckets} {critic.bin_scheme} bins over [{critic.lower_bound}, {critic.upper_bound}]"
    )
    if bins.shape != want.shape:
        raise ValueError(f"{what}: {BINS_KEY}: got shape {list(bins.shape)}, expected {list(want.shape)} ({these}).")
    off = np.flatnonzero(~np.isclose(bins, want, rtol=1e-6, atol=0.0))
    if off.size:
        raise ValueError(
            f"{what}: {BINS_KEY}: got {off.size} bin(s) that differ from {these}, the first "
            f"{bins[off[0]]!r} at {int(off[0])}; expected {want[off[0]]!r} (to rtol 1e-6)."
        )
    return {k: v for k, v in state.items() if k != BINS_KEY}


def _split_loss_state(state):
    """A `DreamerV3ValueLoss` state dict -> `(value_state, target_state)`; a value model's -> `(state, None)`."""
    if not isinstance(state, Mapping) or not any(k.startswith(_LOSS_PREFIXES) for k in state):
        return state, None
    parts = [{k[len(p) :]: v for k, v in state.items() if k.startswith(p)} for p in _LOSS_PREFIXES]
    return parts[0], parts[1] or None


def load_torchrl(
    critic, value_state: Mapping, target_value_state: Optional[Mapping] = None, member: Optional[int] = None
) -> None:
    """Loads the value model's `state_dict()` (and its slow copy's, or one `DreamerV3ValueLoss.state_dict()`
    holding both; without a slow copy the EMA copy becomes the value model, as `SoftUpdate` does) into `critic`,
    all or nothing."""
    layout = _layout(critic)
    value_state, target_value_state = _unwrap(value_state), _unwrap(target_value_state)
    if target_value_state is None:
        value_state, target_value_state = _split_loss_state(value_state)
    _common.load(
        critic,
        layout,
        {
            "value_state": _weights(critic, value_state, "value_state"),
            "target_value_state": _weights(critic, target_value_state, "target_value_state"),
        },
        member,
    )


def export_torchrl(critic, member: Optional[int] = None) -> Tuple[Dict[str, object], Dict[str, object]]:
    """`(value_state, target_value_state)`: numpy state dicts of TorchRL's value model (bins included) and its
    slow copy."""
    layout = _layout(critic)
    bins = bucket_values(critic.num_buckets, critic.lower_bound, critic.upper_bound, critic.bin_scheme)
    fast, slow = _common.export(critic, layout, member)
    return {**fast, BINS_KEY: bins.copy()}, {**slow, BINS_KEY: bins.copy()}


def torchrl_critic(
    value_state: Mapping,
    target_value_state: Optional[Mapping] = None,
    *,
    gru_units: int,
    num_z_categoricals: int,
    num_z_classes: int,
    **kwargs,
):
    """A `CriticNetwork` of the value model's size, loaded (`gru_units`: the belief size)."""
    fast = _split_loss_state(_unwrap(value_state))[0] if target_value_state is None else _unwrap(value_state)
    return _common.build(
        lambda critic: load_torchrl(critic, value_state, target_value_state),
        _key,
        True,
        fast,
        gru_units=gru_units,
        num_z_categoricals=num_z_categoricals,
        num_z_classes=num_z_classes,
        options=CRITIC_OPTIONS,
        what="value_state",
        **kwargs,
    )


def torchrl_modules(critic, outputs: str = "logits"):
    """The critic as TorchRL's value model and its slow copy, in TorchRL's state-dict layout.

    Two `torch.nn.Module` views of `critic`'s own tensors whose
    `state_dict()` is the value model's (`export_torchrl`'s keys, shapes and
    values): the weights `module.0.module.model.{3i}.weight` `[units, in]`,
    ..., and the bins buffer `module.2.module.bins`. The bins are registered
    as a buffer, not a parameter, as TorchRL has them: a strict
    `load_state_dict` of TorchRL's own value model state needs the key, a
    state written from the view needs it to load strictly into TorchRL's
    model, and no optimizer holds it. The bins are fixed by the critic's
    configuration, so a state whose bins differ (to 1e-6 relative) is
    refused rather than loaded beside weights that would decode on other
    bins. A `torch.optim` optimizer's state over `parameters()` is the
    value model's. `forward(latent)` takes `cat([belief, state])` (not a
    TensorDict) and returns logits. PyTorch backend only.

    Args:
        critic: a built single `CriticNetwork` of TorchRL's architecture
            (`torchrl_critic` builds one from TorchRL's state dicts).
        outputs: what `forward(latent)` returns: `"logits"`, `"value"`
            (symlog of the expected value) or `"both"`.

    Returns:
        `(value_model, target_value_model)`: the fast critic (trainable) and
        the EMA copy (no gradients), each with the bins buffer.

    Raises:
        ValueError: when `critic` is not a built single critic of TorchRL's
            architecture, or not on the PyTorch backend.

    Examples:
        >>> ours = torchrl_critic(value_model.state_dict(), gru_units=..., num_z_categoricals=..., num_z_classes=...)
        >>> value_view, slow_view = torchrl_modules(ours)
        >>> value_view.load_state_dict(value_model.state_dict())   # strict: weights and bins
    """
    fast, ema = _common.view_layouts(critic, _layout(critic))
    bins = bucket_values(critic.num_buckets, critic.lower_bound, critic.upper_bound, critic.bin_scheme)
    constant = [(BINS_KEY, bins, "constant")]
    return (
        critic.fast_module(outputs=outputs, layout=fast + constant),
        critic.ema_module(outputs=outputs, layout=ema + constant),
    )


ADAPTER = HostAdapter(
    name="torchrl",
    title="TorchRL 0.14.1",
    options=CRITIC_OPTIONS,
    load=lambda critic, state, member=None: load_torchrl(critic, *state, member=member),
    export=export_torchrl,
    build=lambda state, **sizes: torchrl_critic(*state, **sizes),
    modules=torchrl_modules,
    key=_key,
)
