"""SimbaV2's learnable per-unit scale, parameterised so that its optimizer steps have a set size."""

from __future__ import annotations

from typing import Optional

import keras
from keras import ops

from multicritic.validation import FixedOptions, integer, number


@keras.saving.register_keras_serializable(package="multicritic")
class Scaler(FixedOptions, keras.layers.Layer):
    """`x * (s * (init / scale))`: a learnable scale per unit, stored as `s`, which starts at `scale`.

    The effective scale `s * init / scale` starts at `init`; `scale` sets how
    far one optimizer step moves it (Adam moves `s` by about its learning
    rate, the effective scale by `init / scale` times that).
    SimbaV2 scales every hyperspherical Dense's output so (the features stay
    on the sphere, the scale is learnt apart), and interpolates its residual
    blocks with one (the LERP's `alpha`).

    Args:
        init: the effective scale at the start.
        scale: the stored value at the start (`s`'s own scale).
        members: `None`, or the ensemble size `K` (`s` stacked `[K, units]`).
        **kwargs: passed to `keras.layers.Layer`.

    Call arguments:
        inputs: `[..., units]`, or member-major `[K, N, units]` with members.

    Returns:
        `inputs` scaled, same shape.

    Examples:
        >>> Scaler(init=0.5, scale=0.1)(np.ones((2, 3), "float32")).shape
        (2, 3)

    Reference:
        Lee et al., "Hyperspherical Normalization for Scalable Deep
        Reinforcement Learning" (SimbaV2), ICML 2025 (arXiv 2502.15280),
        Sec. 4.2 (scaler) and 4.4 (LERP).
    """

    def __init__(self, *, init: float = 1.0, scale: float = 1.0, members: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)
        self.init = number("init", init)
        self.scale = number("scale", scale, low=0.0, low_open=True)
        self.members = None if members is None else integer("members", members)
        self.scaler = None

    def build(self, input_shape):
        units = int(input_shape[-1])
        self.scaler = self.add_weight(
            shape=(units,) if self.members is None else (self.members, units),
            initializer=keras.initializers.Constant(self.scale),
            name="scaler",
        )

    def call(self, inputs):
        s = self.scaler if self.members is None else ops.expand_dims(self.scaler, -2)
        # (SimbaV2's order: the stored value times its forward factor, then the input.)
        return ops.cast(s * (self.init / self.scale), inputs.dtype) * inputs

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "init": self.init, "scale": self.scale, "members": self.members}
