"""A throwaway head and trunk, defined outside the package: the tests register them to show that a new part is
one module plus one registration line (tests/test_registry.py)."""

import keras
from keras import ops

from multicritic.heads.base import ValueHead
from multicritic.layers.mlp import MLP
from multicritic.math.bins import symlog


@keras.saving.register_keras_serializable(package="tests_throwaway")
class ThrowawayHead(ValueHead):
    """Regresses the symlog return with a Huber loss of width `delta`."""

    regularizers = ("two_hot_mean",)

    def __init__(self, *, delta: float = 2.0, **kwargs):
        self.delta = float(delta)
        super().__init__(**kwargs)

    @property
    def units(self):
        return 1

    def decode(self, logits):
        return logits[..., 0]

    def position_losses(self, logits, value_targets, ema_value_symlog, ema_logits, *, regularizer):
        value = logits[..., 0]
        error = ops.abs(value - symlog(value_targets))
        value_term = ops.where(error < self.delta, 0.5 * error**2, self.delta * (error - 0.5 * self.delta))
        ema_term = None if ema_value_symlog is None else 0.5 * (value - ema_value_symlog) ** 2
        return value_term, ema_term

    def outside_support(self, value_targets):
        return None

    def get_config(self):
        return {**super().get_config(), "delta": self.delta}


@keras.saving.register_keras_serializable(package="tests_throwaway")
class ThrowawayTrunk(MLP):
    """The MLP with its features scaled by `gain`."""

    def __init__(self, *, gain: float = 0.5, **kwargs):
        self.gain = float(gain)
        super().__init__(**kwargs)

    def call(self, inputs):
        return super().call(inputs) * self.gain

    def get_config(self):
        return {**super().get_config(), "gain": self.gain}
