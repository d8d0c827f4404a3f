"""`ReturnNormalizer`: the offset and scale of a reward stream's returns, for normalising advantages."""

from __future__ import annotations

import math
import warnings
from typing import Dict, Mapping, Optional, Sequence, Tuple

import keras
import numpy as np
from keras import ops

from multicritic.backend import contract as _backend
from multicritic.validation import as_float32, dtype_name, fmt, integer, number, real_values, static_shape

IMPLS = ("perc", "perc_ema", "meanstd", "none")

# The names of each impl's batch statistics (the keys of `statistics()` and of what `update_from` reads).
STATISTIC_NAMES: Dict[str, Tuple[str, ...]] = {
    "perc": ("return_low", "return_high"),
    "perc_ema": ("return_low", "return_high"),
    "meanstd": ("return_mean", "return_sqmean"),
    "none": (),
}


def _interpolate(ordered, count, q, start=None):
    """The `q`-th percentile (linear interpolation, numpy's default) of `count` sorted values of `ordered`
    (`[M]`) from index `start` on (0 if None); `count` and `start` may be vectors (one per task). NaN where
    `count` is 0."""
    position = (q / 100.0) * (count - 1.0)
    below = ops.floor(position)
    i = ops.cast(ops.maximum(below, 0.0), "int32")
    j = ops.cast(ops.minimum(below + 1.0, ops.maximum(count - 1.0, 0.0)), "int32")
    if start is not None:  # (an absent task's start may be M: kept inside `ordered`, its value is NaN anyway)
        last = ops.shape(ordered)[0] - 1
        i, j = ops.minimum(start + i, last), ops.minimum(start + j, last)
    a, b = ops.take(ordered, i), ops.take(ordered, j)
    value = a + (position - below) * (b - a)
    return ops.where(count > 0.0, value, float("nan"))


def per_task_percentiles(x, task_ids, num_tasks: int, percentiles: Sequence[float]) -> Tuple:
    """Percentiles of each task's values, with linear interpolation (numpy's default), in one static-shape
    computation (no loop over tasks, no data-dependent shapes: it runs inside compiled steps).

    The values are ordered by `(task, value)` with integer keys `task * M + rank`, `rank` the value's rank
    in the whole batch: two argsorts and one sort of `M` keys, whatever the number of tasks.

    Args:
        x: `[M]` float32 values; non-finite ones are left out.
        task_ids: `[M]` int32 task of each value; one outside `[0, num_tasks)` is left out.
        num_tasks: the number of tasks `N` (static); `(N + 1) * M` must fit in int32.
        percentiles: the percentiles `q` in `[0, 100]`.

    Returns:
        One `[N]` float32 vector per percentile: task `t`'s `q`-th percentile of its finite values, NaN for
        a task with none.

    Reference:
        numpy.percentile (method "linear", Hyndman and Fan's type 7), applied to each task's values.
    """
    size = ops.shape(x)[0]
    if isinstance(size, int) and (num_tasks + 1) * size >= 2**31:
        raise ValueError(
            f"returns: got {size} returns for {num_tasks} tasks, expected (num_tasks + 1) * returns < 2**31 "
            "(the per-task sort's int32 keys)."
        )
    kept = ops.logical_and(ops.isfinite(x), ops.logical_and(task_ids >= 0, task_ids < num_tasks))
    bucket = ops.where(kept, task_ids, num_tasks)  # left-out values: a bucket N after every task's
    masked = ops.where(kept, x, float("inf"))
    order = ops.argsort(masked)
    rank = ops.cast(ops.argsort(order), "int32")  # the inverse permutation: each value's rank
    keys = ops.sort(bucket * size + rank)
    ordered = ops.take(ops.take(masked, order), ops.mod(keys, size))  # by task, then by value
    starts = ops.cast(ops.searchsorted(keys, ops.arange(num_tasks + 1, dtype="int32") * size), "int32")
    count = ops.cast(starts[1:] - starts[:-1], "float32")
    return tuple(_interpolate(ordered, count, q, start=starts[:-1]) for q in percentiles)


