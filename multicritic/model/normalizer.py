"""`ReturnNormalizer`: the offset and scale of a reward stream's returns, for normalising advantages."""

from __future__ import annotations

import math
import warnings
from typing import Dict, Mapping, Tuple

import keras
import numpy as np
from keras import ops

from multicritic.backend import contract as _backend
from multicritic.validation import as_float32, fmt, number, real_values

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

    Non-finite returns never enter the statistics: a batch's statistics are
    those of its finite returns, and an update whose statistics are not
    finite (no finite return, an empty batch, a mean of squares beyond
    float32's range) leaves every state variable as it was, inside compiled
    steps too (as a trainer skips a step). Host data (numpy arrays, Python
    numbers) holding a non-finite value, an empty batch or statistics
    float32 cannot hold is refused with a `ValueError` instead, before
    anything changes.

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
        decay: the EMA decay, in `[0, 1)` (None: 0.99, or `1 - rate`).
        rate: the EMA rate, the 2024 code's name, in `(0, 1]`; if given,
            `decay = 1 - rate` (None: `rate = 1 - decay`). Give one of the
            two (both: only if `decay == 1 - rate`).
        low_percentile: the low percentile in `[0, 100]`, below
            `high_percentile` (5).
        high_percentile: the high percentile in `[0, 100]` (95).
        limit: the smallest scale, > 0 (1.0; the 2024 code uses 1 for its
            return normaliser).
        debias: divide the EMAs by `max(rate, corr)` (the 2024 code's
            `debias`; False: the 2023 behaviour).
        **kwargs: passed to `keras.layers.Layer`.

    Call arguments:
        Not a callable layer: use `statistics`, `update_from`, `update`,
        `offset`, `scale` and `normalize`.

    Examples:
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
        decay=None,
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
            if decay is not None and abs(number("decay", decay, low=0.0, high=1.0) - (1.0 - rate)) > 1e-12:
                raise ValueError(
                    f"rate/decay: got rate={rate!r} and decay={decay!r}, expected one of them (decay = 1 - rate)."
                )
            decay = 1.0 - rate
        else:
            decay = number("decay", 0.99 if decay is None else decay, low=0.0, high=1.0)
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
        """`{name: float32 scalar}`: the statistics of the finite values of one batch of `returns` (any
        shape), as it is (no all-gather): the percentiles (perc, perc_ema), `mean(x)` and `mean(x^2)`
        (meanstd), nothing (none). Not finite when no value is (an update from them changes nothing).

        Host data is checked first: a `ValueError` for non-finite values or an empty batch."""
        returns = self._returns(returns)
        if self.impl == "none":
            return {}
        x = ops.reshape(returns, (-1,))
        finite = ops.isfinite(x)
        count = ops.sum(ops.cast(finite, "float32"))
        if self.impl == "meanstd":
            kept = ops.where(finite, x, 0.0)
            # 0 / 0 (no finite value) is NaN: such statistics change nothing.
            return {"return_mean": ops.sum(kept) / count, "return_sqmean": ops.sum(ops.square(kept)) / count}
        # Percentiles with linear interpolation (numpy's default) over the finite values, sorted first.
        ordered = ops.sort(ops.where(finite, x, float("inf")))
        last = ops.maximum(count - 1.0, 0.0)

        def percentile(q):
            position = (q / 100.0) * (count - 1.0)
            below = ops.floor(position)
            i = ops.cast(ops.maximum(below, 0.0), "int32")
            j = ops.cast(ops.minimum(below + 1.0, last), "int32")
            a, b = ops.take(ordered, i), ops.take(ordered, j)
            value = a + (position - below) * (b - a)
            return ops.where(count > 0.0, value, float("nan"))

        return {"return_low": percentile(self.low_percentile), "return_high": percentile(self.high_percentile)}

    def _returns(self, returns):
        """`returns` as float32 (a backend tensor or host data); host data must be finite and not empty."""
        returns = real_values("returns", returns)
        if isinstance(returns, np.ndarray):
            if returns.size == 0:
                raise ValueError(f"returns: got an array of shape {fmt(returns.shape)}, expected at least one return.")
            with np.errstate(over="ignore", invalid="ignore"):
                as32 = returns.astype(np.float32)
            if not np.isfinite(as32).all():
                raise ValueError(
                    f"returns: got {int((~np.isfinite(as32)).sum())} non-finite value(s) (as float32) in "
                    f"an array of shape {fmt(returns.shape)}, expected finite returns."
                )
            returns = as32
        return as_float32(returns)

    def update_from(self, stats: Mapping) -> None:
        """Moves the EMAs (and `corr`) towards the batch statistics `stats` (a dict with
        `statistic_names` as keys, as `statistics()` returns), through `Variable.assign`.

        Statistics that are not finite leave every variable as it was (a select, so inside a compiled step
        too); host numbers that are not finite raise a `ValueError` before anything changes."""
        if not isinstance(stats, Mapping):
            raise ValueError(
                f"stats: got a {type(stats).__name__}, expected a dict with keys {list(self.statistic_names)}."
            )
        missing = [k for k in self.statistic_names if k not in stats]
        extra = sorted(str(k) for k in stats if k not in self.statistic_names)
        if missing or extra:
            got = f"missing {missing}" if missing else f"unexpected {extra}"
            raise ValueError(f"stats: {got}, expected the keys {list(self.statistic_names)} (impl {self.impl!r}).")
        if self.impl == "none":
            return
        values = []
        for name in self.statistic_names:
            value = real_values(f"stats[{name!r}]", stats[name])
            if isinstance(value, np.ndarray):
                if value.size != 1:
                    raise ValueError(f"stats[{name!r}]: got an array of shape {fmt(value.shape)}, expected a scalar.")
                with np.errstate(over="ignore", invalid="ignore"):
                    value = value.astype(np.float32).reshape(())
                if not np.isfinite(value):
                    raise ValueError(f"stats[{name!r}]: got {float(value)!r} (as float32), expected a finite number.")
            elif tuple(value.shape) not in ((), (1,)):
                raise ValueError(
                    f"stats[{name!r}]: got a tensor of shape {fmt(tuple(value.shape))}, expected a scalar."
                )
            values.append(ops.reshape(as_float32(value), ()))
        first, second = values
        # A non-finite statistic (no finite return, an overflow) keeps the old state, all of it.
        ok = ops.logical_and(ops.isfinite(first), ops.isfinite(second))
        a, b = (self.mean, self.sqmean) if self.impl == "meanstd" else (self.low, self.high)
        a.assign(ops.where(ok, self.decay * a.value + self.rate * first, a.value))
        b.assign(ops.where(ok, self.decay * b.value + self.rate * second, b.value))
        if self.debias:
            self.corr.assign(ops.where(ok, self.decay * self.corr.value + self.rate, self.corr.value))

    def update(self, returns, *old_high) -> None:
        """Moves the EMAs towards the statistics of the global batch of `returns`: `update_from(statistics(
        all_gather(returns)))` (`all_gather` of the current backend: identity without data parallelism).

        Host data is checked first (a `ValueError` for non-finite values, an empty batch, or statistics
        float32 cannot hold); a backend tensor's non-finite values are left out of the statistics, and
        statistics that are not finite change nothing.

        The old two-argument form `update(low, high)` (the percentiles, perc and perc_ema only) still works
        and means `update_from({"return_low": low, "return_high": high})`; it is deprecated.
        """
        if old_high:
            if len(old_high) != 1:
                raise ValueError(f"update: got {1 + len(old_high)} arguments, expected update(returns).")
            if self.impl not in ("perc", "perc_ema"):
                raise ValueError(
                    f"update(low, high): the old two-argument form is for impl 'perc' or "
                    f"'perc_ema', got impl {self.impl!r}; use update(returns) or update_from(stats)."
                )
            warnings.warn(
                "ReturnNormalizer.update(low, high) is deprecated: use update(returns) or update_from(statistics).",
                DeprecationWarning,
                stacklevel=2,
            )
            self.update_from({"return_low": returns, "return_high": old_high[0]})
            return
        host = not ops.is_tensor(returns)
        returns = self._returns(returns)
        if self.impl == "none":
            return
        stats = self.statistics(_backend.current().all_gather(returns))
        if host:
            for name, value in stats.items():
                value = float(ops.convert_to_numpy(value))
                if not math.isfinite(value):
                    raise ValueError(
                        f"returns: its {name} is {value!r} in float32 (returns up to "
                        f"{float(np.abs(ops.convert_to_numpy(returns)).max()):g}), expected statistics "
                        "float32 can hold."
                    )
        self.update_from(stats)

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
        x = real_values("x", x)
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
