"""Weights in and out of the official DreamerV3 code's value critic (danijar/dreamerv3, JAX, 2024 revision).

Checked against commit e3f02248693a79dc8b0ebd62c93683888ddaccfe
(`tests/data/interop/official/`, written by running that code).

Source layout: the agent's ninjax parameters, a flat dict with no prefix:
`val/mlp/linear{i}/kernel` `[in, units]` and `val/mlp/linear{i}/bias`
(Linear with bias), `val/mlp/norm{i}/scale` (RMSNorm, epsilon 1e-4 inside
the root, no offset), `val/head/logits/kernel` `[units, 255]` and
`val/head/logits/bias`; the slow critic the same under `slowval/`
(`slowval_count/value` is its update counter, not a weight). Kernels are
`[in, out]` as Keras's: nothing is transposed. Per layer: Linear -> RMSNorm
-> SiLU, then the head (`symexp_twohot`, 255 bins `symexp(linspace(-20, 20))`,
initialised to zero: `outscale=0`); hidden kernels `trunc_normal_in`
(fan-in truncated normal). The value head's input is
`concat([deter, flatten(stoch)])` (`agent.py` `feat2tensor`): h first, our
`input_layout="h_z"`. The size presets change only the width
(`multicritic.model.sizes.OFFICIAL_2024_SIZES`).

The slow critic: `SlowModel(rate=0.02, every=1)` copies the fast critic on
first use (before its first update: the critic's EMA copy starts as that
copy), then, after each optimizer step, mixes `rate` in at the updates whose
count so far (`slowval_count`, from 0) is a multiple of `every`:
`critic.update_ema(tau=rate, step=count + every, period=every)`. (`step=count`
would copy the fast critic again at the first update, where the official
code mixes.)
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional


from multicritic.interop import _common
from multicritic.interop.adapter import HostAdapter

CRITIC_OPTIONS = dict(input_layout="h_z", **_common.ARCHITECTURE_2024, **_common.TRUNC_NORMAL_IN)
_CHECKED = dict(input_layout="h_z", **_common.ARCHITECTURE_2024)
_BUILDER = "CriticNetwork(..., **multicritic.interop.dreamerv3.CRITIC_OPTIONS)"


def _key(kind: str, i: int) -> str:
    return {
        "kernel": f"mlp/linear{i}/kernel",
        "bias": f"mlp/linear{i}/bias",
        "scale": f"mlp/norm{i}/scale",
        "head_kernel": "head/logits/kernel",
        "head_bias": "head/logits/bias",
    }[kind]


def _split(params: Mapping, what: str):
    if not isinstance(params, Mapping):
        raise ValueError(f"{what}: got a {type(params).__name__}, expected the agent's parameters as a flat dict.")
    fast = {k[len("val/") :]: v for k, v in params.items() if k.startswith("val/")}
    slow = {k[len("slowval/") :]: v for k, v in params.items() if k.startswith("slowval/")}
    return fast, slow or None


def load_dreamerv3(critic, params: Mapping, member: Optional[int] = None) -> None:
    """Loads the official value critic (`val/...`) and slow critic (`slowval/...`) into `critic`.

    `params`: the agent's flat parameter dict (other modules' entries and
    `slowval_count` are ignored); without `slowval/` entries (before the
    first slow update) the EMA copy becomes the fast critic, as the official
    code does on first use. All or nothing: a `ValueError` names the first
    option, key, shape or value that does not fit.
    """
    _common.check_options(critic, "the official DreamerV3", _CHECKED, _BUILDER)
    fast, slow = _split(params, "params")
    layout = _common.entries(critic, _key, transpose=False)
    _common.load(critic, layout, {"params (val/)": fast, "params (slowval/)": slow}, member)


def export_dreamerv3(critic, member: Optional[int] = None) -> Dict[str, object]:
    """The critic as the official code's `val/...` and `slowval/...` parameters (numpy, `[in, out]` kernels)."""
    _common.check_options(critic, "the official DreamerV3", _CHECKED, _BUILDER)
    fast, slow = _common.export(critic, _common.entries(critic, _key, transpose=False), member)
    return {**{f"val/{k}": v for k, v in fast.items()}, **{f"slowval/{k}": v for k, v in slow.items()}}


def dreamerv3_critic(params: Mapping, *, gru_units: int, num_z_categoricals: int, num_z_classes: int, **kwargs):
    """A `CriticNetwork` of the official value critic's size, its weights loaded from `params`
    (`gru_units` is the official `deter`, `num_z_categoricals` / `num_z_classes` its `stoch` / `classes`)."""
    fast, _ = _split(params, "params")
    return _common.build(
        lambda critic: load_dreamerv3(critic, params),
        _key,
        False,
        fast,
        gru_units=gru_units,
        num_z_categoricals=num_z_categoricals,
        num_z_classes=num_z_classes,
        options=CRITIC_OPTIONS,
        what="params (val/)",
        **kwargs,
    )


ADAPTER = HostAdapter(
    name="dreamerv3",
    title="the official JAX code (2024)",
    options=CRITIC_OPTIONS,
    load=lambda critic, state, member=None: load_dreamerv3(critic, state, member),
    export=export_dreamerv3,
    build=dreamerv3_critic,
    key=_key,
)
