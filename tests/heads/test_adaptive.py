"""The adaptive-support head: its encodings, decode and update rule against float64 numpy references, and its
support as state (read live by compiled passes, updated in every backend's step all or nothing, shared exactly
by the slow critic, baked into exports) from a range 100 times too narrow."""

import math

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer, critic_loss
from multicritic.files.export import SUPPORTED
from multicritic.heads.adaptive import AdaptiveSupportHead
from multicritic.math.bins import SYMLOG_LIMIT
from tests.conftest import BACKEND, compiled, random_inputs, randomize, to_np

N = 11  # buckets of the goldens


def symlog(x):
    return np.sign(x) * np.log1p(np.abs(x))


def numpy_two_hot(v, n, low, high):
    grid = np.linspace(low, high, n)
    v = min(max(float(v), low), high)
    k = min(int(np.searchsorted(grid, v, side="right")) - 1, n - 2)
    out = np.zeros(n)
    upper = (v - grid[k]) / (grid[k + 1] - grid[k])
    out[k], out[k + 1] = 1.0 - upper, upper
    return out


def numpy_hl_gauss(v, n, low, high, sigma):
    width = (high - low) / (n - 1)
    v = min(max(float(v), low), high)
    edges = low + width * (np.arange(n + 1) - 0.5)
    cdf = np.array([math.erf((e - v) / (sigma * width * math.sqrt(2.0))) for e in edges])
    return np.diff(cdf) / (cdf[-1] - cdf[0])


def numpy_rule(low, high, targets_symlog, margin=0.1, shrink_rate=0.01, min_span=0.1):
    """One update, in float64, as the head's docstring states it."""
    if len(targets_symlog) == 0:
        return low, high
    t_low, t_high = min(targets_symlog), max(targets_symlog)
    span = max(t_high - t_low, min_span)
    middle = (t_low + t_high) / 2
    want_low = max(min(t_low, middle - span / 2) - margin * span, -SYMLOG_LIMIT)
    want_high = min(max(t_high, middle + span / 2) + margin * span, SYMLOG_LIMIT)
    new_low = want_low if want_low < low else low + shrink_rate * (want_low - low)
    new_high = want_high if want_high > high else high + shrink_rate * (want_high - high)
    return new_low, new_high


def head_with(support, members=None, **options):
    head = AdaptiveSupportHead(num_buckets=N, members=members, **options)
    head.build((None, 3) if members is None else (members, None, 3))
    head.support.assign(np.asarray(support, "float32"))
    return head


def log_softmax(logits):
    x = logits.astype(np.float64)
    return x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True)


@pytest.mark.parametrize("encoding", ["two_hot", "hl_gauss"])
def test_the_loss_is_the_cross_entropy_to_the_encoding_on_the_current_support(encoding):
    # Two members with their own supports (one given swapped: any pair is a support), targets inside, on a
    # bucket, at an end and beyond both ends; the slow critic's value encoded on the same support.
    supports = np.array([[-1.5, 3.0], [2.0, -0.5]])
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, N)).astype("float32")
    targets = np.array([[0.7, -0.5, 19.0, -100.0, 1.0], [0.0, 2.0, 7.0, 1e5, -3.0]], "float32")
    ema = rng.uniform(-3.0, 4.0, size=(2, 5)).astype("float32")
    head = head_with(supports, members=2, encoding=encoding, sigma=0.6)
    value_term, ema_term = head.position_losses(logits, targets, ema, None, regularizer="two_hot_mean")
    lp = log_softmax(logits)
    for m, (a, b) in enumerate(supports):
        low, high = min(a, b), max(a, b)
        for i in range(5):
            for got, value in ((value_term, symlog(float(targets[m, i]))), (ema_term, float(ema[m, i]))):
                if encoding == "two_hot":
                    want = numpy_two_hot(value, N, low, high)
                else:
                    want = numpy_hl_gauss(value, N, low, high, 0.6)
                np.testing.assert_allclose(to_np(got)[m, i], -(want * lp[m, i]).sum(), rtol=2e-5, atol=2e-5)
    # The distribution regulariser: the cross-entropy to the slow critic's distribution.
    ema_logits = rng.normal(size=(2, 5, N)).astype("float32")
    _, dist = head.position_losses(logits, targets, None, ema_logits, regularizer="distribution")
    p = np.exp(log_softmax(ema_logits))
    np.testing.assert_allclose(to_np(dist), -(p * lp).sum(-1), rtol=1e-5)


