"""Weights in and out of RLlib's DreamerV3 critic: TensorFlow (ray 2.6 - 2.48) and PyTorch (ray >= 2.49).

TensorFlow, checked against ray 2.48.0 (`tests/data/rllib_goldens.npz`):
RLlib's `CriticNetwork.get_weights()` returns, for the fast critic and then
for its EMA copy, in this order:

1. the MLP's Dense kernels, `[in, units]` for the first layer and
   `[units, units]` for the others (no biases);
2. each LayerNormalization's `gamma` then `beta`, `[units]` each;
3. the head's kernel `[units, num_buckets]` and bias `[num_buckets]`.

So an XS critic gives 10 arrays: `kernel, gamma, beta, head_kernel,
head_bias` twice. The same names and shapes hold here, so the mapping is one
to one.

PyTorch, checked against ray[rllib]==2.60.0 (torch 2.13.0; live in the
`interop` nox session, and `tests/data/interop/rllib_torch_goldens.npz`):
`rllib/algorithms/dreamerv3/torch/models/critic_network.py`'s `state_dict()`
holds `mlp._net.{3i}.weight` `[units, in]` (Linear without bias),
`mlp._net.{3i+1}.weight` / `.bias` (LayerNorm, epsilon 1e-3), SiLU at
`{3i+2}`, `return_layer.reward_buckets_layer.weight` `[255, units]` /
`.bias` (zero-initialised; hidden weights `dreamerv3_normal_initializer`:
normal, std `sqrt(1 / mean(fan_in, fan_out)) / 0.8796`, clamped to
[-2, 2]), and the EMA copy under `mlp_ema.` /
`return_layer_ema.` (`requires_grad=False`). Linear weights are transposed
to Keras kernels. The input is `cat([h, flatten(z)])` (`input_layout="h_z"`);
`forward` returns the symlog value. The learner calls `update_ema()` (decay
0.98) after each optimizer step, as `CriticTrainer` does.

Both layouts are RLlib's 2023 critic: `CRITIC_OPTIONS` (our defaults).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

import keras
import numpy as np

from multicritic.files import integrity

from multicritic.model import members
from multicritic.model.critic import CriticNetwork
from multicritic.interop import _common
from multicritic.interop.adapter import HostAdapter

CRITIC_OPTIONS = dict(input_layout="h_z", **_common.ARCHITECTURE_2023)
_BUILDER = "CriticNetwork(...) with its default architecture options (multicritic.interop.rllib.CRITIC_OPTIONS)"
_EMA_PREFIXES = (("mlp.", "mlp_ema."), ("return_layer.", "return_layer_ema."))


def _ordered(critic: CriticNetwork):
    """`(name, variable)` pairs in RLlib's `get_weights()` order."""
    _common.check_critic(critic)
    out = []
    for prefix, mlp, head in (
        ("mlp", critic.mlp, critic.return_layer),
        ("mlp_ema", critic.mlp_ema, critic.return_layer_ema),
    ):
        for i, dense in enumerate(mlp.dense_layers):
            out.append((f"{prefix}/dense_{i}/kernel", dense.kernel))
        for i, norm in enumerate(mlp.layer_normalizations):
            out.append((f"{prefix}/layer_norm_{i}/gamma", norm.gamma))
            out.append((f"{prefix}/layer_norm_{i}/beta", norm.beta))
        dense = head.reward_buckets_layer
        head_name = "return_layer" if prefix == "mlp" else "return_layer_ema"
        out.append((f"{head_name}/kernel", dense.kernel))
        out.append((f"{head_name}/bias", dense.bias))
    return out


def rllib_weight_names(critic: CriticNetwork) -> List[str]:
    """Names of the arrays `load_rllib_weights` expects, in order."""
    return [name for name, _ in _ordered(critic)]


def _member_shape(critic, var, member):
    return members.member_shape(var) if member is not None else tuple(var.shape)


