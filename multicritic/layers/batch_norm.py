"""Batch normalisation per ensemble member, its moving statistics updated through the parts' hooks."""

from __future__ import annotations

from typing import Optional

import keras
from keras import ops

from multicritic.layers.part_hooks import current_statistics, update_statistics
from multicritic.validation import FixedOptions, cast_to, integer, number


@keras.saving.register_keras_serializable(package="multicritic")
class BatchNormalization(FixedOptions, keras.layers.Layer):
    """Batch normalisation over the rows of a batch, each ensemble member with its own statistics.

    In training (`training=True`) each feature is normalised by the batch's
    mean and (biased) variance, `(x - mean) / sqrt(var + epsilon) * gamma +
    beta`, and the moving statistics move towards the batch's:
    `moving <- momentum * moving + (1 - momentum) * batch`, as Keras's and
    Flax's BatchNorm. The new moving statistics go through
    `multicritic.layers.part_hooks.update_statistics`: inside the trainer's
    step they are assigned by the step's all-or-nothing update (a step with
    two passes, dream and replay, moves them twice), elsewhere at once (so
    `stateless_call(..., training=True)` returns them). A layer that
    is not trainable (the slow critic's) normalises by the batch too in
    training, and moves nothing. Otherwise (inference) it normalises by the
    moving statistics; a negative moving variance (only ever assigned by
    hand) counts as 0, so every finite state gives finite outputs.

    With `members=K` the input is member-major `[K, N, units]` and every
    variable is stacked `[K, units]`: member `k` is normalised by the statistics
    of its own rows `[k]`, as the single critic it stands for. Computed in
    float32 under half-precision policies.

    Args:
        momentum: of the moving statistics (0.99, Keras's and CrossQ's).
        epsilon: added to the variance (1e-3, Keras's and CrossQ's).
        members: `None`, or the ensemble size `K`.
        **kwargs: passed to `keras.layers.Layer`.

    Call arguments:
        inputs: `[N, units]`, or `[K, N, units]` with members.
        training: normalise by the batch (and move the statistics) when true.

    Returns:
        The normalised inputs, same shape, in the layer's compute dtype.

    Examples:
        >>> norm = BatchNormalization(members=3)
        >>> norm(np.ones((3, 8, 16), "float32"), training=True).shape
        (3, 8, 16)

    Reference:
        Ioffe & Szegedy, "Batch Normalization: Accelerating Deep Network
        Training by Reducing Internal Covariate Shift", ICML 2015.
    """

    def __init__(self, *, momentum: float = 0.99, epsilon: float = 1e-3, members: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)
        self.momentum = number("momentum", momentum, low=0.0, high=1.0)
        self.epsilon = number("epsilon", epsilon, low=0.0, low_open=True)
        self.members = None if members is None else integer("members", members)
        self.gamma = self.beta = self.moving_mean = self.moving_variance = None

    def build(self, input_shape):
        shape = (int(input_shape[-1]),) if self.members is None else (self.members, int(input_shape[-1]))

        def weight(name, initializer, trainable):
            return self.add_weight(name=name, shape=shape, initializer=initializer, trainable=trainable, autocast=False)

        self.gamma = weight("gamma", "ones", True)
        self.beta = weight("beta", "zeros", True)
        self.moving_mean = weight("moving_mean", "zeros", False)
        self.moving_variance = weight("moving_variance", "ones", False)

    def _per_row(self, v):
        """A `[units]` / `[K, units]` variable broadcast over the rows of `[N, units]` / `[K, N, units]`."""
        return v if self.members is None else ops.expand_dims(v, -2)

    def call(self, inputs, training=None):
        x = cast_to(inputs, "float32")
        if training:
            rows = len(x.shape) - 2  # the batch axis: 0, or 1 behind the members
            mean = ops.mean(x, axis=rows, keepdims=True)
            variance = ops.mean(ops.square(x - mean), axis=rows, keepdims=True)
            if self.trainable:
                keep = self.momentum
                for moving, batch in ((self.moving_mean, mean), (self.moving_variance, variance)):
                    update_statistics(
                        moving, current_statistics(moving) * keep + ops.squeeze(batch, rows) * (1.0 - keep)
                    )
        else:
            mean = self._per_row(self.moving_mean)
            variance = ops.maximum(self._per_row(self.moving_variance), 0.0)
        y = (x - mean) * ops.rsqrt(variance + self.epsilon) * self._per_row(self.gamma) + self._per_row(self.beta)
        return cast_to(y, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "epsilon": self.epsilon, "members": self.members}
