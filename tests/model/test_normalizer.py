"""`ReturnNormalizer` against the official DreamerV3 (2024) `Normalize`, a numpy float64 transcription of its
formulas, compiled functions and config round trips."""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest

from multicritic import ReturnNormalizer
from tests.conftest import BACKEND, compiled, to_np

GOLDENS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "official", "official_goldens.npz")
IMPLS = ("perc", "perc_ema", "meanstd", "none")


@pytest.fixture(scope="module")
def goldens():
    return dict(np.load(GOLDENS))


def state(norm):
    """The normaliser's variables by name, as numpy."""
    return {v.name: float(to_np(v)) for v in norm.weights}


# --- 1. The official code's numbers -------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["perc", "perc_ema"])
@pytest.mark.parametrize("debias", [False, True])
def test_perc_matches_the_official_code(goldens, impl, debias):
    rate, limit, lo, hi = goldens["norm/config"]
    norm = ReturnNormalizer(
        impl=impl,
        rate=float(rate),
        limit=float(limit),
        low_percentile=float(lo),
        high_percentile=float(hi),
        debias=debias,
    )
    tag = "debias" if debias else "nodebias"
    for i in range(3):
        norm.update(goldens[f"norm/input_{i}"])
        np.testing.assert_allclose(to_np(norm.offset()), goldens[f"norm/{tag}/offset_{i}"], rtol=1e-6)
        np.testing.assert_allclose(to_np(norm.scale()), goldens[f"norm/{tag}/scale_{i}"], rtol=1e-6)
        np.testing.assert_allclose(to_np(norm.low), goldens[f"norm/{tag}/state_{i}/lo"], rtol=1e-6)
        np.testing.assert_allclose(to_np(norm.high), goldens[f"norm/{tag}/state_{i}/hi"], rtol=1e-6)
        if debias:
            np.testing.assert_allclose(to_np(norm.corr), goldens[f"norm/{tag}/state_{i}/corr"], rtol=1e-6)
    if debias:  # the goldens' debiased scales are above the limit: the test sees the spread itself
        assert goldens[f"norm/{tag}/scale_2"] > limit


@pytest.mark.parametrize("debias", [False, True])
def test_meanstd_matches_the_official_code(goldens, debias):
    norm = ReturnNormalizer(impl="meanstd", rate=0.01, limit=1.0, debias=debias)
    tag = "debias" if debias else "nodebias"
    for i in range(3):
        norm.update(goldens[f"norm/input_{i}"])
        np.testing.assert_allclose(to_np(norm.offset()), goldens[f"meanstd/{tag}/offset_{i}"], rtol=1e-6)
        np.testing.assert_allclose(to_np(norm.scale()), goldens[f"meanstd/{tag}/scale_{i}"], rtol=1e-6)


def test_update_from_statistics_is_update(goldens):
    a = ReturnNormalizer(impl="perc", rate=0.01, debias=True)
    b = ReturnNormalizer(impl="perc", rate=0.01, debias=True)
    for i in range(3):
        x = goldens[f"norm/input_{i}"]
        a.update(x)
        b.update_from(b.statistics(x))
    assert state(a) == state(b)


# --- 2. A numpy float64 transcription of the formulas --------------------------------------------------------------


class NumpyNormalizer:
    def __init__(self, impl, rate, lo=5.0, hi=95.0, limit=1.0, debias=False):
        self.impl, self.rate, self.lo_q, self.hi_q, self.limit, self.debias = impl, rate, lo, hi, limit, debias
        self.lo = self.hi = self.mean = self.sqmean = self.corr = 0.0

    def ema(self, old, new):
        return (1 - self.rate) * old + self.rate * new

    def update(self, x):
        x = np.asarray(x, np.float64).ravel()
        if self.impl == "none":
            return
        if self.impl == "meanstd":
            self.mean, self.sqmean = self.ema(self.mean, x.mean()), self.ema(self.sqmean, (x**2).mean())
        else:
            self.lo = self.ema(self.lo, np.percentile(x, self.lo_q))
            self.hi = self.ema(self.hi, np.percentile(x, self.hi_q))
        if self.debias:
            self.corr = self.ema(self.corr, 1.0)

    def stats(self):
        c = 1.0 / max(self.rate, self.corr) if self.debias and self.impl != "none" else 1.0
        if self.impl == "none":
            return 0.0, 1.0
        if self.impl == "meanstd":
            mean = self.mean * c
            return mean, max(self.limit, np.sqrt(max(0.0, self.sqmean * c - mean**2)))
        return self.lo * c, max(self.limit, self.hi * c - self.lo * c)


