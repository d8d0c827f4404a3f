"""The quantile-regression value head: a distributional critic without buckets."""

from __future__ import annotations

import functools

import keras
import numpy as np
from keras import ops

from multicritic.math.bins import constant, symlog
from multicritic.heads.base import ValueHead
from multicritic.validation import integer, number


# symexp(80) ~ 5.5e34: the mean of the quantiles' returns stays finite in float32.
_EXP_LIMIT = 80.0


@functools.lru_cache(maxsize=None)
def _midpoints(n):
    """The quantile levels `(2i + 1) / (2n)`, as a cached tuple of float32-exact floats."""
    return tuple(float(t) for t in ((2 * np.arange(n) + 1) / (2 * n)).astype(np.float32))


@keras.saving.register_keras_serializable(package="multicritic")
class QuantileHead(ValueHead):
    """A quantile-regression head (Dabney et al. 2018): the critic's `head="quantile"`.

    One zero-initialised `Dense(num_quantiles)` predicts the quantiles
    `q_i` of the return's distribution in symlog space at the midpoints
    `tau_i = (2i + 1) / (2 * num_quantiles)`; the value is their mean. The
    loss is the quantile Huber loss of each quantile against the symlog
    target, `|tau_i - 1{u_i < 0}| * huber_kappa(u_i) / kappa` with
    `u_i = symlog(G) - q_i`, summed over the quantiles as in the paper's
    eq. 10 (averaged, the slow-critic regulariser on the value would
    outweigh each quantile's own term `num_quantiles` to 1). The value is the mean return,
    `symlog(mean_i symexp(q_i))` (the return's quantiles are `symexp(q_i)`).
    The slow-critic regulariser
    (`"two_hot_mean"`, the only one) is `0.5 * (v - v_ema)^2` on the decoded
    value, as BRO regularises its distributional critic. The logits are the
    quantiles, `[..., num_quantiles]`; there is no bucket support (targets
    are not clipped; the bucket options are kept only so that configs stay
    uniform).

    Args:
        num_quantiles: quantiles predicted (>= 1; 100 in BRO).
        kappa: the Huber loss's threshold (> 0; 1.0 in QR-DQN).
        **kwargs: as `ValueHead` (`members`, `dtype`, ...).

    Call arguments:
        inputs: `[..., dim]` (`[K, B, dim]` with members).

    Returns:
        `(value_symlog [...], quantiles [..., num_quantiles])`, float32.

    Examples:
        >>> head = QuantileHead(num_quantiles=32)
        >>> value, quantiles = head(np.ones((2, 256), "float32"))
        >>> value.shape, quantiles.shape
        ((2,), (2, 32))

    Reference:
        Dabney et al., "Distributional Reinforcement Learning with Quantile
        Regression", AAAI 2018 (arXiv 1710.10044), eq. 9-10; Nauman et al.,
        "Bigger, Regularized, Optimistic" (BRO), NeurIPS 2024.
    """

    regularizers = ("two_hot_mean",)

    def __init__(self, *, num_quantiles: int = 100, kappa: float = 1.0, **kwargs):
        self.num_quantiles = integer("num_quantiles", num_quantiles)
        self.kappa = number("kappa", kappa, low=0.0, low_open=True)
        super().__init__(**kwargs)

    @property
    def units(self) -> int:
        return self.num_quantiles

    def decode(self, logits):
        # The return's quantiles are symexp(q_i) (quantiles commute with a monotone map): the value is the mean
        # return, in symlog space, not the mean of the symlog quantiles (which is biased towards 0 for a wide
        # distribution). Clipped where float32's exp would overflow.
        q = ops.clip(logits, -_EXP_LIMIT, _EXP_LIMIT)
        # exp(|q|) - 1 rather than expm1, which PyTorch's ONNX exporter has no kernel for.
        return symlog(ops.mean(ops.sign(q) * (ops.exp(ops.abs(q)) - 1.0), axis=-1))

    def position_losses(self, logits, value_targets, ema_value_symlog, ema_logits, *, regularizer):
        taus = constant(_midpoints(self.num_quantiles))
        u = symlog(value_targets)[..., None] - logits
        abs_u = ops.abs(u)
        huber = ops.where(abs_u <= self.kappa, 0.5 * ops.square(u), self.kappa * (abs_u - 0.5 * self.kappa))
        weight = ops.abs(taus - ops.cast(u < 0.0, "float32"))
        value_term = ops.sum(weight * huber, axis=-1) / self.kappa
        if ema_value_symlog is None:
            return value_term, None
        return value_term, 0.5 * ops.square(self.decode(logits) - ema_value_symlog)

    def outside_support(self, value_targets):
        return None

    def get_config(self):
        config = super().get_config()
        config.update({"num_quantiles": self.num_quantiles, "kappa": self.kappa})
        return config