def _check_member(critic, member):
    _common.check_options(critic, "RLlib", CRITIC_OPTIONS, _BUILDER)
    _common.check_member(critic, member)


def load_rllib_weights(critic: CriticNetwork, weights: Sequence, member=None) -> None:
    """Loads RLlib's `CriticNetwork.get_weights()` list (fast, then EMA) into `critic`.

    Args:
        critic: a built `CriticNetwork` of the same size and bucket count.
        weights: the list of arrays, in the order of the module docstring.
        member: for an ensemble (`ensemble_size > 1`), the member that
            receives the RLlib critic (fast and EMA); the other members are
            unchanged. `None` for a single critic.

    Raises:
        ValueError: on a count, shape or dtype mismatch or a non-finite
            value, naming the first offending array; the critic is left
            unchanged (everything is checked before the first assignment).
    """
    _check_member(critic, member)
    pairs = _ordered(critic)
    if weights is None or isinstance(weights, (str, bytes, Mapping, np.ndarray)) or not hasattr(weights, "__iter__"):
        raise ValueError(
            f"weights: got a {type(weights).__name__}, expected a list of arrays (RLlib's CriticNetwork.get_weights())."
        )
    weights = list(weights)
    if len(weights) != len(pairs):
        raise ValueError(
            f"weights: got {len(weights)} arrays, expected {len(pairs)} "
            f"({len(pairs) // 2} fast then {len(pairs) // 2} EMA: {rllib_weight_names(critic)})."
        )
    named = {}
    for i, ((name, var), w) in enumerate(zip(pairs, weights)):
        if w is None or isinstance(w, (str, bytes)):
            raise ValueError(f"weights[{i}] ({name}): got {w!r}, expected an array of shape {list(var.shape)}.")
        named[f"weights[{i}] ({name})"] = w
    expected = {
        f"weights[{i}] ({name})": (_member_shape(critic, var, member), "float32") for i, (name, var) in enumerate(pairs)
    }
    checked = integrity.check_arrays("weights", named, expected)
    for (_, var), w in zip(pairs, checked.values()):
        if member is None:
            var.assign(w)
        else:
            members.assign_member(var, member, w)


def export_rllib_weights(critic: CriticNetwork, member=None) -> List[np.ndarray]:
    """The critic's weights (an ensemble's `member`) as the list RLlib's `CriticNetwork.set_weights()` takes."""
    _check_member(critic, member)
    if member is not None:
        return [members.member_value(var, member) for _, var in _ordered(critic)]
    return [np.asarray(keras.ops.convert_to_numpy(var.value)) for _, var in _ordered(critic)]


def _torch_key(kind: str, i: int) -> str:
    return {
        "kernel": f"mlp._net.{3 * i}.weight",
        "scale": f"mlp._net.{3 * i + 1}.weight",
        "offset": f"mlp._net.{3 * i + 1}.bias",
        "head_kernel": "return_layer.reward_buckets_layer.weight",
        "head_bias": "return_layer.reward_buckets_layer.bias",
    }[kind]


def _swap_prefix(key: str, pairs) -> str:
    """`key` with the first matching `(old, new)` prefix of `pairs` replaced."""
    for old, new in pairs:
        if key.startswith(old):
            return new + key[len(old) :]
    return key


def _torch_layout(critic):
    _common.check_options(critic, "RLlib", CRITIC_OPTIONS, _BUILDER)
    return _common.entries(critic, _torch_key, transpose=True)