def batches():
    rng = np.random.default_rng(7)
    return [
        (rng.normal(size=(16, 9)) * 5 + 2).astype("float32"),  # spread above the limit
        (rng.normal(size=(33,)) * 0.05 - 1).astype("float32"),  # spread below the limit
        np.full((4, 6), 2.5, "float32"),  # constant returns
        (rng.standard_t(3, size=(7, 3, 5)) * 20).astype("float32"),
        rng.uniform(-3, 3, size=(50,)).astype("float32"),
    ]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("debias", [False, True])
@pytest.mark.parametrize(
    "options",
    [
        dict(rate=0.01),
        dict(decay=0.7, limit=0.5),
        dict(rate=0.3, low_percentile=10.0, high_percentile=90.0, limit=1e-3),
    ],
)
def test_matches_a_numpy_transcription(impl, debias, options):
    norm = ReturnNormalizer(impl=impl, debias=debias, **options)
    ref = NumpyNormalizer(impl, 1.0 - norm.decay, norm.low_percentile, norm.high_percentile, norm.limit, debias)
    for x in batches():
        norm.update(x)
        ref.update(x)
        offset, scale = ref.stats()
        np.testing.assert_allclose(to_np(norm.offset()), offset, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(to_np(norm.scale()), scale, rtol=2e-5, atol=1e-6)
        y = np.linspace(-5, 5, 11).astype("float32")
        np.testing.assert_allclose(to_np(norm.normalize(y)), (y - offset) / scale, rtol=2e-5, atol=1e-5)
        got = state(norm)
        want = {
            "perc": {"low": ref.lo, "high": ref.hi},
            "perc_ema": {"low": ref.lo, "high": ref.hi},
            "meanstd": {"mean": ref.mean, "sqmean": ref.sqmean},
            "none": {"low": 0.0, "high": 0.0},
        }[impl]
        if debias and impl != "none":
            want["corr"] = ref.corr
        assert sorted(got) == sorted(want)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("impl", IMPLS)
def test_statistics_of_one_batch(impl):
    norm = ReturnNormalizer(impl=impl, low_percentile=10.0, high_percentile=80.0)
    x = batches()[3]
    stats = to_np(norm.statistics(x))
    assert tuple(stats) == norm.statistic_names
    assert (
        norm.statistic_names
        == {
            "perc": ("return_low", "return_high"),
            "perc_ema": ("return_low", "return_high"),
            "meanstd": ("return_mean", "return_sqmean"),
            "none": (),
        }[impl]
    )
    want = {
        "perc": np.percentile(x, [10, 80]),
        "perc_ema": np.percentile(x, [10, 80]),
        "meanstd": [x.astype(np.float64).mean(), (x.astype(np.float64) ** 2).mean()],
        "none": [],
    }[impl]
    for (name, got), w in zip(stats.items(), want):
        assert got.shape == () and got.dtype == np.float32, name
        np.testing.assert_allclose(got, w, rtol=1e-5, err_msg=name)
    assert all(v == 0.0 for v in state(norm).values())  # pure


def test_none_is_the_identity():
    norm = ReturnNormalizer(impl="none", debias=True)
    norm.update(batches()[0])
    norm.update_from({})
    assert float(to_np(norm.offset())) == 0.0 and float(to_np(norm.scale())) == 1.0
    assert sorted(state(norm)) == ["high", "low"] and not hasattr(norm, "corr")


def test_the_old_two_argument_update():
    x = batches()[0]
    old, new = ReturnNormalizer(), ReturnNormalizer()
    stats = new.statistics(x)
    old.update(stats["return_low"], stats["return_high"])
    new.update_from(stats)
    assert state(old) == state(new)
    with pytest.raises(ValueError, match="impl"):
        ReturnNormalizer(impl="meanstd").update(1.0, 2.0)
    with pytest.raises(ValueError, match="stats"):
        ReturnNormalizer(impl="meanstd").update_from({"return_low": 1.0, "return_high": 2.0})


# --- 3. Compiled ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["perc", "perc_ema", "meanstd"])
def test_compiled_update_matches_eager(impl):
    eager = ReturnNormalizer(impl=impl, rate=0.1, debias=True, limit=0.1)
    traced = ReturnNormalizer(impl=impl, rate=0.1, debias=True, limit=0.1)
    variables = traced.weights

    def step(values, x, with_update_from):
        """One update (from statistics, or from the returns) then (offset, scale); returns the new state too.
        (Compiled reductions may sum in another order: float32 tolerances.)"""

        def body():
            if with_update_from:
                traced.update_from(traced.statistics(x))
            else:
                traced.update(x)
            return traced.offset(), traced.scale()

        if BACKEND != "jax":
            return None, body()
        with keras.StatelessScope(state_mapping=list(zip(variables, values))) as scope:
            out = body()
        return [scope.get_current_value(v) for v in variables], out

    fns = {flag: compiled(lambda values, x, flag=flag: step(values, x, flag)) for flag in (True, False)}
    for i, x in enumerate(batches()):
        flag = i % 2 == 0
        eager.update_from(eager.statistics(x)) if flag else eager.update(x)
        values = [keras.ops.convert_to_tensor(v.value) for v in variables] if BACKEND == "jax" else None
        new, (offset, scale) = fns[flag](values, keras.ops.convert_to_tensor(x))
        if new is not None:
            for v, value in zip(variables, new):
                v.assign(value)
        np.testing.assert_allclose(to_np(offset), to_np(eager.offset()), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(to_np(scale), to_np(eager.scale()), rtol=1e-5, atol=1e-6)
        for a, b in zip(traced.weights, eager.weights):
            np.testing.assert_allclose(to_np(a), to_np(b), rtol=1e-5, atol=1e-6, err_msg=a.name)


# --- 4. Configs and arguments --------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("debias", [False, True])
@pytest.mark.parametrize("num_tasks", [None, 3])
def test_config_round_trip(impl, debias, num_tasks):
    norm = ReturnNormalizer(
        impl=impl,
        rate=0.05,
        low_percentile=2.0,
        high_percentile=98.0,
        limit=0.5,
        debias=debias,
        num_tasks=num_tasks,
        name="n",
    )
    config = norm.get_config()
    assert "rate" not in config and config["debias"] == debias and config["decay"] == pytest.approx(0.95)
    # One set of statistics writes the config of the versions before per-task statistics (their files compare).
    assert config.get("num_tasks", "absent") == (num_tasks or "absent")
    for loaded in (
        ReturnNormalizer.from_config(config),
        keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(norm)),
    ):
        assert type(loaded) is ReturnNormalizer
        assert loaded.get_config() == config
        for attr in ("impl", "decay", "rate", "low_percentile", "high_percentile", "limit", "debias", "num_tasks"):
            assert getattr(loaded, attr) == pytest.approx(getattr(norm, attr)), attr
        assert [v.path for v in loaded.weights] == [v.path for v in norm.weights]
        shape = () if num_tasks is None else (num_tasks,)
        assert all(not v.trainable and v.dtype == "float32" and tuple(v.shape) == shape for v in loaded.weights)


def test_an_old_config_loads():
    old = {
        "name": "normalizer_task",
        "trainable": True,
        "dtype": "float32",
        "impl": "perc_ema",
        "decay": 0.9,
        "low_percentile": 5.0,
        "high_percentile": 95.0,
        "limit": 1.0,
    }
    norm = ReturnNormalizer.from_config(old)
    assert norm.impl == "perc_ema" and norm.decay == 0.9 and norm.rate == pytest.approx(0.1) and norm.debias is False
    assert sorted(v.name for v in norm.weights) == ["high", "low"]
    default = ReturnNormalizer()
    assert (default.impl, default.decay, default.rate, default.limit, default.debias) == (
        "perc_ema",
        0.99,
        pytest.approx(0.01),
        1.0,
        False,
    )


def test_rate_sets_decay():
    assert ReturnNormalizer(rate=0.25).decay == 0.75
    assert ReturnNormalizer(rate=1.0).decay == 0.0
    assert ReturnNormalizer(rate=0.25, decay=0.75).rate == 0.25
    # Finding 8: a decay that contradicts the rate is refused, the default's value (0.99) included.
    with pytest.raises(ValueError, match=r"rate/decay: got rate=0.5 and decay=0.99"):
        ReturnNormalizer(rate=0.5, decay=0.99)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(impl="percentile"), "impl"),
        (dict(impl=None), "impl"),
        (dict(rate=0.0), "rate"),
        (dict(rate=1.5), "rate"),
        (dict(rate=-0.1), "rate"),
        (dict(rate="0.1"), "rate"),
        (dict(rate=0.1, decay=0.5), "rate"),
        (dict(decay=1.0), "decay"),
        (dict(decay=-0.1), "decay"),
        (dict(decay=float("nan")), "decay"),
        (dict(limit=0.0), "limit"),
        (dict(limit=-1.0), "limit"),
        (dict(low_percentile=-1.0), "low_percentile"),
        (dict(high_percentile=101.0), "high_percentile"),
        (dict(low_percentile=60.0, high_percentile=40.0), "low_percentile"),
        (dict(debias="yes"), "debias"),
    ],
)
def test_bad_arguments_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ReturnNormalizer(**kwargs)


