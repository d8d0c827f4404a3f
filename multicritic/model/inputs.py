"""A critic's inputs: their names and row shapes, their checks, and leading dims folded into one batch axis.

A critic takes DreamerV3's state as two inputs, `h [..., gru_units]` and
`z [..., num_z_categoricals, num_z_classes]`, or (a features critic,
`input_layout="features"`) one flat feature vector `x [..., input_size]`.
`CriticNetwork` calls these functions on itself: every check raises a
`ValueError` naming the input, what it got and what was expected, before
anything changes.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

from keras import ops

from multicritic.model.options import FEATURES
from multicritic.validation import compatible, fmt, static_shape


def row_shapes(critic) -> Dict[str, Tuple[Optional[int], ...]]:
    """The critic's inputs by name, in call order, each with the shape of one row (None: a size not known
    before the first call): `{"h": (gru_units,), "z": (num_z_categoricals, num_z_classes)}`, or a features
    critic's `{"x": (input_size,)}`."""
    if critic.input_layout == FEATURES:
        return {"x": (critic.input_size,)}
    return {"h": (critic.gru_units,), "z": (critic.num_z_categoricals, critic.num_z_classes)}


def check_features(critic, shape, batch_axes: Optional[int] = None) -> None:
    """A features critic's `x`: `[..., input_size]` (`batch_axes`: with that many leading axes)."""
    size = critic.input_size
    if len(shape) < 1 or (size is not None and shape[-1] != size):
        want = "[..., input_size]" if size is None else f"[..., {size}]"
    elif batch_axes is not None and len(shape) != batch_axes + 1:
        want = fmt((None,) * batch_axes + (size,), "B")
    else:
        return
    raise ValueError(f"x: got shape {list(shape)}, expected {want} (input_size={size}).")


def check(critic, h_shape, z_shape=None) -> None:
    """Shapes with one batch axis, as the network takes them: `h [B, gru_units]` and `z [B, cats, classes]`,
    or a features critic's `x [B, input_size]` (in `h_shape`)."""
    if critic.input_layout == FEATURES:
        check_features(critic, static_shape(h_shape), batch_axes=1)
        return
    h_shape, z_shape = static_shape(h_shape), static_shape(z_shape)
    want_h = (None, critic.gru_units)
    want_z = (None, critic.num_z_categoricals, critic.num_z_classes)
    if len(h_shape) != 2 or (critic.gru_units is not None and h_shape[1] != critic.gru_units):
        raise ValueError(f"h: got shape {list(h_shape)}, expected {fmt(want_h, 'B')} (gru_units={critic.gru_units}).")
    if len(z_shape) != 3 or any(w is not None and d != w for d, w in zip(z_shape[1:], want_z[1:])):
        raise ValueError(
            f"z: got shape {list(z_shape)}, expected {fmt(want_z, 'B')} "
            f"(num_z_categoricals={critic.num_z_categoricals}, num_z_classes={critic.num_z_classes})."
        )
    if h_shape[0] is not None and z_shape[0] is not None and h_shape[0] != z_shape[0]:
        raise ValueError(
            f"h, z: batch sizes differ: h has shape {list(h_shape)}, z has shape {list(z_shape)}; "
            "expected the same leading dimension B."
        )


def leading_dims(critic, inputs: Sequence):
    """The leading dims of `h [..., gru_units]` and `z [..., num_z_categoricals, num_z_classes]` (or of a
    features critic's `x [..., input_size]`), checked as `critic(h, z)` checks them; None for inputs with one
    batch axis (the network's own checks) or, for `(h, z)`, fewer."""
    if critic.input_layout == FEATURES:
        (x,) = inputs
        shape = static_shape(x.shape)
        if len(shape) == 2:
            return None
        check_features(critic, shape)
        return ops.shape(x)[:-1]
    h, z = inputs
    if len(h.shape) <= 2 or len(z.shape) <= 3:
        return None
    lead = static_shape(h.shape)[:-1]
    if len(z.shape) != len(h.shape) + 1 or not compatible(static_shape(z.shape)[:-2], lead):
        raise ValueError(
            f"h, z: got shapes {list(static_shape(h.shape))} and {list(static_shape(z.shape))}; expected h [..., "
            f"gru_units={critic.gru_units}] and z [..., num_z_categoricals={critic.num_z_categoricals}, "
            f"num_z_classes={critic.num_z_classes}] with the same leading dimensions."
        )
    check(critic, (None,) + static_shape(h.shape)[-1:], (None,) + static_shape(z.shape)[-2:])
    return ops.shape(h)[:-1]


def flatten(critic, inputs: Sequence) -> Tuple:
    """Inputs with leading dims as one batch axis: `h [N, gru_units]` and `z [N, cats, classes]`, or `x [N, D]`."""
    return tuple(
        ops.reshape(x, (-1,) + tuple(x.shape[len(x.shape) - len(row) :]))
        for x, row in zip(inputs, row_shapes(critic).values())
    )


def unflatten(critic, outputs, lead) -> Tuple:
    """`(value [N] or [K, N], logits [..., N, U])` back to the leading dims `lead` of the inputs."""
    value, logits = outputs
    members = () if critic.ensemble_size == 1 else (critic.ensemble_size,)
    return (
        ops.reshape(value, members + tuple(lead)),
        ops.reshape(logits, members + tuple(lead) + (logits.shape[-1],)),
    )


def check_latent(critic, shape) -> None:
    """`critic.on_latent`'s input: `[..., latent_size]`, the parts in the critic's order (a features critic: `x`)."""
    if len(shape) >= 1 and shape[-1] in (None, critic.latent_size):
        return
    if critic.input_layout == FEATURES:
        why = f"input_size={critic.input_size}"
    else:
        order = "h, flatten(z)" if critic.input_layout == "h_z" else "flatten(z), h"
        why = (
            f"{order}: gru_units={critic.gru_units} + num_z_categoricals * num_z_classes = "
            f"{critic.num_z_categoricals} * {critic.num_z_classes}"
        )
    raise ValueError(f"latent: got shape {list(shape)}, expected [..., {critic.latent_size}] ({why}).")