def load_rllib_torch(critic: CriticNetwork, state_dict: Mapping, member: Optional[int] = None) -> None:
    """Loads RLlib's PyTorch `CriticNetwork.state_dict()` (fast and `_ema` keys) into `critic`, all or nothing.

    Without `mlp_ema.` / `return_layer_ema.` keys the EMA copy becomes the
    fast critic (RLlib's `init_ema()`).
    """
    state_dict = _common.unwrap(state_dict)
    if not isinstance(state_dict, Mapping):
        raise ValueError(f"state_dict: got a {type(state_dict).__name__}, expected a mapping of names to arrays.")
    ema = tuple(e for _, e in _EMA_PREFIXES)
    fast = {k: v for k, v in state_dict.items() if not k.startswith(ema)}
    to_fast = [(e, f) for f, e in _EMA_PREFIXES]
    slow = {_swap_prefix(k, to_fast): v for k, v in state_dict.items() if k.startswith(ema)}
    _common.load(critic, _torch_layout(critic), {"state_dict": fast, "state_dict (EMA copy)": slow or None}, member)


def export_rllib_torch(critic: CriticNetwork, member: Optional[int] = None) -> Dict[str, np.ndarray]:
    """The critic as RLlib's PyTorch `CriticNetwork.state_dict()` (numpy arrays; `load_state_dict` takes them
    after `torch.as_tensor`)."""
    fast, slow = _common.export(critic, _torch_layout(critic), member)
    return {**fast, **{_swap_prefix(k, _EMA_PREFIXES): v for k, v in slow.items()}}


def rllib_torch_critic(
    state_dict: Mapping, *, gru_units: int, num_z_categoricals: int, num_z_classes: int, **kwargs
) -> CriticNetwork:
    """A `CriticNetwork` of the RLlib PyTorch critic's size, loaded from its `state_dict()`."""
    return _common.build(
        lambda critic: load_rllib_torch(critic, state_dict),
        _torch_key,
        True,
        _common.unwrap(state_dict),
        gru_units=gru_units,
        num_z_categoricals=num_z_categoricals,
        num_z_classes=num_z_classes,
        options=CRITIC_OPTIONS,
        what="state_dict",
        **kwargs,
    )


def rllib_torch_module(critic: CriticNetwork):
    """The critic in place of RLlib's PyTorch `CriticNetwork` (ray >= 2.49), in RLlib's own state-dict layout.

    `critic.torch_module()` with RLlib's layout, after checking the architecture is RLlib's. Its
    `forward(h, z, return_logits=False, use_ema=False)`, `init_ema()` and `update_ema()` are RLlib's;
    `parameters()` are the fast critic's then the frozen EMA copy's, the critic's own tensors, named, ordered
    and shaped as RLlib's (`mlp._net.0.weight` `[units, in]`, ..., `mlp_ema.`, `return_layer_ema.`): its
    `state_dict()` is `export_rllib_torch(critic)`'s, so an RL module checkpoint (and the optimizer state over
    these parameters) written with the swap loads into RLlib's critic, and one written by RLlib's critic loads
    into it. A single critic only. PyTorch backend only.

    Example (before the learner builds its optimizers over `critic.parameters()`):
        >>> module.critic = rllib_torch_module(rllib_torch_critic(module.critic.state_dict(), gru_units=...,
        ...                                                       num_z_categoricals=..., num_z_classes=...))
    """
    fast, ema = _common.view_layouts(critic, _torch_layout(critic))
    return critic.torch_module(layout=(fast, [(_swap_prefix(k, _EMA_PREFIXES), v, t) for k, v, t in ema]))


ADAPTER = HostAdapter(
    name="rllib",
    title="RLlib TensorFlow (ray <= 2.48)",
    options=CRITIC_OPTIONS,
    load=lambda critic, state, member=None: load_rllib_weights(critic, state, member),
    export=export_rllib_weights,
)
TORCH_ADAPTER = HostAdapter(
    name="rllib_torch",
    title="RLlib PyTorch (ray >= 2.49)",
    options=CRITIC_OPTIONS,
    load=lambda critic, state, member=None: load_rllib_torch(critic, state, member),
    export=export_rllib_torch,
    build=rllib_torch_critic,
    modules=rllib_torch_module,
    key=_torch_key,
)
