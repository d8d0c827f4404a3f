"""MultiCritic: one critic per reward stream, trained in one step."""

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer, MultiCritic, ReturnNormalizer
from tests.conftest import CRITIC_KINDS, inputs_of, random_inputs, to_np


def dream(critic, seed=0, horizon=5, batch=4):
    """`(h, z, rewards, continues)`, a features critic's `(x, rewards, continues)`."""
    rng = np.random.default_rng(seed)
    flat = inputs_of(critic, (horizon + 1) * batch, seed)
    inputs = [x.reshape((horizon + 1, batch) + x.shape[1:]) for x in flat]
    rewards = (rng.normal(size=(horizon + 1, batch)) * 10).astype("float32")
    continues = (rng.random((horizon + 1, batch)) > 0.1).astype("float32")
    return (*inputs, rewards, continues)


def randomized_pair():
    a, b = CriticNetwork(model_size="nano", name="a"), CriticNetwork(model_size="nano", head="hl_gauss", name="b")
    rng = np.random.default_rng(1)
    for critic in (a, b):
        for v in critic.fast_weights:
            v.assign(rng.normal(scale=0.3, size=tuple(v.shape)).astype("float32"))
        critic.init_ema()
    return a, b


def test_each_stream_moves_as_its_own_critic_scaled_by_its_weight():
    # Plain SGD, no clipping: stream s's gradients are w_s times its own
    # critic's, so the joint step moves it as a lone step with w_s * lr.
    a, b = randomized_pair()
    twins = [CriticNetwork.from_config(c.get_config()) for c in (a, b)]
    for twin, critic in zip(twins, (a, b)):
        twin.set_weights(critic.get_weights())
    multi = MultiCritic({"a": a, "b": b}, stream_weights={"b": 0.5})
    lr = 0.1
    trainer = CriticTrainer(multi, keras.optimizers.SGD(lr), grad_clip=None)
    h, z, rewards, continues = dream(a)
    metrics = to_np(trainer.train_on_dream(h, z, {"a": rewards, "b": -2 * rewards}, continues))
    lone = []
    for twin, r, w in zip(twins, (rewards, -2 * rewards), (1.0, 0.5)):
        lone.append(
            to_np(CriticTrainer(twin, keras.optimizers.SGD(w * lr), grad_clip=None).train_on_dream(h, z, r, continues))
        )
    np.testing.assert_allclose(metrics["a/total"], lone[0]["total"], rtol=1e-5)
    np.testing.assert_allclose(metrics["b/total"], lone[1]["total"], rtol=1e-5)
    np.testing.assert_allclose(metrics["total"], lone[0]["total"] + 0.5 * lone[1]["total"], rtol=1e-5)
    for twin, critic in zip(twins, (a, b)):
        for x, y in zip(twin.weights, critic.weights):
            np.testing.assert_allclose(to_np(x), to_np(y), rtol=1e-5, atol=1e-6, err_msg=x.path)


def test_the_normalisers_follow_their_streams():
    multi = MultiCritic(
        {"task": {"model_size": "nano"}, "explore": {"model_size": "nano"}},
        normalizers={"explore": ReturnNormalizer(decay=0.5)},
    )
    trainer = CriticTrainer(multi)
    h, z, rewards, continues = dream(multi.critics["task"])
    metrics = to_np(trainer.train_on_dream(h, z, {"task": 1000 * rewards, "explore": rewards}, continues))
    task, explore = multi.normalizers["task"], multi.normalizers["explore"]
    np.testing.assert_allclose(to_np(task.low), 0.01 * metrics["task/return_low"], rtol=1e-6)
    np.testing.assert_allclose(to_np(explore.high), 0.5 * metrics["explore/return_high"], rtol=1e-6)
    assert metrics["task/return_high"] - metrics["task/return_low"] > 100 * (
        metrics["explore/return_high"] - metrics["explore/return_low"]
    )


def test_statistics_are_the_percentiles():
    norm = ReturnNormalizer()
    x = np.random.default_rng(0).normal(size=(40, 7)).astype("float32") * 5
    stats = to_np(norm.statistics(x))
    low, high = stats["return_low"], stats["return_high"]
    np.testing.assert_allclose([low, high], np.percentile(x, [5, 95]), rtol=1e-5)
    norm.update(low, high)
    np.testing.assert_allclose(to_np(norm.scale()), max(1.0, 0.01 * (high - low)), rtol=1e-6)
    assert float(to_np(ReturnNormalizer(impl="none").scale())) == 1.0