def _broadcasts(small, shape) -> bool:
    """Whether a shape `small` broadcasts to `shape` (unknown sizes, None, match anything)."""
    if len(small) > len(shape):
        return False
    tail = shape[len(shape) - len(small) :]
    return all(a is None or b is None or a in (1, b) for a, b in zip(small, tail))


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

    Per task (`num_tasks=N`), one normaliser holds `N` independent ones:
    every state variable is a vector `[N]`, and an update from returns with
    their `task_ids` moves each task's EMAs (and its `corr`) towards the
    statistics of that task's returns only. A task with no finite return in
    the batch keeps its state, its debias correction included, so each task
    follows exactly the normaliser above fed its own returns.
    `offset(task_ids)`, `scale(task_ids)` and `normalize(x, task_ids)` are
    per element. Task ids are integers in `[0, N)` of a shape that
    broadcasts to the returns' (`[B]` for returns `[T, B]`). Host ids that
    are not (out of range, not integers, another shape) are refused with a
    `ValueError` naming `task_ids` before anything changes; a backend
    tensor's ids outside `[0, N)` make the whole update change nothing (as
    non-finite statistics do) and give NaN offsets and scales.

    `normalize(x) = (x - offset()) / scale()`. Advantages divided by `scale()`
    keep their size whatever the reward scale, and small returns are not
    blown up. The state variables are float32 scalars (vectors `[N]` per
    task), non-trainable, start at 0 and travel with trainer checkpoints:
    `low`, `high` (perc, perc_ema and, unused, none: today's layout), `mean`,
    `sqmean` (meanstd), `corr` (debias). They depend only on the config.

    `CriticTrainer` computes `statistics` of the gathered batch inside its
    compiled step and moves the EMAs with `update_from` (per task: with the
    `task_ids` its dream entries take); `update(returns)` does both at once
    (`all_gather` of the current backend, then the update).

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
        num_tasks: None (one set of statistics, scalar state: the default)
            or the number of tasks `N >= 1`, each with its own statistics.
        **kwargs: passed to `keras.layers.Layer`.

    Call arguments:
        Not a callable layer: use `statistics`, `update_from`, `update`,
        `offset`, `scale` and `normalize`.

    Examples:
        >>> norm = ReturnNormalizer(impl="perc", rate=0.01, debias=True)
        >>> norm.update(returns)  # or norm.update_from(norm.statistics(returns))
        >>> advantages = (returns - values) / norm.scale()
        >>> per_task = ReturnNormalizer(impl="perc", rate=0.01, num_tasks=2)
        >>> per_task.update(returns, task_ids)  # returns [T, B], task_ids [B]
        >>> advantages = (returns - values) / per_task.scale(task_ids)

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
        num_tasks=None,
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
        if num_tasks is not None:
            num_tasks = integer("num_tasks", num_tasks)
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
        self.num_tasks = num_tasks
        shape = self._state_shape

        def state(name):
            return self.add_weight(name=name, shape=shape, initializer="zeros", trainable=False, dtype="float32")

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
    def _state_shape(self) -> Tuple[int, ...]:
        return () if self.num_tasks is None else (self.num_tasks,)

    @property
    def statistic_names(self) -> Tuple[str, ...]:
        """The names of this impl's batch statistics, the keys of `statistics()`."""
        return STATISTIC_NAMES[self.impl]

    def statistics(self, returns, task_ids=None) -> Dict[str, object]:
        """`{name: float32 scalar}`: the statistics of the finite values of one batch of `returns` (any
        shape), as it is (no all-gather): the percentiles (perc, perc_ema), `mean(x)` and `mean(x^2)`
        (meanstd), nothing (none). Not finite when no value is (an update from them changes nothing).

        Per task, with the `task_ids` of the returns (a shape that broadcasts to theirs): `{name: [N]}`, each
        task's statistics of its own returns, NaN for a task with none (and for every task when a tensor's
        id is outside `[0, N)`).

        Host data is checked first: a `ValueError` for non-finite values or an empty batch, and for task ids
        that are not integers in `[0, N)` of such a shape."""
        returns = self._returns(returns)
        ids = self._task_ids(task_ids, static_shape(returns.shape))
        if self.impl == "none":
            return {}
        x = ops.reshape(returns, (-1,))
        if ids is not None:
            return self._task_statistics(x, ops.reshape(ops.zeros_like(returns, dtype="int32") + ids, (-1,)))
        finite = ops.isfinite(x)
        count = ops.sum(ops.cast(finite, "float32"))
        if self.impl == "meanstd":
            kept = ops.where(finite, x, 0.0)
            # 0 / 0 (no finite value) is NaN: such statistics change nothing.
            return {"return_mean": ops.sum(kept) / count, "return_sqmean": ops.sum(ops.square(kept)) / count}
        # Percentiles with linear interpolation (numpy's default) over the finite values, sorted first.
        ordered = ops.sort(ops.where(finite, x, float("inf")))
        return {
            "return_low": _interpolate(ordered, count, self.low_percentile),
            "return_high": _interpolate(ordered, count, self.high_percentile),
        }

    def _task_statistics(self, x, ids):
        """`statistics` per task of the flat returns `x [M]` and their task ids `ids [M]` (int32)."""
        n = self.num_tasks
        inside = ops.logical_and(ids >= 0, ids < n)
        if self.impl == "meanstd":
            kept = ops.logical_and(ops.isfinite(x), inside)
            bucket = ops.where(kept, ids, n)  # the left-out values' sums go to a segment N, dropped
            values = ops.where(kept, x, 0.0)

            def per_task(v):
                return ops.segment_sum(v, bucket, num_segments=n + 1)[:n]

            count = per_task(ops.cast(kept, "float32"))
            stats = (per_task(values) / count, per_task(ops.square(values)) / count)  # 0 / 0: NaN, no change
        else:
            stats = per_task_percentiles(x, ids, n, (self.low_percentile, self.high_percentile))
        # An id outside [0, N) (a tensor's: host ids are checked) voids the whole batch: every task keeps its state.
        valid = ops.all(inside)
        return {name: ops.where(valid, s, float("nan")) for name, s in zip(self.statistic_names, stats)}

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

    def _task_ids(self, task_ids, shape: Optional[Tuple], what: str = "returns"):
        """`task_ids` as an int32 tensor (None without `num_tasks`), checked: integers of a shape that
        broadcasts to `shape` (the values'; None: any shape), host ids in `[0, N)`; a `ValueError` naming
        `task_ids` else."""
        n = self.num_tasks
        if n is None:
            if task_ids is not None:
                raise ValueError(
                    f"task_ids: got {_described(task_ids)}, expected None: this normaliser keeps one set of "
                    "statistics (num_tasks=None); ReturnNormalizer(num_tasks=N) keeps them per task."
                )
            return None
        want = f"integers in [0, {n}) (num_tasks={n})"
        if task_ids is None:
            raise ValueError(
                f"task_ids: got None, expected the task of each value, {want}: this normaliser keeps statistics "
                "per task."
            )
        ids = real_values("task_ids", task_ids)
        kind = dtype_name(ids.dtype) if ops.is_tensor(ids) else str(ids.dtype)
        if not kind.startswith(("int", "uint")):
            raise ValueError(f"task_ids: got {_described(ids)} of dtype {kind}, expected {want}.")
        got = static_shape(ids.shape)
        if shape is not None and not _broadcasts(got, shape):
            raise ValueError(
                f"task_ids: got shape {fmt(got)}, expected a shape that broadcasts to {what} of shape "
                f"{fmt(shape)} (e.g. [B] for {what} [T, B])."
            )
        if isinstance(ids, np.ndarray):
            outside = (ids < 0) | (ids >= n)
            if outside.any():
                raise ValueError(f"task_ids: got {int(ids[outside].flat[0])}, expected {want}.")
            return ops.convert_to_tensor(ids.astype(np.int32))
        return ops.cast(ids, "int32") if kind != "int32" else ids

    def update_from(self, stats: Mapping) -> None:
        """Moves the EMAs (and `corr`) towards the batch statistics `stats` (a dict with
        `statistic_names` as keys, as `statistics()` returns), through `Variable.assign`.

        Statistics that are not finite leave every variable as it was (a select, so inside a compiled step
        too); host numbers that are not finite raise a `ValueError` before anything changes.

        Per task the statistics are vectors `[N]`: a task whose statistics are not finite keeps its state
        (NaN: no return of that task in the batch); host values that are infinite raise a `ValueError`."""
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
        shape = self._state_shape
        want = "a scalar" if not shape else f"a vector of shape {fmt(shape)} (one per task)"
        values = []
        for name in self.statistic_names:
            value = real_values(f"stats[{name!r}]", stats[name])
            if isinstance(value, np.ndarray):
                if (value.size != 1) if not shape else (value.shape != shape):
                    raise ValueError(f"stats[{name!r}]: got an array of shape {fmt(value.shape)}, expected {want}.")
                with np.errstate(over="ignore", invalid="ignore"):
                    value = value.astype(np.float32).reshape(shape)
                bad = np.isinf(value) if shape else ~np.isfinite(value)
                if bad.any():
                    task = f" for task {int(np.argmax(bad))}" if shape else ""
                    raise ValueError(
                        f"stats[{name!r}]: got {float(value[bad].flat[0])!r} (as float32){task}, expected a finite "
                        f"number{' (or NaN: a task without returns)' if shape else ''}."
                    )
            elif tuple(value.shape) not in (((), (1,)) if not shape else (shape,)):
                raise ValueError(f"stats[{name!r}]: got a tensor of shape {fmt(tuple(value.shape))}, expected {want}.")
            values.append(ops.reshape(as_float32(value), shape))
        first, second = values
        # A non-finite statistic (no finite return, an overflow) keeps the old state, all of it (per task:
        # that task's).
        ok = ops.logical_and(ops.isfinite(first), ops.isfinite(second))
        a, b = (self.mean, self.sqmean) if self.impl == "meanstd" else (self.low, self.high)
        a.assign(ops.where(ok, self.decay * a.value + self.rate * first, a.value))
        b.assign(ops.where(ok, self.decay * b.value + self.rate * second, b.value))
        if self.debias:
            self.corr.assign(ops.where(ok, self.decay * self.corr.value + self.rate, self.corr.value))

    def update(self, returns, *old_high, task_ids=None) -> None:
        """Moves the EMAs towards the statistics of the global batch of `returns`: `update_from(statistics(
        all_gather(returns)))` (`all_gather` of the current backend: identity without data parallelism).
        Per task, `update(returns, task_ids)`: the task ids are gathered with the returns.

        Host data is checked first (a `ValueError` for non-finite values, an empty batch, statistics
        float32 cannot hold, or task ids that are not integers in `[0, N)` of a shape that broadcasts to
        the returns'); a backend tensor's non-finite values are left out of the statistics, and statistics
        that are not finite change nothing.

        The old two-argument form `update(low, high)` (the percentiles, perc and perc_ema only, without
        `num_tasks`) still works and means `update_from({"return_low": low, "return_high": high})`; it is
        deprecated.
        """
        if old_high:
            if len(old_high) != 1:
                raise ValueError(f"update: got {1 + len(old_high)} arguments, expected update(returns).")
            if self.num_tasks is not None:
                if task_ids is not None:
                    raise ValueError("task_ids: got it twice (as the second argument and by name), expected once.")
                task_ids = old_high[0]
            else:
                self._old_update(returns, old_high[0])
                return
        host = not ops.is_tensor(returns)
        returns = self._returns(returns)
        ids = self._task_ids(task_ids, static_shape(returns.shape))
        if self.impl == "none":
            return
        gather = _backend.current().all_gather
        if ids is None:
            stats = self.statistics(gather(returns))
        else:
            ids = ops.zeros_like(returns, dtype="int32") + ids
            stats = self.statistics(gather(returns), gather(ids))
        if host:
            # Per task, only the tasks of the batch must have statistics (the others' are NaN: no change).
            present = True if ids is None else np.bincount(ops.convert_to_numpy(ids).ravel(), minlength=self.num_tasks)
            for name, value in stats.items():
                value = np.asarray(ops.convert_to_numpy(value))
                bad = ~np.isfinite(value) & (present > 0)
                if bad.any():
                    task = f" for task {int(np.argmax(bad))}" if ids is not None else ""
                    raise ValueError(
                        f"returns: its {name}{task} is {float(value[bad].flat[0])!r} in float32 (returns up to "
                        f"{float(np.abs(ops.convert_to_numpy(returns)).max()):g}), expected statistics "
                        "float32 can hold."
                    )
        self.update_from(stats)

    def _old_update(self, low, high) -> None:
        """The deprecated `update(low, high)`."""
        if self.impl not in ("perc", "perc_ema"):
            raise ValueError(
                f"update(low, high): the old two-argument form is for impl 'perc' or "
                f"'perc_ema', got impl {self.impl!r}; use update(returns) or update_from(stats)."
            )
        shape = static_shape(low.shape) if hasattr(low, "shape") else np.shape(low)
        if None in shape or math.prod(shape) != 1:
            raise ValueError(
                f"task_ids: got update(returns, task_ids) with returns of shape {fmt(shape)} on a "
                "normaliser of one set of statistics (num_tasks=None), expected ReturnNormalizer(num_tasks=N) "
                "for statistics per task (update(low, high), the deprecated form, takes two scalars)."
            )
        warnings.warn(
            "ReturnNormalizer.update(low, high) is deprecated: use update(returns) or update_from(statistics).",
            DeprecationWarning,
            stacklevel=3,
        )
        self.update_from({"return_low": low, "return_high": high})

    def _correction(self):
        """`1 / max(rate, corr)` with debias, else None (a factor of 1)."""
        return 1.0 / ops.maximum(self.rate, self.corr) if self.debias else None

    def _per_element(self, vector, task_ids):
        """`vector` (a scalar; per task `[N]`) itself without `task_ids`, else each id's entry (NaN for a
        tensor's id outside `[0, N)`)."""
        if task_ids is None and self.num_tasks is not None:
            return vector
        ids = self._task_ids(task_ids, None)
        if ids is None:
            return vector
        n = self.num_tasks
        inside = ops.logical_and(ids >= 0, ids < n)
        return ops.where(inside, ops.take(vector, ops.clip(ids, 0, n - 1)), float("nan"))

    def offset(self, task_ids=None):
        """`lo c` (perc, perc_ema), `mean c` (meanstd), 0 (none); a float32 scalar. Per task: each task's
        `[N]`, or with `task_ids` each id's (the ids' shape)."""
        if self.impl == "none":
            return self._per_element(ops.zeros(self._state_shape, "float32"), task_ids)
        value = self.mean if self.impl == "meanstd" else self.low
        c = self._correction()
        return self._per_element(ops.convert_to_tensor(value) if c is None else value * c, task_ids)

    def scale(self, task_ids=None):
        """`max(limit, hi c - lo c)` (perc, perc_ema), `max(limit, sqrt(relu(sqmean c - (mean c)^2)))`
        (meanstd), 1 (none); a float32 scalar. Per task: each task's `[N]`, or with `task_ids` each id's
        (the ids' shape)."""
        return self._per_element(self._scale(), task_ids)

    def _scale(self):
        if self.impl == "none":
            return ops.ones(self._state_shape, "float32")
        c = self._correction()
        if self.impl == "meanstd":
            mean, sqmean = (self.mean, self.sqmean) if c is None else (self.mean * c, self.sqmean * c)
            return ops.maximum(self.limit, ops.sqrt(ops.relu(sqmean - ops.square(mean))))
        if c is None:
            return ops.maximum(self.limit, self.high - self.low)
        return ops.maximum(self.limit, self.high * c - self.low * c)

    def normalize(self, x, task_ids=None):
        """`(x - offset()) / scale()` (`x`: a backend tensor or host array). Per task:
        `(x - offset(task_ids)) / scale(task_ids)`, the ids of a shape that broadcasts to `x`'s."""
        x = real_values("x", x)
        if not ops.is_tensor(x):
            x = ops.convert_to_tensor(x)
        if self.num_tasks is None:
            self._task_ids(task_ids, None)  # (refused: this normaliser has no tasks)
            return ops.divide(ops.subtract(x, self.offset()), self.scale())
        ids = self._task_ids(task_ids, static_shape(x.shape), what="x")
        return ops.divide(ops.subtract(x, self.offset(ids)), self.scale(ids))

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
        if self.num_tasks is not None:
            # Written only per task: a normaliser of one set of statistics writes today's config, which
            # checkpoints, weight files and multi-host agreement compare key by key with the files of older
            # versions.
            config["num_tasks"] = self.num_tasks
        return config


def _described(x) -> str:
    """A value as an error message names it: a number or short sequence itself, else its kind and shape."""
    if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool):
        return repr(x)
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"a {type(x).__name__} of shape {fmt(static_shape(shape))}"
    return f"a {type(x).__name__}"