# --- 5. Non-finite returns never enter the statistics (issue 31) --------------------------------------------------


@pytest.mark.parametrize("impl", ["perc", "meanstd"])
@pytest.mark.parametrize(
    "returns, message",
    [
        (np.array([1.0, np.nan, 2.0], "float32"), r"returns: got 1 non-finite value\(s\)"),
        (np.array([1.0, np.inf], "float32"), r"returns: got 1 non-finite value\(s\)"),
        (np.array([1e39, 1.0]), r"returns: got 1 non-finite value\(s\) \(as float32\)"),
        (np.zeros((0, 3), "float32"), r"returns: got an array of shape \[0, 3\], expected at least one return"),
        ("abc", "returns: got 'abc'"),
        (None, "returns: got None"),
        (np.array(["a", "b"]), "returns: got an array of dtype <U1"),
    ],
)
def test_bad_host_returns_are_refused_before_any_change(impl, returns, message):
    """Finding 2 (NaN, inf, empty batches stored for good) and 15 (raw framework errors)."""
    norm = ReturnNormalizer(impl=impl, debias=True)
    norm.update(batches()[0])
    before = state(norm)
    with pytest.raises(ValueError, match=message):
        norm.update(returns)
    with pytest.raises(ValueError, match=message):
        norm.statistics(returns)
    assert state(norm) == before
    with pytest.raises(ValueError, match="x: got 'abc'"):
        norm.normalize("abc")


