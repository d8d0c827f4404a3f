"""The symlog MSE value head: a regression baseline."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from multicritic.math.bins import inverse_symlog, symlog as symlog_fn
from multicritic.heads.base import ValueHead


@keras.saving.register_keras_serializable(package="multicritic")
class MSEHead(ValueHead):
    """A scalar regression head: the critic's `head="mse"`.

    One zero-initialised `Dense(1)` predicts `symlog(G)` directly; the loss
    is `0.5 * (v - symlog(G))^2` and the slow-critic regulariser
    `0.5 * (v - v_ema)^2` (only the `"two_hot_mean"` form, which for a
    regression head is the squared distance to the slow critic's value).
    The logits are the prediction itself, `[..., 1]`. There is no support:
    targets are not clipped and `clipped_fraction` is 0. The bucket options
    are kept (and checked) only so that configs stay uniform.

    With `symlog=False` it is the plain regression critic of model-free
    agents (PPO's value loss): it predicts `G` itself, the loss is
    `0.5 * (v - G)^2` in real space and the decoded value is `symlog(v)`
    (the critic's values are symlog-space). Its gradients grow with the
    reward scale: the ablation the symlog transform answers.

    Args:
        symlog: regress on `symlog(G)` (True, DreamerV3) or on `G` (False).
        **kwargs: as `ValueHead` (`members`, `dtype`, ...).

    Call arguments:
        inputs: `[..., dim]` (`[K, B, dim]` with members).

    Returns:
        `(value_symlog [...], logits [..., 1])`.

    Examples:
        >>> value, logits = MSEHead()(np.ones((2, 256), "float32"))
        >>> value.shape, logits.shape
        ((2,), (2, 1))

    Reference:
        Hafner et al. 2023 (symlog regression, eq. 1); TorchRL's DreamerV3
        value loss (symlog MSE).
    """

    regularizers = ("two_hot_mean",)

    def __init__(self, *, symlog: bool = True, **kwargs):
        if not isinstance(symlog, (bool, np.bool_)):
            raise ValueError(f"symlog: got {symlog!r}, expected True or False.")
        self.symlog = bool(symlog)
        super().__init__(**kwargs)

    @property
    def units(self) -> int:
        return 1

    def decode(self, logits):
        value = logits[..., 0]
        # The critic's values are symlog-space: a raw regression's prediction is mapped there.
        return value if self.symlog else symlog_fn(value)

    def position_losses(self, logits, value_targets, ema_value_symlog, ema_logits, *, regularizer):
        value = logits[..., 0]
        if self.symlog:
            value_term = 0.5 * ops.square(value - symlog_fn(value_targets))
            ema_term = None if ema_value_symlog is None else 0.5 * ops.square(value - ema_value_symlog)
        else:
            value_term = 0.5 * ops.square(value - value_targets)
            ema_term = None if ema_value_symlog is None else 0.5 * ops.square(value - inverse_symlog(ema_value_symlog))
        return value_term, ema_term

    def outside_support(self, value_targets):
        return None

    def get_config(self):
        config = super().get_config()
        config["symlog"] = self.symlog
        return config
