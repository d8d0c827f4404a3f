"""`ReturnNormalizer`: the offset and scale of a reward stream's returns, for normalising advantages."""

from __future__ import annotations

import warnings
from typing import Dict, Mapping, Tuple

import keras
from keras import ops

from multicritic import backend as _backend
from multicritic.validation import as_float32, number

IMPLS = ("perc", "perc_ema", "meanstd", "none")

# The names of each impl's batch statistics (the keys of `statistics()` and of what `update_from` reads).
STATISTIC_NAMES: Dict[str, Tuple[str, ...]] = {
    "perc": ("return_low", "return_high"),
    "perc_ema": ("return_low", "return_high"),
    "meanstd": ("return_mean", "return_sqmean"),
    "none": (),
}


@keras.saving.register_keras_serializable(package="multicritic")
class ReturnNormalizer(keras.layers.Layer):
    """The offset and scale of lambda-returns, as DreamerV3 normalises its actor's advantages.

    Every update moves exponential moving averages (rate `r = 1 - decay`)
    towards statistics of one (data-parallel: gathered) batch of returns `x`:

    - `"perc"` (the 2024 code's `Normalize`) and `"perc_ema"` (its 2023 name,
      as in RLlib; the default): `lo <- (1 - r) lo + r P_low(x)` and
      `hi <- (1 - r) hi + r P_high(x)`, where `P_q` is the q-th percentile
      with linear interpolation (numpy's default; 5 and 95).
    - `"meanstd"`: `mean <- (1 - r) mean + r mean(x)` and
      `sqmean <- (1 - r) sqmean + r mean(x^2)`.
    - `"none"`: nothing.
    - with `debias` (any impl but `"none"`) also `corr <- (1 - r) corr + r`,
      so that `corr = 1 - (1 - r)^n` after `n` updates.

    With `c = 1 / max(r, corr)` if `debias` else `c = 1`:

    - perc, perc_ema: `offset = lo c`, `scale = max(limit, hi c - lo c)`.
    - meanstd: `offset = mean c`,
      `scale = max(limit, sqrt(relu(sqmean c - (mean c)^2)))`.
    - none: `offset = 0`, `scale = 1`.

    `normalize(x) = (x - offset()) / scale()`. Advantages divided by `scale()`
    keep their size whatever the reward scale, and small returns are not
    blown up. The state variables are float32 scalars, non-trainable, start at
    0 and travel with trainer checkpoints: `low`, `high` (perc, perc_ema and,
    unused, none: today's layout), `mean`, `sqmean` (meanstd), `corr`
    (debias). They depend only on the config.

    `CriticTrainer` computes `statistics` of the gathered batch inside its
    compiled step and moves the EMAs with `update_from`; `update(returns)`
    does both at once (`all_gather` of the current backend, then the update).

    Args:
        impl: `"perc_ema"` (default), `"perc"`, `"meanstd"` or `"none"`.
        decay: the EMA decay, in `[0, 1)` (0.99).
        rate: the EMA rate, the 2024 code's name, in `(0, 1]`; if given,
            `decay = 1 - rate` (None: `rate = 1 - decay`).
        low_percentile, high_percentile: the percentiles in `[0, 100]`,
            low < high (5, 95).
        limit: the smallest scale, > 0 (1.0; the 2024 code uses 1 for its
            return normaliser).
        debias: divide the EMAs by `max(rate, corr)` (the 2024 code's
            `debias`; False: the 2023 behaviour).
        **kwargs: passed to `keras.layers.Layer`.

    Call arguments:
        Not a callable layer: use `statistics`, `update_from`, `update`,
        `offset`, `scale` and `normalize`.

    Example:
        >>> norm = ReturnNormalizer(impl="perc", rate=0.01, debias=True)
        >>> norm.update(returns)  # or norm.update_from(norm.statistics(returns))
        >>> advantages = (returns - values) / norm.scale()

    Reference:
        Hafner et al. 2023, "Mastering Diverse Domains through World Models",
        Sec. 3 "Actor learning", eq. 11 (arXiv 2301.04104); the 2024 code,
        danijar/dreamerv3 `embodied/jax/utils.py` `Normalize` (commit
        e3f02248693a79dc8b0ebd62c93683888ddaccfe).
    """

    def __init__(
        self,
        *,
        impl="perc_ema",
        decay=0.99,
        rate=None,
        low_percentile=5.0,
        high_percentile=95.0,
        limit=1.0,
        debias=False,
        **kwargs,
    ):
        if not isinstance(impl, str) or impl not in IMPLS:
            raise ValueError(f"impl: got {impl!r}, expected one of {list(IMPLS)}.")
        if rate is not None:
            rate = number("rate", rate, low=0.0, high=1.0, low_open=True)
            given = number("decay", decay, low=0.0, high=1.0)
            if given != 0.99 and abs(given - (1.0 - rate)) > 1e-12:
                raise ValueError(f"rate/decay: got rate={rate!r} and decay={decay!r}, expected one of them "
                                 "(decay = 1 - rate).")
            decay = 1.0 - rate
        else:
            decay = number("decay", decay, low=0.0, high=1.0)
            if decay >= 1.0:
                raise ValueError(f"decay: got {decay!r}, expected a finite number in [0, 1) (rate = 1 - decay > 0).")
            rate = 1.0 - decay
        if not isinstance(debias, bool):
            raise ValueError(f"debias: got {debias!r}, expected True or False.")
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.impl = impl
        self.decay = decay
        self.rate = rate
        self.low_percentile = number("low_percentile", low_percentile, low=0.0, high=100.0)
        self.high_percentile = number("high_percentile", high_percentile, low=0.0, high=100.0)
        if self.low_percentile >= self.high_percentile:
            raise ValueError(
                f"low_percentile/high_percentile: got ({low_percentile!r}, {high_percentile!r}), expected low < high."
            )
        self.limit = number("limit", limit, low=0.0, low_open=True)
        self.debias = debias

        def state(name):
            return self.add_weight(name=name, shape=(), initializer="zeros", trainable=False, dtype="float32")

        if impl == "meanstd":
            self.mean = state("mean")
            self.sqmean = state("sqmean")
        else:  # perc, perc_ema; none keeps today's (unused) pair so that its checkpoints still load
            self.low = state("low")
            self.high = state("high")
        if debias and impl != "none":
            self.corr = state("corr")
        self.built = True

    @property
    def statistic_names(self) -> Tuple[str, ...]:
        """The names of this impl's batch statistics, the keys of `statistics()`."""
        return STATISTIC_NAMES[self.impl]

    def statistics(self, returns) -> Dict[str, object]:
        """`{name: float32 scalar}`: the statistics of one batch of `returns` (any shape), as it is (no
        all-gather): the percentiles (perc, perc_ema), `mean(x)` and `mean(x^2)` (meanstd), nothing (none)."""
        if self.impl == "none":
            return {}
        x = ops.reshape(as_float32(returns), (-1,))
        if self.impl == "meanstd":
            return {"return_mean": ops.mean(x), "return_sqmean": ops.mean(ops.square(x))}
        q = ops.quantile(x, [self.low_percentile / 100.0, self.high_percentile / 100.0])
        return {"return_low": q[0], "return_high": q[1]}

    def update_from(self, stats: Mapping) -> None:
        """Moves the EMAs (and `corr`) towards the batch statistics `stats` (a dict with
        `statistic_names` as keys, as `statistics()` returns), through `Variable.assign`."""
        if self.impl == "none":
            return
        if not isinstance(stats, Mapping):
            raise ValueError(f"stats: got a {type(stats).__name__}, expected a dict with keys "
                             f"{list(self.statistic_names)}.")
        missing = [k for k in self.statistic_names if k not in stats]
        if missing:
            raise ValueError(f"stats: missing {missing}, expected the keys {list(self.statistic_names)} "
                             f"(impl {self.impl!r}).")
        first, second = (as_float32(stats[k]) for k in self.statistic_names)
        a, b = (self.mean, self.sqmean) if self.impl == "meanstd" else (self.low, self.high)
        a.assign(self.decay * a + self.rate * first)
        b.assign(self.decay * b + self.rate * second)
        if self.debias:
            self.corr.assign(self.decay * self.corr + self.rate)

    def update(self, returns, *old_high) -> None:
        """Moves the EMAs towards the statistics of the global batch of `returns`: `update_from(statistics(
        all_gather(returns)))` (`all_gather` of the current backend: identity without data parallelism).

        The old two-argument form `update(low, high)` (the percentiles, perc and perc_ema only) still works
        and means `update_from({"return_low": low, "return_high": high})`; it is deprecated.
        """
        if old_high:
            if len(old_high) != 1:
                raise ValueError(f"update: got {1 + len(old_high)} arguments, expected update(returns).")
            if self.impl not in ("perc", "perc_ema"):
                raise ValueError(f"update(low, high): the old two-argument form is for impl 'perc' or "
                                 f"'perc_ema', got impl {self.impl!r}; use update(returns) or update_from(stats).")
            warnings.warn("ReturnNormalizer.update(low, high) is deprecated: use update(returns) or "
                          "update_from(statistics).", DeprecationWarning, stacklevel=2)
            self.update_from({"return_low": returns, "return_high": old_high[0]})
            return
        if self.impl == "none":
            return
        self.update_from(self.statistics(_backend.current().all_gather(returns)))

    def _correction(self):
        """`1 / max(rate, corr)` with debias, else None (a factor of 1)."""
        return 1.0 / ops.maximum(self.rate, self.corr) if self.debias else None

    def offset(self):
        """`lo c` (perc, perc_ema), `mean c` (meanstd), 0 (none); a float32 scalar."""
        if self.impl == "none":
            return ops.zeros((), "float32")
        value = self.mean if self.impl == "meanstd" else self.low
        c = self._correction()
        return ops.convert_to_tensor(value) if c is None else value * c

    def scale(self):
        """`max(limit, hi c - lo c)` (perc, perc_ema), `max(limit, sqrt(relu(sqmean c - (mean c)^2)))`
        (meanstd), 1 (none); a float32 scalar."""
        if self.impl == "none":
            return ops.ones((), "float32")
        c = self._correction()
        if self.impl == "meanstd":
            mean, sqmean = (self.mean, self.sqmean) if c is None else (self.mean * c, self.sqmean * c)
            return ops.maximum(self.limit, ops.sqrt(ops.relu(sqmean - ops.square(mean))))
        if c is None:
            return ops.maximum(self.limit, self.high - self.low)
        return ops.maximum(self.limit, self.high * c - self.low * c)

    def normalize(self, x):
        """`(x - offset()) / scale()` (`x`: a backend tensor or host array)."""
        if not ops.is_tensor(x):
            x = ops.convert_to_tensor(x)
        return ops.divide(ops.subtract(x, self.offset()), self.scale())

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "impl": self.impl,
                "decay": self.decay,
                "low_percentile": self.low_percentile,
                "high_percentile": self.high_percentile,
                "limit": self.limit,
                "debias": self.debias,
            }
        )
        return config