def test_statistics_float32_cannot_hold_are_refused():
    """Finding 2: meanstd's mean of squares of 1e30 overflowed float32 and the scale stayed inf."""
    norm = ReturnNormalizer(impl="meanstd", debias=True)
    norm.update(batches()[0])
    before = state(norm)
    with pytest.raises(ValueError, match=r"returns: its return_sqmean is inf in float32 \(returns up to 1e\+30\)"):
        norm.update(np.full(4, 1e30, "float32"))
    assert state(norm) == before
    norm.update(np.full(4, 1e18, "float32"))  # its square, 1e36, fits
    assert np.isfinite(to_np(norm.scale()))


@pytest.mark.parametrize("impl", ["perc", "perc_ema", "meanstd"])
def test_update_from_refuses_non_finite_host_statistics(impl):
    norm = ReturnNormalizer(impl=impl, debias=True)
    names = norm.statistic_names
    norm.update_from(dict.fromkeys(names, 1.0))
    before = state(norm)
    for bad in (np.nan, np.inf, -np.inf, 1e39):
        with pytest.raises(ValueError, match=rf"stats\['{names[0]}'\]: got"):
            norm.update_from({names[0]: bad, names[1]: 1.0})
    with pytest.raises(ValueError, match=r"stats: unexpected \['bogus'\]"):
        norm.update_from({**dict.fromkeys(names, 1.0), "bogus": 1.0})
    with pytest.raises(ValueError, match=rf"stats\['{names[1]}'\]: got an array of shape \[2\]"):
        norm.update_from({names[0]: 1.0, names[1]: np.ones(2)})
    with pytest.raises(ValueError, match=rf"stats\['{names[1]}'\]: got 'x'"):
        norm.update_from({names[0]: 1.0, names[1]: "x"})
    assert state(norm) == before