@pytest.mark.parametrize("kind", list(CRITIC_KINDS))
def test_checkpoints_and_configs_round_trip(kind, tmp_path):
    """A MultiCritic of `(h, z)` critics, or of features critics (`multi(x)`, `train_on_dream(x, ...)`)."""
    multi = MultiCritic(
        {
            "task": {"model_size": "nano", **CRITIC_KINDS[kind]},
            "explore": {"model_size": "nano", "ensemble_size": 2, "aggregation": "min_of_random", **CRITIC_KINDS[kind]},
        }
    )
    trainer = CriticTrainer(multi, seed=3)
    *inputs, rewards, continues = dream(multi.critics["task"])
    trainer.train_on_dream(*inputs, {"task": rewards, "explore": rewards}, continues)
    path = trainer.save(tmp_path / "multi")
    clone = MultiCritic.from_config(multi.get_config())
    restored = CriticTrainer(clone, seed=3)
    restored.restore(path)
    for x, y in zip(trainer.state_variables, restored.state_variables):
        np.testing.assert_array_equal(to_np(x), to_np(y))
    a = to_np(trainer.train_on_dream(*inputs, {"task": rewards, "explore": rewards}, continues))
    b = to_np(restored.train_on_dream(*inputs, {"task": rewards, "explore": rewards}, continues))
    assert a["total"] == b["total"]
    outputs = clone(*[x[0] for x in inputs])
    np.testing.assert_array_equal(to_np(outputs["task"][0]), to_np(clone.critics["task"](*[x[0] for x in inputs])[0]))
    assert tuple(outputs["explore"][0].shape) == (2, 4)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: MultiCritic({}), "critics: got {}"),
        (lambda: MultiCritic({"a b": {"model_size": "nano"}}), "stream name 'a b' is not an identifier"),
        (lambda: MultiCritic({"a": {"model_size": "nano"}, "b": {"model_size": "micro"}}), "critics: got input sizes"),
        (
            lambda: MultiCritic({"a": {"model_size": "nano"}, "b": {"model_size": "nano", "input_size": 36}}),
            r"critics: got input sizes .*'x': \(36,\).*expected built critics of one size \(and one kind",
        ),
        (
            lambda: MultiCritic({"a": {"model_size": "nano"}}, stream_weights={"c": 1.0}),
            r"stream_weights: got streams \['c'\]",
        ),
        (
            lambda: MultiCritic({"a": CriticNetwork(model_size="nano"), "b": CriticNetwork(model_size="nano")}),
            "expected distinct names",
        ),
    ],
)
def test_bad_multi_critics(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_rewards_must_name_every_stream():
    multi = MultiCritic({"task": {"model_size": "nano"}, "explore": {"model_size": "nano"}})
    trainer = CriticTrainer(multi)
    h, z, rewards, continues = dream(multi.critics["task"])
    with pytest.raises(ValueError, match=r"rewards: got \['task'\], expected a dict with one array per stream"):
        trainer.train_on_dream(h, z, {"task": rewards}, continues)
    with pytest.raises(ValueError, match="rewards: got ndarray, expected a dict"):
        trainer.train_on_dream(h, z, rewards, continues)
    single = CriticTrainer(CriticNetwork(model_size="nano"))
    with pytest.raises(ValueError, match="rewards: got a dict, expected one array"):
        single.train_on_dream(h, z, {"task": rewards}, continues)


def test_keras_file_round_trip(tmp_path):
    multi = MultiCritic({"task": {"model_size": "nano"}, "explore": {"model_size": "nano", "ensemble_size": 2}})
    rng = np.random.default_rng(0)
    for v in multi.weights:
        v.assign(rng.normal(size=tuple(v.shape)).astype("float32"))
    h, z = random_inputs(multi.critics["task"], 3)
    path = str(tmp_path / "multi.keras")
    multi.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, MultiCritic) and loaded.stream_names == ["task", "explore"]
    for stream in ("task", "explore"):
        np.testing.assert_array_equal(to_np(loaded(h, z)[stream][1]), to_np(multi(h, z)[stream][1]))
    np.testing.assert_array_equal(to_np(loaded.normalizers["task"].high), to_np(multi.normalizers["task"].high))


# --- Issue 31: streams are checked, and non-finite returns never enter a normaliser ---------------------------------


def states(multi):
    return [to_np(v).copy() for v in multi.weights] + [
        to_np(v).copy() for n in multi.normalizers.values() for v in n.weights
    ]


