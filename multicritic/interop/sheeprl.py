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

from keras import ops

from multicritic.interop import _common
from multicritic.interop.adapter import HostAdapter
from multicritic.math.bins import inverse_symlog

CRITIC_OPTIONS = dict(input_layout="z_h", **_common.ARCHITECTURE_2023)
_BUILDER = "CriticNetwork(..., **multicritic.interop.sheeprl.CRITIC_OPTIONS)"
# "sheeprl": sheeprl's own parameter names and shapes (its checkpoints load either way; the 2023 options only).
# "multicritic": the critic's own names (any options; its checkpoints then hold multicritic's keys).
LAYOUTS = ("sheeprl", "multicritic")


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


def sheeprl_modules(critic, outputs: str = "logits", layout: str = "sheeprl"):
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
        layout: `"sheeprl"` (sheeprl's parameter names, for a critic with
            `CRITIC_OPTIONS`) or `"multicritic"` (the critic's own names, any
            options: the 2024 recipe's RMS norm, biases and symexp buckets;
            sheeprl's checkpoints then hold these names, and
            `checkpoint.resume_from` must load them into the views, as
            `benchmarks/agents/sheeprl_dreamer.py` does). With other buckets
            than sheeprl's, give sheeprl's `train` `sheeprl_distribution`.

    Returns:
        `(critic_module, target_critic_module)`: the fast critic (trainable)
        and the EMA copy (no gradients).

    Raises:
        ValueError: when `critic` is not a built single critic (of sheeprl's
            architecture, for `layout="sheeprl"`), or not on the PyTorch
            backend, or for another `layout`.

    Example (in sheeprl's DreamerV3, after `build_agent(...)` returned
    `critic` and `target_critic`):
        >>> ours = sheeprl_critic(critic.module.state_dict(), target_critic.state_dict(),
        ...                       gru_units=..., num_z_categoricals=..., num_z_classes=...)
        >>> critic_module, target_module = sheeprl_modules(ours)
        >>> critic, target_critic = setup_module(fabric, critic_module), setup_module(fabric, target_module)
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout: got {layout!r}, expected one of {list(LAYOUTS)}.")
    if layout == "multicritic":
        _common.check_critic(critic)
        _common.check_single(critic)
        return critic.fast_module(outputs=outputs), critic.ema_module(outputs=outputs)
    try:
        layout_entries = _layout(critic)
    except ValueError as err:
        raise ValueError(f"{err} Or keep the critic's options with layout='multicritic'.") from None
    fast, ema = _common.view_layouts(critic, layout_entries)
    return critic.fast_module(outputs=outputs, layout=fast), critic.ema_module(outputs=outputs, layout=ema)


class SheeprlDistribution:
    """The critic's value distribution with the interface sheeprl's `train` uses of its
    `TwoHotEncodingDistribution(logits, dims=1)`: `mean` (and `mode`) `[..., 1]` in real space, and
    `log_prob(x)` `[...]` of real-space `x [..., 1]`, over the critic's own head and support (e.g. the 2024
    symexp buckets, where sheeprl's class builds `linspace` buckets in symlog space). In `keras.ops`: the
    tensors are the backend's (PyTorch's, with autograd, inside sheeprl).

    Args:
        logits: `[..., units]` the critic's logits (`sheeprl_modules`' output).
        head: the critic's head (`critic.return_layer`).
    """

    def __init__(self, logits, head):
        self.logits, self.head = logits, head

    @property
    def mean(self):
        return ops.expand_dims(inverse_symlog(self.head.decode(self.logits)), -1)

    mode = mean

    def log_prob(self, x):
        """The head's log-likelihood of real-space values `x [..., 1]` (minus its value loss): `[...]`."""
        value_term, _ = self.head.position_losses(
            self.logits, ops.squeeze(ops.cast(x, "float32"), -1), None, None, regularizer="two_hot_mean"
        )
        return -value_term


def sheeprl_distribution(critic):
    """A stand-in for sheeprl's `TwoHotEncodingDistribution` over `critic`'s logits: `distribution(logits,
    dims=1)` returns a `SheeprlDistribution` of `critic`'s head. For the two places sheeprl's DreamerV3 `train`
    reads the critic (its values for the actor's returns, its loss against the lambda returns and the target
    critic's mean); sheeprl's reward model keeps its own distribution.

    Example (the 2024 recipe's critic in sheeprl; `mine` tells the critic's logits from the reward model's):
        >>> to_critic = sheeprl_distribution(critic)
        >>> dreamer_v3.TwoHotEncodingDistribution = lambda logits, dims=0: (
        ...     to_critic(logits, dims) if mine(logits) else TwoHotEncodingDistribution(logits, dims))
    """
    _common.check_critic(critic)

    def distribution(logits, dims: int = 1):
        if dims != 1:
            raise ValueError(f"dims: got {dims!r}, expected 1 (the buckets are the logits' last axis).")
        return SheeprlDistribution(logits, critic.return_layer)

    return distribution


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
