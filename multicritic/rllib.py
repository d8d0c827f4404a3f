"""Weight import from and export to RLlib's TensorFlow DreamerV3 critic (ray 2.6 - 2.48).

RLlib's `CriticNetwork.get_weights()` returns, for the fast critic and then
for its EMA copy, in this order:

1. the MLP's Dense kernels, `[in, units]` for the first layer and
   `[units, units]` for the others (no biases);
2. each LayerNormalization's `gamma` then `beta`, `[units]` each;
3. the head's kernel `[units, num_buckets]` and bias `[num_buckets]`.

So an XS critic gives 10 arrays: `kernel, gamma, beta, head_kernel,
head_bias` twice. The same names and shapes hold here, so the mapping is one
to one.
"""

from __future__ import annotations

from typing import List, Sequence

import keras
import numpy as np

from multicritic import integrity
from multicritic.critic import CriticNetwork


def _ordered(critic: CriticNetwork):
    """`(name, variable)` pairs in RLlib's `get_weights()` order."""
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
    return critic._member_shape(var) if member is not None else tuple(var.shape)


def _check_architecture(critic):
    """RLlib's critic: LayerNorm (epsilon 1e-3) and bias-free Dense layers."""
    if (critic.norm, critic.norm_epsilon, critic.use_bias) != ("layer", 1e-3, False):
        raise ValueError(
            f"critic: got norm={critic.norm!r}, norm_epsilon={critic.norm_epsilon!r}, use_bias={critic.use_bias!r}; "
            "RLlib's critic has norm='layer', norm_epsilon=0.001, use_bias=False."
        )


def _check_member(critic, member):
    """`member` must be None for a single critic, and an ensemble's member index otherwise."""
    _check_architecture(critic)
    if critic.ensemble_size == 1:
        if member is not None:
            raise ValueError(f"member: got {member!r} for a single critic (ensemble_size=1), expected None.")
        return
    if member is None:
        raise ValueError(
            f"member: got None for an ensemble of {critic.ensemble_size}; expected the member index to load into "
            "or export (an RLlib critic is one member)."
        )
    critic._check_member(member)


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
    if not critic.built:
        raise ValueError("critic: not built yet; call it once or give its input sizes first.")
    _check_member(critic, member)
    pairs = _ordered(critic)
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
            critic._assign_member(var, member, w)


def export_rllib_weights(critic: CriticNetwork, member=None) -> List[np.ndarray]:
    """The critic's weights (an ensemble's `member`) as the list RLlib's `CriticNetwork.set_weights()` takes."""
    _check_member(critic, member)
    if member is not None:
        return [critic._member_value(var, member) for _, var in _ordered(critic)]
    return [np.asarray(keras.ops.convert_to_numpy(var.value)) for _, var in _ordered(critic)]