def test_the_decode_is_the_mean_over_the_current_grid_and_exact_at_the_centre():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, N)).astype("float32")
    head = head_with([-0.7, 5.3])
    p = np.exp(log_softmax(logits))
    np.testing.assert_allclose(to_np(head.decode(logits)), p @ np.linspace(-0.7, 5.3, N), rtol=1e-6, atol=1e-6)
    # A symmetric distribution decodes to the centre exactly: 0 on symmetric bounds (a new critic predicts 0).
    symmetric = np.stack([logits[0], logits[0][::-1]]).sum(0, keepdims=True)
    np.testing.assert_array_equal(to_np(head_with([-3.0, 3.0]).decode(symmetric)), [0.0])
    np.testing.assert_array_equal(to_np(head_with([1.0, 5.0]).decode(np.zeros((2, N), "float32"))), [3.0, 3.0])


@pytest.mark.parametrize(
    "support, targets, weights",
    [
        ([-0.2, 0.2], [1000.0, -5.0, 3.0], None),  # both bounds grow at once
        ([-20.0, 20.0], [1.0, 2.0, 0.5], None),  # both shrink by shrink_rate
        ([0.0, 2.0], [-4.0, 1.0], None),  # one grows, the other shrinks
        ([-1.0, 1.0], [3.0, 3.0, 3.0], None),  # constant targets: min_span around them
        ([-1.0, 1.0], [1e38, -1e38], None),  # past float32's symlog range: kept within +-SYMLOG_LIMIT
        ([-1.0, 1.0], [np.nan, 50.0, -1e4, 2.0], [1.0, 1.0, 0.0, 2.0]),  # NaN and a zero weight do not count
        ([-1.0, 1.0], [np.inf, 5.0], [1.0, -1.0]),  # nothing counts: unchanged
    ],
)
def test_one_support_update_matches_the_rule(support, targets, weights):
    head = head_with(support)
    head.update_support(np.asarray(targets, "float32"), None if weights is None else np.asarray(weights, "float32"))
    t = np.asarray(targets, np.float64)
    keep = np.isfinite(t) & (True if weights is None else np.asarray(weights) > 0)
    want = numpy_rule(*support, list(symlog(t[keep])))
    np.testing.assert_allclose(to_np(head.support), want, rtol=1e-6, atol=1e-6)
    low, high = to_np(head.support)
    assert np.all((symlog(t[keep]) >= low) & (symlog(t[keep]) <= high))  # every target counted is covered


