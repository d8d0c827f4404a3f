"""`ReturnNormalizer`: the scale of a reward stream's returns, for normalising advantages."""

from __future__ import annotations

import keras
from keras import ops

from multicritic.validation import number

IMPLS = ("perc_ema", "none")


@keras.saving.register_keras_serializable(package="multicritic")
class ReturnNormalizer(keras.layers.Layer):
    """Tracks the spread of lambda-returns, `S = EMA(P95) - EMA(P5)`, as DreamerV3 (2023) does for its actor.

    `scale()` is `max(limit, S)`: advantages divided by it keep their size
    whatever the reward scale, and small returns are not blown up. The
    statistics are computed from the whole (data-parallel: gathered) batch of
    returns, then `update` moves the EMAs; `CriticTrainer` does both inside
    its compiled step for every reward stream of a `MultiCritic`. Its two
    variables are non-trainable and travel with trainer checkpoints.

    Args:
        impl: `"perc_ema"` (percentiles, EMA'd) or `"none"` (scale 1).
        decay: EMA decay of the percentiles (0.99).
        low_percentile, high_percentile: the percentiles (5, 95).
        limit: the smallest scale (1.0).
        **kwargs: passed to `keras.layers.Layer`.

    Example:
        >>> norm = ReturnNormalizer()
        >>> norm.update(*norm.statistics(returns))
        >>> advantages = (returns - values) / norm.scale()

    Reference:
        Hafner et al. 2023, Sec. 3 "Actor learning", eq. 11 (arXiv 2301.04104).
    """

    def __init__(self, *, impl="perc_ema", decay=0.99, low_percentile=5.0, high_percentile=95.0, limit=1.0, **kwargs):
        if not isinstance(impl, str) or impl not in IMPLS:
            raise ValueError(f"impl: got {impl!r}, expected one of {list(IMPLS)}.")
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.impl = impl
        self.decay = number("decay", decay, low=0.0, high=1.0)
        self.low_percentile = number("low_percentile", low_percentile, low=0.0, high=100.0)
        self.high_percentile = number("high_percentile", high_percentile, low=0.0, high=100.0)
        if self.low_percentile >= self.high_percentile:
            raise ValueError(
                f"low_percentile/high_percentile: got ({low_percentile!r}, {high_percentile!r}), expected low < high."
            )
        self.limit = number("limit", limit, low=0.0, low_open=True)
        self.low = self.add_weight(name="low", shape=(), initializer="zeros", trainable=False)
        self.high = self.add_weight(name="high", shape=(), initializer="zeros", trainable=False)
        self.built = True

    def statistics(self, returns):
        """`(low, high)` percentiles of `returns` (any shape), float32 scalars."""
        q = ops.quantile(ops.reshape(ops.cast(returns, "float32"), (-1,)),
                         [self.low_percentile / 100.0, self.high_percentile / 100.0])
        return q[0], q[1]

    def update(self, low, high) -> None:
        """Moves the EMAs towards this batch's percentiles."""
        if self.impl == "none":
            return
        self.low.assign(self.decay * self.low + (1.0 - self.decay) * low)
        self.high.assign(self.decay * self.high + (1.0 - self.decay) * high)

    def scale(self):
        if self.impl == "none":
            return ops.ones((), "float32")
        return ops.maximum(self.limit, self.high - self.low)

    def offset(self):
        return ops.zeros((), "float32") if self.impl == "none" else ops.convert_to_tensor(self.low)

    def normalize(self, x):
        """`(x - offset()) / scale()`."""
        return (x - self.offset()) / self.scale()

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "impl": self.impl,
                "decay": self.decay,
                "low_percentile": self.low_percentile,
                "high_percentile": self.high_percentile,
                "limit": self.limit,
            }
        )
        return config
