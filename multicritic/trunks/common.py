"""What the trunks that normalise their own way share: the critic's shared options as they take them, and the
input as one tensor."""

from __future__ import annotations

from keras import ops


def check_shared(trunk: str, norm, use_bias, *, bias_allowed: bool) -> None:
    """The critic's shared `norm` and `use_bias`, once `Trunk` has checked them, as a trunk without a layer or
    RMS norm takes them, else a `ValueError` naming the option: `norm` the critic's default `"layer"` (the
    trunk's own normalisation is part of it), `use_bias` False unless `bias_allowed`."""
    if norm != "layer":
        raise ValueError(
            f"norm: got {norm!r} with trunk={trunk!r}, expected 'layer' (the critic's default): this trunk "
            "normalises its own way and has no layer or RMS norm to choose."
        )
    if use_bias and not bias_allowed:
        raise ValueError(
            f"use_bias: got True with trunk={trunk!r}, expected False: its Dense layers are projected onto the "
            "unit sphere and have no bias."
        )


def joined(inputs):
    """A trunk's input `[..., in]`: a tensor, or a list of parts concatenated along the last axis."""
    if isinstance(inputs, (list, tuple)):
        return inputs[0] if len(inputs) == 1 else ops.concatenate(list(inputs), axis=-1)
    return inputs
