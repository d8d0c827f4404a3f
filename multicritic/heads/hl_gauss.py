"""The HL-Gauss value head: cross-entropy to a Gaussian histogram of the target."""

from __future__ import annotations

import functools
import math

import keras
import numpy as np
from keras import ops

from multicritic.backend import contract as backend
from multicritic.math.bins import check_bin_args, constant, symlog
from multicritic.heads.base import ValueHead, cross_entropy
from multicritic.validation import number

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)


@functools.lru_cache(maxsize=None)
def _edges(num_buckets, lower_bound, upper_bound):
    """Bin edges of the uniform symlog grid (centres +- half a spacing), as a cached tuple."""
    width = (upper_bound - lower_bound) / (num_buckets - 1)
    edges = lower_bound - width / 2 + width * np.arange(num_buckets + 1, dtype=np.float64)
    return tuple(float(e) for e in edges.astype(np.float32)), width


def check_sigma(
    sigma, num_buckets: int = 255, lower_bound: float = -20.0, upper_bound: float = 20.0, name: str = "hl_gauss_sigma"
) -> float:
    """`sigma` as a float if its histograms are finite in float32 on this support, else a `ValueError`.

    The histogram takes `erf((edge - value) * scale)` with `scale = 1 / (sigma * width * sqrt(2))`, for
    distances `|edge - value|` up to `span = upper_bound - lower_bound + width` (values are clipped to the
    outer centres): those products must stay below float32's largest number, so
    `sigma >= max(1, span) / (width * sqrt(2) * float32_max)` (5e-37 on the default support); and the total
    mass, at least `2 * erf(scale * width / 2)`, must stay above float32's smallest normal number, so
    `sigma <= 1 / (2 * sqrt(2) * float32_tiny)` (3e37). Past either end a histogram row is NaN.
    """
    check_bin_args(num_buckets, lower_bound, upper_bound)
    sigma = number(name, sigma, low=0.0, low_open=True)
    width = (float(upper_bound) - float(lower_bound)) / (int(num_buckets) - 1)
    low = max(1.0, float(upper_bound) - float(lower_bound) + width) / (width * math.sqrt(2.0) * _FLOAT32_MAX)
    high = 1.0 / (2.0 * math.sqrt(2.0) * _FLOAT32_TINY)
    if not low <= sigma <= high:
        raise ValueError(
            f"{name}: got {sigma!r}, expected a number in [{low:.3g}, {high:.3g}] (a ratio of the bucket width "
            f"{width:g}; beyond it the histograms overflow or vanish in float32)."
        )
    return sigma


def hl_gauss(
    values_symlog, num_buckets: int = 255, lower_bound: float = -20.0, upper_bound: float = 20.0, sigma: float = 0.75
):
    """Histogram loss targets: the mass of `N(clip(value), (sigma * width)^2)` in each bucket.

    Buckets are the uniform symlog grid (`num_buckets` centres from
    `lower_bound` to `upper_bound`, spacing `width`); bucket `i` covers
    `[c_i - width/2, c_i + width/2]`. Values are clipped to the outer
    centres, and the mass beyond the outer edges is dropped before
    normalising (the paper's truncated Gaussian), so each row sums to 1.

    Args:
        values_symlog: `[...]` symlog-space values.
        num_buckets: buckets of the support.
        lower_bound: symlog-space lower end of the support.
        upper_bound: symlog-space upper end of the support.
        sigma: the Gaussian's standard deviation as a ratio of the bucket
            width (0.75 in the paper: about six buckets get mass).

    Returns:
        float32 `[..., num_buckets]` probabilities.

    Raises:
        ValueError: for a `sigma` whose histograms are not finite in float32
            (see `check_sigma`).

    Reference:
        Farebrother et al., "Stop Regressing: Training Value Functions via
        Classification for Scalable Deep RL", ICML 2024 (arXiv 2403.03950),
        Sec. 3.1 and Listing 1.
    """
    sigma = check_sigma(sigma, num_buckets, lower_bound, upper_bound, name="sigma")
    edges, width = _edges(int(num_buckets), float(lower_bound), float(upper_bound))
    values = ops.clip(ops.cast(values_symlog, "float32"), lower_bound, upper_bound)
    scale = 1.0 / (sigma * width * math.sqrt(2.0))
    cdf = ops.erf((constant(edges) - values[..., None]) * scale)
    mass = cdf[..., 1:] - cdf[..., :-1]
    return mass / (cdf[..., -1:] - cdf[..., :1])


@keras.saving.register_keras_serializable(package="multicritic")
class HLGaussHead(ValueHead):
    """A distributional head trained on HL-Gauss targets (Farebrother et al., 2024): the critic's `head="hl_gauss"`.

    The same zero-initialised `Dense(num_buckets)` and decode as the two-hot
    head (`RewardPredictorLayer`); the target of a return `G` is the
    Gaussian histogram `hl_gauss(symlog(G))` instead of its two-hot encoding,
    which spreads the label over neighbouring buckets. Needs a uniform grid:
    `bin_scheme="uniform_symlog"`. The slow-critic regulariser
    `"two_hot_mean"` uses the HL-Gauss histogram of the slow critic's value.

    Args:
        sigma: the Gaussian's standard deviation as a ratio of the bucket
            width (0.75, the paper's default); values whose histograms
            float32 cannot hold are refused (see `check_sigma`).
        **kwargs: as `ValueHead` (`num_buckets`, bounds, `members`, ...).

    Call arguments:
        inputs: `[..., dim]` (`[K, B, dim]` with members).

    Returns:
        `(value_symlog, logits)` as `TwoHotHead`.

    Examples:
        >>> head = HLGaussHead(sigma=0.75)
        >>> value, logits = head(np.ones((2, 256), "float32"))
        >>> logits.shape
        (2, 255)

    Reference:
        Farebrother et al., "Stop Regressing", arXiv 2403.03950;
        Imani & White, "Improving Regression Performance with Distributional
        Losses", ICML 2018.
    """

    def __init__(self, *, sigma: float = 0.75, **kwargs):
        self.sigma = check_sigma(
            sigma,
            kwargs.get("num_buckets", 255),
            kwargs.get("lower_bound", -20.0),
            kwargs.get("upper_bound", 20.0),
            name="sigma",
        )
        super().__init__(**kwargs)

    def position_losses(self, logits, value_targets, ema_value_symlog, ema_logits, *, regularizer):
        logp = backend.current().log_softmax(logits)
        support = (self.num_buckets, self.lower_bound, self.upper_bound, self.sigma)
        if ema_value_symlog is not None and regularizer == "two_hot_mean":
            both = hl_gauss(ops.stack([symlog(value_targets), ema_value_symlog], axis=-1), *support)
            return cross_entropy(both[..., 0, :], logp), cross_entropy(both[..., 1, :], logp)
        value_term = cross_entropy(hl_gauss(symlog(value_targets), *support), logp)
        if ema_logits is None:
            return value_term, None
        return value_term, cross_entropy(ops.stop_gradient(backend.current().softmax(ema_logits)), logp)

    def get_config(self):
        config = super().get_config()
        config["sigma"] = self.sigma
        return config