@pytest.mark.parametrize("impl", ["perc", "perc_ema", "meanstd"])
def test_tensor_returns_leave_non_finite_values_out(impl):
    """Backend tensors are not inspected on the host: their non-finite values are left out of the statistics
    (eagerly and compiled), and a batch with none finite changes nothing."""
    x = batches()[3]
    bad = x.copy()
    bad[0, 0, :3] = [np.nan, np.inf, -np.inf]
    finite = bad[np.isfinite(bad)]
    a, b = ReturnNormalizer(impl=impl, rate=0.1, debias=True), ReturnNormalizer(impl=impl, rate=0.1, debias=True)
    a.update(keras.ops.convert_to_tensor(bad))
    b.update(finite)
    for name, value in state(b).items():
        np.testing.assert_allclose(state(a)[name], value, rtol=2e-6, atol=1e-7, err_msg=name)
    before = state(a)
    for empty in (np.full((3, 2), np.nan, "float32"), np.array([np.inf, -np.inf], "float32")):
        a.update(keras.ops.convert_to_tensor(empty))
        a.update_from(a.statistics(keras.ops.convert_to_tensor(empty)))
        assert state(a) == before


@pytest.mark.parametrize("impl", ["perc", "meanstd"])
def test_a_compiled_update_keeps_the_old_statistics_when_the_new_are_not_finite(impl):
    """Inside a compiled step the update cannot raise: a non-finite statistic keeps the old state (a select),
    as a trainer skips a step with non-finite gradients."""
    norm = ReturnNormalizer(impl=impl, rate=0.1, debias=True)
    norm.update(batches()[0])
    variables = norm.weights

    def step(values, x):
        if BACKEND != "jax":
            norm.update_from(norm.statistics(x))
            return None
        with keras.StatelessScope(state_mapping=list(zip(variables, values))) as scope:
            norm.update_from(norm.statistics(x))
        return [scope.get_current_value(v) for v in variables]

    fn = compiled(step)
    before = state(norm)
    values = [keras.ops.convert_to_tensor(v.value) for v in variables] if BACKEND == "jax" else None
    new = fn(values, keras.ops.convert_to_tensor(np.full((5,), np.nan, "float32")))
    if new is not None:
        for v, value in zip(variables, new):
            v.assign(value)
    assert state(norm) == before
    x = batches()[1]
    values = [keras.ops.convert_to_tensor(v.value) for v in variables] if BACKEND == "jax" else None
    new = fn(values, keras.ops.convert_to_tensor(np.concatenate([x, [np.nan]]).astype("float32")))
    if new is not None:
        for v, value in zip(variables, new):
            v.assign(value)
    eager = ReturnNormalizer(impl=impl, rate=0.1, debias=True)
    eager.update(batches()[0])
    eager.update(x)
    for name, value in state(eager).items():
        np.testing.assert_allclose(state(norm)[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


# --- 6. Statistics per task (issue 74) ----------------------------------------------------------------------------


def task_state(norm):
    """The normaliser's variables by name, as numpy vectors."""
    return {v.name: to_np(v).copy() for v in norm.weights}


@pytest.mark.parametrize("debias", [False, True])
def test_per_task_is_the_official_normaliser_of_each_task(goldens, debias):
    """Task 0 gets the official inputs 0, 1, 2; task 1 the same inputs one update later (it has no return in the
    first batch); task 2 none: each task's state and its offset and scale are the official code's after its own
    updates, an absent task's unchanged, its debias correction included."""
    rate, limit, lo, hi = (float(v) for v in goldens["norm/config"])
    norm = ReturnNormalizer(
        impl="perc", rate=rate, limit=limit, low_percentile=lo, high_percentile=hi, debias=debias, num_tasks=3
    )
    tag = "debias" if debias else "nodebias"
    for i in range(4):
        seen = [(task, j) for task, j in ((0, i), (1, i - 1)) if 0 <= j < 3]
        returns = np.concatenate([goldens[f"norm/input_{j}"].ravel() for _, j in seen])
        ids = np.concatenate([np.full(goldens[f"norm/input_{j}"].size, task) for task, j in seen])
        norm.update(returns, ids)
        got = task_state(norm)
        offset, scale = to_np(norm.offset()), to_np(norm.scale())
        for task, updates in ((0, min(i, 2)), (1, i - 1), (2, -1)):  # the last official update each task had
            if updates < 0:  # never updated: the initial state (offset 0, scale the limit)
                assert all(got[name][task] == 0.0 for name in got) and scale[task] == limit
                continue
            np.testing.assert_allclose(offset[task], goldens[f"norm/{tag}/offset_{updates}"], rtol=1e-6)
            np.testing.assert_allclose(scale[task], goldens[f"norm/{tag}/scale_{updates}"], rtol=1e-6)
            for name in ("lo", "hi") + (("corr",) if debias else ()):
                want = goldens[f"norm/{tag}/state_{updates}/{name}"]
                np.testing.assert_allclose(got[{"lo": "low", "hi": "high"}.get(name, name)][task], want, rtol=1e-6)


def task_batches():
    """`(returns, task ids)`: three tasks, task 1's returns 1e4 times larger; ids per element, per column
    (broadcast) or a scalar; the constant batch has task 0 alone."""
    rng = np.random.default_rng(11)
    out = []
    for x in batches():
        ids = rng.integers(0, 3, size=x.shape[-1:] if x.ndim > 1 else x.shape)
        if x.ndim == 3:
            ids = rng.integers(0, 3, size=x.shape)
        if np.all(x == x.flat[0]):
            ids = np.int64(0)
        out.append(((x * np.where(ids == 1, 1e4, 1.0)).astype("float32"), ids))
    return out


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("debias", [False, True])
def test_per_task_matches_a_numpy_transcription_per_task(impl, debias):
    """One numpy normaliser per task, fed only its task's returns (numpy.percentile, linear interpolation, then
    the EMA), to float32 rounding."""
    norm = ReturnNormalizer(impl=impl, rate=0.3, low_percentile=10.0, high_percentile=90.0, debias=debias, num_tasks=3)
    refs = [NumpyNormalizer(impl, 0.3, 10.0, 90.0, 1.0, debias) for _ in range(3)]
    for x, ids in task_batches():
        norm.update(x, ids)
        full = np.broadcast_to(ids, x.shape)
        for task, ref in enumerate(refs):
            if (full == task).any():
                ref.update(x[full == task])
        want = np.array([ref.stats() for ref in refs])  # [task, (offset, scale)]
        got = task_state(norm)
        for task, ref in enumerate(refs):
            names = {"meanstd": {"mean": ref.mean, "sqmean": ref.sqmean}, "none": {}}.get(
                impl, {"low": ref.lo, "high": ref.hi}
            )
            if debias and impl != "none":
                names["corr"] = ref.corr
            for name, value in names.items():
                np.testing.assert_allclose(got[name][task], value, rtol=2e-5, atol=1e-6, err_msg=f"{name}[{task}]")
        np.testing.assert_allclose(to_np(norm.offset()), want[:, 0], rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(to_np(norm.scale()), want[:, 1], rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(to_np(norm.scale(full)), want[full, 1], rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(
            to_np(norm.normalize(x, ids)), (x - want[full, 0]) / want[full, 1], rtol=2e-5, atol=1e-5
        )
    assert all(tuple(v.shape) == (3,) for v in norm.weights)


def test_per_task_percentiles_are_numpys():
    """Ties, one value, a task with none, non-finite values and ids outside [0, N) (both left out)."""
    from multicritic.model.normalizer import per_task_percentiles

    x = np.array([3.0, 1.0, 1.0, np.nan, 7.0, -2.0, 5.0, np.inf, 4.0, 4.0, 9.0, 2.0], "float32")
    ids = np.array([0, 0, 1, 0, 2, 0, 2, 2, 0, 5, -1, 0], "int32")
    qs = (0.0, 5.0, 37.5, 50.0, 100.0)
    got = to_np(per_task_percentiles(keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(ids), 4, qs))
    for task in range(4):
        values = x[(ids == task) & np.isfinite(x)]
        for q, vector in zip(qs, got):
            want = np.percentile(values, q) if values.size else np.nan
            np.testing.assert_allclose(vector[task], want, rtol=1e-6, err_msg=f"task {task}, q {q}")


@pytest.mark.parametrize(
    "task_ids, message",
    [
        (np.array([0, 1, 3, 0, 1, 2, 0, 1, 0]), r"task_ids: got 3, expected integers in \[0, 3\) \(num_tasks=3\)"),
        (np.array([0, -1, 0, 0, 1, 2, 0, 1, 0]), r"task_ids: got -1, expected integers in \[0, 3\)"),
        (np.zeros(9, "float32"), r"task_ids: got a ndarray of shape \[9\] of dtype float32, expected integers"),
        (np.zeros(9, bool), r"task_ids: got .* of dtype bool, expected integers"),
        (
            np.zeros(4, "int32"),
            r"task_ids: got shape \[4\], expected a shape that broadcasts to (returns|x) of shape \[16, 9\]",
        ),
        (np.zeros((3, 9), "int32"), r"task_ids: got shape \[3, 9\], expected a shape that broadcasts"),
        (None, r"task_ids: got None, expected the task of each value, integers in \[0, 3\)"),
        ("a", "task_ids: got 'a'"),
    ],
)
def test_bad_task_ids_are_refused_before_any_change(task_ids, message):
    norm = ReturnNormalizer(impl="perc", debias=True, num_tasks=3)
    x = batches()[0]  # [16, 9]
    norm.update(x, np.arange(9) % 3)
    before = task_state(norm)
    with pytest.raises(ValueError, match=message):
        norm.update(x, task_ids=task_ids)
    with pytest.raises(ValueError, match=message):
        norm.statistics(x, task_ids)
    with pytest.raises(ValueError, match=message):
        norm.normalize(x, task_ids)
    for name, value in task_state(norm).items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


def test_task_ids_need_num_tasks_and_update_from_takes_vectors():
    x = batches()[0]
    scalar = ReturnNormalizer(impl="perc")
    for call in (
        lambda: scalar.update(x, task_ids=np.zeros(9, "int32")),
        lambda: scalar.update(x, np.zeros(9, "int32")),  # not the deprecated update(low, high)
        lambda: scalar.statistics(x, np.zeros(9, "int32")),
        lambda: scalar.scale(np.zeros(9, "int32")),
    ):
        with pytest.raises(ValueError, match=r"task_ids: got .*(num_tasks=N|num_tasks=None)"):
            call()
    assert all(float(to_np(v)) == 0.0 for v in scalar.weights)
    norm = ReturnNormalizer(impl="perc", rate=0.5, debias=True, num_tasks=2)
    norm.update(x, np.array([0, 1, 0, 1, 0, 1, 0, 1, 0]))
    same = ReturnNormalizer(impl="perc", rate=0.5, debias=True, num_tasks=2)
    same.update(x, task_ids=np.array([0, 1, 0, 1, 0, 1, 0, 1, 0]))  # by name: the same
    assert all(np.array_equal(a, b) for a, b in zip(task_state(norm).values(), task_state(same).values()))
    before = task_state(norm)
    # NaN: a task without returns keeps its state; infinite host statistics and other shapes are refused.
    norm.update_from({"return_low": np.array([np.nan, -1.0]), "return_high": np.array([np.nan, 1.0])})
    after = task_state(norm)
    assert after["low"][0] == before["low"][0] and after["corr"][0] == before["corr"][0]
    assert after["low"][1] == pytest.approx(0.5 * before["low"][1] - 0.5) and after["corr"][1] == 0.75
    with pytest.raises(ValueError, match=r"stats\['return_low'\]: got inf \(as float32\) for task 1"):
        norm.update_from({"return_low": np.array([0.0, np.inf]), "return_high": np.array([1.0, 1.0])})
    with pytest.raises(ValueError, match=r"stats\['return_high'\]: got an array of shape \[\], expected a vector"):
        norm.update_from({"return_low": np.array([0.0, 1.0]), "return_high": 1.0})
    with pytest.raises(ValueError, match="num_tasks: got 0, expected an integer >= 1"):
        ReturnNormalizer(num_tasks=0)


def test_a_compiled_per_task_update_matches_eager():
    """Inside one compiled function: a perc and a meanstd normaliser per task, from tensors with non-finite
    returns (left out), a task absent (kept), then ids outside [0, N) (the whole update changes nothing) and
    offsets / scales per element (NaN for such an id)."""
    norms = [ReturnNormalizer(impl=impl, rate=0.2, debias=True, num_tasks=3) for impl in ("perc", "meanstd")]
    eager = [ReturnNormalizer(impl=impl, rate=0.2, debias=True, num_tasks=3) for impl in ("perc", "meanstd")]
    variables = [v for n in norms for v in n.weights]

    def step(values, x, ids):
        def body():
            for n in norms:
                n.update_from(n.statistics(x, ids))
            return [n.scale(ids) for n in norms]

        if BACKEND != "jax":
            return None, body()
        with keras.StatelessScope(state_mapping=list(zip(variables, values))) as scope:
            out = body()
        return [scope.get_current_value(v) for v in variables], out

    fn = compiled(step)
    rng = np.random.default_rng(5)
    for i in range(3):
        x = (rng.normal(size=(6, 8)) * np.array([1, 1e4, 1, 1e4, 1, 1, 1, 1])).astype("float32")
        ids = np.array([0, 1, 0, 1, 0, 0, 0, 0] if i != 1 else [0, 1, 2, 1, 2, 0, 2, 0], "int32")
        x[i, 2] = np.nan
        values = [keras.ops.convert_to_tensor(v.value) for v in variables] if BACKEND == "jax" else None
        new, scales = fn(values, keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(ids))
        if new is not None:
            for v, value in zip(variables, new):
                v.assign(value)
        for n, e, scale in zip(norms, eager, scales):
            kept = np.isfinite(x)
            e.update(x[kept], np.broadcast_to(ids, x.shape)[kept])
            for a, b in zip(n.weights, e.weights):
                np.testing.assert_allclose(to_np(a), to_np(b), rtol=1e-5, atol=1e-6, err_msg=a.name)
            np.testing.assert_allclose(to_np(scale), to_np(e.scale(ids)), rtol=1e-5, atol=1e-6)
    assert to_np(norms[0].corr).tolist() == pytest.approx([0.488, 0.488, 0.2])  # task 2: one update of three
    before = [to_np(v).copy() for v in variables]
    values = [keras.ops.convert_to_tensor(v.value) for v in variables] if BACKEND == "jax" else None
    bad = keras.ops.convert_to_tensor(np.array([0, 1, 0, 3, 0, 0, 0, 0], "int32"))
    new, scales = fn(values, keras.ops.convert_to_tensor(x), bad)
    if new is not None:
        for v, value in zip(variables, new):
            v.assign(value)
    for v, value in zip(variables, before):
        np.testing.assert_array_equal(to_np(v), value, err_msg=v.name)
    assert np.isnan(to_np(scales[0])[3]) and np.isfinite(np.delete(to_np(scales[0]), 3)).all()
