"""`metrics="core"`: the same update as the default, without the diagnostics' reductions."""

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer, MultiCritic, ReturnNormalizer
from multicritic.training.step import CORE_METRICS
from tests.conftest import random_inputs, randomize, to_np
from tests.training.test_step_safety import assert_unchanged, direct_batch, dream_batch, state


def pair(**kwargs):
    """Two trainers of one random critic, `metrics="all"` and `"core"`."""
    out = []
    for metrics in ("all", "core"):
        critic = CriticNetwork(model_size="nano", **kwargs)
        randomize(critic, seed=0)
        out.append(CriticTrainer(critic, learning_rate=1e-3, metrics=metrics, seed=0))
    return out


@pytest.mark.parametrize("kwargs", [{}, {"head": "hl_gauss"}, {"ensemble_size": 2}])
def test_core_metrics_train_exactly_as_the_default(kwargs):
    full, core = pair(**kwargs)
    for seed in range(3):
        a = to_np(full.train_step(*direct_batch(full.critic, seed=seed)))
        b = to_np(core.train_step(*direct_batch(core.critic, seed=seed)))
        assert sorted(b) == sorted(CORE_METRICS) and set(b) < set(a)
        for key in CORE_METRICS:
            np.testing.assert_allclose(b[key], a[key], rtol=1e-6, err_msg=key)
        a = to_np(full.train_on_dream(*dream_batch(full.critic, seed=seed)))
        b = to_np(core.train_on_dream(*dream_batch(core.critic, seed=seed)))
        assert sorted(b) == sorted(CORE_METRICS)
        np.testing.assert_allclose(b["total"], a["total"], rtol=1e-6)
    for x, y in zip(state(full), state(core)):
        np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_core_metrics_still_skip_invalid_inputs_whole(policy):
    # A negative weight or a non-finite state skips the step through its non-finite gradients (float32) or,
    # under a loss-scale optimizer, through the loss's own check, which leaves the loss scale as it was.
    keras.config.set_dtype_policy(policy)
    try:
        critic = CriticNetwork(model_size="nano")
        randomize(critic, seed=0)
        trainer = CriticTrainer(critic, learning_rate=1e-3, metrics="core")
        trainer.train_step(*direct_batch(critic, seed=0))
        before = state(trainer)
        h, z, targets, weights = direct_batch(critic, seed=1)
        weights[3] = -1.0
        metrics = to_np(trainer.train_step(h, z, targets, keras.ops.convert_to_tensor(weights)))
        assert metrics["step_skipped"] == 1.0
        assert_unchanged(trainer, before)
        h, z, rewards, continues = dream_batch(critic)
        h[1, 2, 0] = np.nan
        for bad in ({"h": keras.ops.convert_to_tensor(h)}, {"continues": keras.ops.convert_to_tensor(2 * continues)}):
            batch = dict(zip(("h", "z", "rewards", "continues"), dream_batch(critic)), **bad)
            metrics = to_np(trainer.train_on_dream(**batch))
            assert metrics["step_skipped"] == 1.0, bad
            assert_unchanged(trainer, before)
        metrics = to_np(trainer.train_step(*direct_batch(critic, seed=2)))
        assert metrics["step_skipped"] == 0.0
    finally:
        keras.config.set_dtype_policy("float32")


def test_core_metrics_keep_a_multi_critics_normaliser_statistics():
    runs = []
    for metrics in ("all", "core"):
        multi = MultiCritic(
            {"task": {"model_size": "nano"}, "explore": {"model_size": "nano"}},
            normalizers={"explore": ReturnNormalizer(decay=0.5)},
        )
        multi.set_weights([np.full(w.shape, 0.01, "float32") for w in multi.get_weights()])
        h, z, rewards, continues = dream_batch(multi.critics["task"])
        out = to_np(
            CriticTrainer(multi, metrics=metrics).train_on_dream(
                h, z, {"task": 1000 * rewards, "explore": rewards}, continues
            )
        )
        runs.append((out, [to_np(v) for n in multi.normalizers.values() for v in n.variables]))
    (full, normalizers), (core, core_normalizers) = runs
    assert "explore/return_high" in core and "task/value_nll" not in core
    for x, y in zip(normalizers, core_normalizers):
        np.testing.assert_allclose(y, x, rtol=1e-6)


def test_metrics_option_is_checked_and_fixed():
    critic = CriticNetwork(model_size="nano")
    critic(*random_inputs(critic, 2))
    with pytest.raises(ValueError, match=r"metrics: got 'some', expected one of \['all', 'core'\]"):
        CriticTrainer(critic, metrics="some")
    trainer = CriticTrainer(critic, metrics="core")
    assert trainer.options()["metrics"] == "core"
    with pytest.raises(ValueError, match="metrics"):
        trainer.metrics = "all"