def test_the_docstring_example():
    head = AdaptiveSupportHead(lower_bound=-0.2, upper_bound=0.2)
    head(np.ones((2, 8), "float32"))
    head.update_support(np.array([1000.0, -5.0], "float32"))
    assert [round(float(b), 2) for b in to_np(head.support)] == [-2.66, 7.78]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"encoding": "gauss"}, r"^encoding: got 'gauss', expected one of \['hl_gauss', 'two_hot'\]"),
        ({"sigma": 0.0}, r"^sigma: got 0.0, expected a finite number > 0"),
        ({"sigma": 1e38}, r"^sigma: got 1e\+38, expected a number in \["),
        ({"margin": -0.1}, r"^margin: got -0.1, expected a finite number in \[0, 1e\+06\]"),
        ({"shrink_rate": 1.5}, r"^shrink_rate: got 1.5, expected a finite number in \[0, 1\]"),
        ({"min_span": 0.0}, r"^min_span: got 0.0, expected a finite number in \(0, "),
        ({"bin_scheme": "symexp"}, r"^bin_scheme: got 'symexp' with head='adaptive', expected one of"),
        ({"lower_bound": 1.0, "upper_bound": 1.0}, r"^lower_bound/upper_bound: got \(1.0, 1.0\)"),
    ],
)
def test_bad_options_are_refused_naming_them(options, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveSupportHead(**options)


def test_an_update_before_the_support_exists_is_refused():
    with pytest.raises(ValueError, match=r"^update_support: the head has no support yet"):
        AdaptiveSupportHead().update_support(np.ones(3, "float32"))


def symlog_error(critic, h, z, targets):
    return float(np.mean(np.abs(to_np(critic(h, z)[0]) - symlog(targets))))


def test_a_range_100_times_too_narrow_adapts_and_the_value_error_falls_where_a_fixed_head_cannot():
    # Returns of 500 to 2000 against bounds of +-0.2 (the default +-20 over 100): the fixed head's value can
    # never leave [-0.2, 0.2], so its symlog error stays above symlog(500) - 0.2 = 6.0.
    rng = np.random.default_rng(0)
    targets = rng.uniform(500.0, 2000.0, size=8).astype("float32")
    errors = {}
    for head in ("adaptive", "two_hot"):
        keras.utils.set_random_seed(0)
        critic = CriticNetwork(model_size="nano", head=head, lower_bound=-0.2, upper_bound=0.2)
        trainer = CriticTrainer(critic, learning_rate=3e-2, ema_regularizer_weight=0.0, jit_compile=False)
        h, z = random_inputs(critic, 8)
        errors[head] = [symlog_error(critic, h, z, targets)]
        for _ in range(10):
            trainer.train_step(h, z, targets, np.ones(8, "float32"))
        errors[head].append(symlog_error(critic, h, z, targets))
    assert errors["two_hot"][1] > 6.0
    assert errors["adaptive"][1] < 1.0 < errors["adaptive"][0] / 5, errors


def trained(jit_compile, steps=3, **options):
    keras.utils.set_random_seed(0)
    critic = CriticNetwork(model_size="nano", head="adaptive", lower_bound=-0.2, upper_bound=0.2, **options)
    randomize(critic, seed=2)
    critic.return_layer.support.assign(np.array([-0.2, 0.2], "float32"))
    critic.init_ema()
    trainer = CriticTrainer(critic, learning_rate=1e-2, ema_update_period=2, jit_compile=jit_compile)
    h, z = random_inputs(critic, 6)
    targets = np.random.default_rng(3).uniform(-50.0, 3000.0, size=6).astype("float32")
    metrics = [trainer.train_step(h, z, targets, np.ones(6, "float32")) for _ in range(steps)]
    return critic, trainer, metrics, targets


def test_the_compiled_step_updates_the_support_as_the_eager_step_all_or_nothing_and_shares_it_exactly():
    eager, _, eager_metrics, targets = trained(False)
    jitted, trainer, metrics, _ = trained(True)
    for critic in (eager, jitted):
        fast, slow = to_np(critic.return_layer.support), to_np(critic.return_layer_ema.support)
        np.testing.assert_array_equal(slow, fast)  # copied at every step, due or not (period 2), never blended
        assert fast[0] <= symlog(targets).min() and fast[1] >= symlog(targets).max()
    np.testing.assert_allclose(to_np(jitted.return_layer.support), to_np(eager.return_layer.support), rtol=1e-6)
    # Step 1 encoded on the initial support (clipped targets), step 2 on the adapted one.
    for run in (eager_metrics, metrics):
        assert float(to_np(run[0]["clipped_fraction"])) == 1.0
        assert float(to_np(run[1]["clipped_fraction"])) == 0.0
    for got, want in zip(metrics, eager_metrics):
        np.testing.assert_allclose(to_np(got["total"]), to_np(want["total"]), rtol=1e-5)

    # A skipped step leaves the support as it was, and so does a loss computed outside a step.
    critic, before = jitted, to_np(jitted.return_layer.support)
    h, z = random_inputs(critic, 6)
    weights = np.ones(6, "float32")
    weights[2] = -1.0  # (a backend tensor: not read on the host; the step is skipped)
    skipped = trainer.train_step(h, z, 100 * targets, keras.ops.convert_to_tensor(weights))
    assert float(to_np(skipped["step_skipped"])) == 1.0
    np.testing.assert_array_equal(to_np(critic.return_layer.support), before)
    value, logits = critic(h, z)
    critic_loss(logits, 100 * targets, value, np.ones(6, "float32"), **critic.loss_options())
    np.testing.assert_array_equal(to_np(critic.return_layer.support), before)
    # A loop of one's own: update_support, then update_ema copies it (not due at step 1 of period 2, still).
    critic.return_layer.update_support(100 * targets)
    critic.update_ema(step=1, period=2)
    np.testing.assert_array_equal(to_np(critic.return_layer_ema.support), to_np(critic.return_layer.support))
    assert not np.array_equal(to_np(critic.return_layer.support), before)


def test_compiled_passes_read_the_support_when_they_run():
    critic = CriticNetwork(model_size="nano", head="adaptive")
    randomize(critic, seed=4)
    h, z = random_inputs(critic, 5)
    _, logits = critic(h, z)

    def loss_of(support, lg, t, w):
        # JAX's jit takes a variable read outside a `StatelessScope` as a constant of the trace (its compiled steps,
        # the trainer's included, pass the variables' values in): here the support is passed in that way.
        with keras.StatelessScope(
            state_mapping=[(critic.return_layer.support, support)] if support is not None else []
        ):
            return critic_loss(lg, t, None, w, ema_logits=lg, **critic.loss_options())["total"]

    loss = compiled(loss_of if BACKEND == "jax" else lambda s, lg, t, w: loss_of(None, lg, t, w))
    targets = keras.ops.convert_to_tensor(np.linspace(-30.0, 30.0, 5).astype("float32"))
    weights = keras.ops.convert_to_tensor(np.ones(5, "float32"))
    for support in ([-3.0, 4.0], [0.5, 9.0]):
        for head in (critic.return_layer, critic.return_layer_ema):
            head.support.assign(np.array(support, "float32"))
        p = np.exp(log_softmax(to_np(logits)))
        want = p @ np.linspace(*support, 255)
        for _ in range(2):  # the critic's compiled call (a replayed trace on PyTorch), twice
            value, again = critic(h, z)
            np.testing.assert_allclose(to_np(again), to_np(logits), rtol=1e-6)
            np.testing.assert_allclose(to_np(value), want, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(to_np(critic(h, z, use_ema=True)[0]), want, rtol=1e-5, atol=1e-5)
        eager = critic_loss(logits, targets, None, weights, ema_logits=logits, **critic.loss_options())["total"]
        given = keras.ops.convert_to_tensor(np.array(support, "float32"))
        np.testing.assert_allclose(to_np(loss(given, logits, targets, weights)), to_np(eager), rtol=1e-5)


def test_an_export_serves_the_support_it_was_made_with(tmp_path):
    from tests.files.test_export import exported

    critic = CriticNetwork(model_size="nano", head="adaptive")
    randomize(critic, seed=5)
    for head in (critic.return_layer, critic.return_layer_ema):
        head.support.assign(np.array([-2.0, 6.0], "float32"))
    h, z = random_inputs(critic, 3)
    made_with = to_np(critic(h, z)[0])
    formats = [f for f in SUPPORTED[BACKEND] if f != "litert"] or list(SUPPORTED[BACKEND])
    serve = exported(critic, tmp_path, formats[0])
    critic.return_layer.support.assign(np.array([-1.0, 1.0], "float32"))
    assert not np.allclose(to_np(critic(h, z)[0]), made_with)
    np.testing.assert_allclose(serve(h, z)[1], made_with, rtol=1e-5, atol=1e-5)