def test_a_nan_reward_tensor_never_enters_the_normaliser():
    """Finding 3: the NaN target was dropped from the loss but entered the stream's percentiles ([nan, nan])."""
    from tests import numpy_reference as ref

    multi = MultiCritic({"task": {"model_size": "nano"}, "explore": {"model_size": "nano"}})
    task = multi.critics["task"]
    for v in task.fast_weights:
        v.assign(np.random.default_rng(3).normal(scale=0.3, size=tuple(v.shape)).astype("float32"))
    task.init_ema()
    trainer = CriticTrainer(multi)
    h, z, rewards, continues = dream(task)
    values = ref.symexp(to_np(task(h.reshape(-1, h.shape[-1]), z.reshape((-1,) + z.shape[2:]))[0]).astype(np.float64))
    bad = rewards.copy()
    bad[1, 2] = np.nan  # enters the lambda-return of step 0 of sequence 2 only
    metrics = to_np(
        trainer.train_on_dream(h, z, {"task": keras.ops.convert_to_tensor(bad), "explore": rewards}, continues)
    )
    targets = ref.lambda_returns(bad.astype(np.float64), continues, values.reshape(bad.shape))
    assert np.isnan(targets).sum() == 1 and metrics["step_skipped"] == 0.0
    want = np.nanpercentile(targets, [5, 95])
    np.testing.assert_allclose([metrics["task/return_low"], metrics["task/return_high"]], want, rtol=1e-4, atol=1e-5)
    norm = multi.normalizers["task"]
    np.testing.assert_allclose([to_np(norm.low), to_np(norm.high)], 0.01 * want, rtol=1e-4, atol=1e-7)
    # A stream whose returns are all non-finite keeps its statistics.
    before = [to_np(norm.low).copy(), to_np(norm.high).copy()]
    trainer.train_on_dream(
        h, z, {"task": keras.ops.convert_to_tensor(np.full_like(rewards, np.inf)), "explore": rewards}, continues
    )
    np.testing.assert_array_equal([to_np(norm.low), to_np(norm.high)], before)


def test_fit_refuses_streams_it_does_not_have():
    """Findings 5 and 11: an extra stream trained and was ignored, a plain array or a missing stream raised a
    KeyError."""
    multi = MultiCritic({"task": {"model_size": "nano"}, "explore": {"model_size": "nano"}})
    multi.compile()
    h, z, rewards, continues = dream(multi.critics["task"], batch=6)
    hb, zb, rb, cb = h.swapaxes(0, 1), z.swapaxes(0, 1), rewards.T.copy(), continues.T.copy()
    both = {"task": rb, "explore": rb}
    before = states(multi)
    for given, message in (
        ({**both, "bogus": rb}, r"got a dict with keys \['bogus', 'explore', 'task'\]"),
        ({"task": rb}, r"got a dict with keys \['task'\]"),
        (rb, "got one array"),
    ):
        with pytest.raises(ValueError, match=r"rewards: " + message + r", expected a dict with one array per stream"):
            multi.fit((hb, zb, given, cb), verbose=0)
        targets = given if not isinstance(given, dict) else {k: v[:, 0] for k, v in given.items()}
        with pytest.raises(ValueError, match=r"y \(value_targets\): " + message):
            multi.fit((hb[:, 0], zb[:, 0]), targets, verbose=0)
    with pytest.raises(ValueError, match=r"sample_weight: got a dict with keys"):
        multi.fit(
            (hb[:, 0], zb[:, 0]), {"task": rb[:, 0], "explore": rb[:, 0]}, sample_weight={"task": cb[:, 0]}, verbose=0
        )
    for a, b in zip(states(multi), before):
        np.testing.assert_array_equal(a, b)
    multi.fit((hb, zb, both, cb), verbose=0)
    assert int(to_np(multi.optimizer.iterations)) == 1


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda n: MultiCritic(
                {"a": {"model_size": "nano"}, "b": {"model_size": "nano"}}, normalizers={"a": n, "b": n}
            ),
            r"normalizers: got one ReturnNormalizer object for the streams \['a', 'b'\]",
        ),
        (lambda n: MultiCritic({"a": {"model_size": "nano"}}, stream_weights=[1.0]), "stream_weights: got a list"),
        (
            lambda n: MultiCritic({"a": {"model_size": "nano"}}, normalizers={"a": "percentile"}),
            r"normalizers\['a'\]: got 'percentile'",
        ),
        (lambda n: MultiCritic({"a": {"model_size": "nano", "sizes": 3}}), r"critics\['a'\]: got the option 'sizes'"),
        (
            lambda n: MultiCritic({"a": {"model_size": "nano"}}, stream_weights={"a": float("nan")}),
            r"stream_weights\['a'\]: got nan",
        ),
    ],
)
def test_bad_streams_are_refused(make, match):
    """Finding 8: one normaliser object for two streams (their statistics would mix)."""
    with pytest.raises(ValueError, match=match):
        make(ReturnNormalizer())
