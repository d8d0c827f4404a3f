"""The symlog MSE value head: a regression baseline."""

from __future__ import annotations

import keras
from keras import ops

from multicritic.bins import symlog
from multicritic.heads.base import ValueHead


@keras.saving.register_keras_serializable(package="multicritic")
class MSEHead(ValueHead):
    """A scalar regression head in symlog space: the critic's `head="mse"`.

    One zero-initialised `Dense(1)` predicts `symlog(G)` directly; the loss
    is `0.5 * (v - symlog(G))^2` and the slow-critic regulariser
    `0.5 * (v - v_ema)^2` (only the `"two_hot_mean"` form, which for a
    regression head is the squared distance to the slow critic's value).
    The logits are the prediction itself, `[..., 1]`. There is no support:
    targets are not clipped and `clipped_fraction` is 0. The bucket options
    are kept (and checked) only so that configs stay uniform.

    Args:
        **kwargs: as `ValueHead` (`members`, `dtype`, ...).

    Call arguments:
        inputs: `[..., dim]` (`[K, B, dim]` with members).

    Returns:
        `(value_symlog [...], logits [..., 1])`.

    Example:
        >>> value, logits = MSEHead()(np.ones((2, 256), "float32"))
        >>> value.shape, logits.shape
        ((2,), (2, 1))

    Reference:
        Hafner et al. 2023 (symlog regression, eq. 1); TorchRL's DreamerV3
        value loss (symlog MSE).
    """

    regularizers = ("two_hot_mean",)

    @staticmethod
    def output_units(num_buckets: int) -> int:
        return 1

    @staticmethod
    def decode(logits, num_buckets, lower_bound, upper_bound, bin_scheme, **options):
        return logits[..., 0]

    @staticmethod
    def position_losses(logits, value_targets, ema_value_symlog, ema_logits, *, regularizer, num_buckets,
                        lower_bound, upper_bound, bin_scheme, **options):
        value = logits[..., 0]
        value_term = 0.5 * ops.square(value - symlog(value_targets))
        ema_term = None if ema_value_symlog is None else 0.5 * ops.square(value - ema_value_symlog)
        return value_term, ema_term

    @staticmethod
    def has_support() -> bool:
        return False
