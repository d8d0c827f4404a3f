"""One member of an ensemble critic: its shapes, values and weights, read and written alone.

An ensemble (`ensemble_size=K`) stacks its members' variables (`[K, ...]`);
these functions cut member `member` out as a single critic's arrays, and
write one back. `CriticNetwork.get_member_weights` / `set_member_weights` and
the interop loaders (`multicritic.interop`) use them.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import keras
import numpy as np
from keras import ops

from multicritic.math import draws

from multicritic.files import integrity
from multicritic.validation import integer, real_tensor, static_shape


def member_shape(var) -> Tuple[int, ...]:
    """One member's shape of the stacked ensemble variable `var` (`[K, ...]`)."""
    shape = tuple(var.shape)[1:]
    # A stacked bias is [K, 1, out] (EinsumDense keeps the batch axis): one member's is [out].
    return shape[1:] if var.path.endswith("/bias") and len(shape) == 2 and shape[0] == 1 else shape


def member_value(var, member: int) -> np.ndarray:
    """Member `member`'s part of the stacked `var`, shaped as a single critic's variable."""
    return np.reshape(np.asarray(ops.convert_to_numpy(var.value))[member], member_shape(var))


def assign_member(var, member: int, value) -> None:
    """Writes a single critic's `value` into member `member` of the stacked `var`."""
    stacked = np.array(ops.convert_to_numpy(var.value))
    stacked[member] = np.reshape(value, stacked.shape[1:])
    var.assign(stacked)


def get_weights(critic, member: int) -> List[np.ndarray]:
    """Member `member`'s weights (fast, then EMA), shaped as a single critic's `get_weights()`."""
    check_member(critic, member)
    return [member_value(v, member) for v in critic.weights]


def set_weights(critic, member: int, weights: Sequence) -> None:
    """Sets member `member` from a single critic's `get_weights()` list; the other members are unchanged.

    All or nothing: the count, every shape and finiteness are checked first.
    """
    check_member(critic, member)
    if weights is None or isinstance(weights, (str, bytes, dict, np.ndarray)) or not hasattr(weights, "__iter__"):
        raise ValueError(
            f"weights: got a {type(weights).__name__}, expected a list of arrays (a single critic's get_weights())."
        )
    weights = list(weights)
    if len(weights) != len(critic.weights):
        raise ValueError(f"weights: got {len(weights)} arrays, expected {len(critic.weights)} (a single critic's).")
    expected = {f"weights[{i}] ({v.path})": (member_shape(v), "float32") for i, v in enumerate(critic.weights)}
    checked = integrity.check_arrays("weights", dict(zip(expected, weights)), expected)
    for var, w in zip(critic.weights, checked.values()):
        assign_member(var, member, w)


def check_member(critic, member) -> None:
    """Refuses `member` unless `critic` is an ensemble and `member` one of its members' indices."""
    if critic.ensemble_size == 1:
        raise ValueError("member: this critic is not an ensemble (ensemble_size=1); use get_weights / set_weights.")
    if isinstance(member, bool) or not isinstance(member, (int, np.integer)) or not 0 <= member < critic.ensemble_size:
        raise ValueError(f"member: got {member!r}, expected an integer in [0, {critic.ensemble_size}).")


def aggregate(critic, values, seed=None):
    """`critic.aggregate`: the members' values `[K, ...]` reduced as `critic.aggregation` says (see there)."""
    if critic.ensemble_size == 1:
        return values
    values = real_tensor("values", values, "float32")
    shape = static_shape(values.shape)
    if not shape or shape[0] not in (None, critic.ensemble_size):
        raise ValueError(
            f"values: got shape {list(shape)}, expected [{critic.ensemble_size}, ...] (one row per "
            f"member of this ensemble of {critic.ensemble_size})."
        )
    if critic.aggregation == "members":
        return values
    if critic.aggregation == "mean":
        return ops.mean(values, axis=0)
    if critic.aggregation == "min":
        return ops.amin(values, axis=0)
    if seed is None:
        keys = keras.random.uniform((critic.ensemble_size,))
    elif isinstance(seed, (tuple, list)) and len(seed) == 2:
        keys = draws.uniform_keys(critic.ensemble_size, seed[0], seed[1])
    else:
        keys = draws.uniform_keys(critic.ensemble_size, draws.as_int32(integer("seed", seed, low=0, high=2**32 - 1)), 0)
    drawn = keys <= ops.sort(keys)[critic.aggregation_subset - 1]
    drawn = ops.reshape(drawn, (critic.ensemble_size,) + (1,) * (len(values.shape) - 1))
    return ops.amin(ops.where(drawn, values, float("inf")), axis=0)
