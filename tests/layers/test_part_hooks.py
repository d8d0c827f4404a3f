"""The parts' hooks (`multicritic.layers.part_hooks`): a part's `after_update` runs in every trainer step (eager
and compiled, ensembles) after the optimizer and before the EMA update, not in a skipped one; statistics are
collected inside a training step and assigned at once outside it, averaged over replicas."""

import threading

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer
from multicritic.layers import part_hooks
from multicritic.layers.mlp import MLP
from multicritic.trunks import TRUNKS
from tests.conftest import random_inputs, randomize, to_np


@keras.saving.register_keras_serializable(package="tests_part_hooks")
class HalvingTrunk(MLP):
    """The MLP whose kernels are halved after every update: a hook whose effect a test can compute."""

    has_after_update = True

    def after_update(self, twin=None):
        for dense in self.dense_layers:
            dense.kernel.assign(dense.kernel.value * 0.5)


@pytest.fixture
def halving():
    TRUNKS.register("halving", HalvingTrunk)
    try:
        yield
    finally:
        TRUNKS.unregister("halving")


@pytest.mark.parametrize("jit_compile, ensemble_size", [(False, 1), (True, 2)])
def test_after_update_runs_after_the_optimizer_and_before_the_ema(halving, jit_compile, ensemble_size):
    runs = {}
    for trunk in ("mlp", "halving"):
        critic = CriticNetwork(model_size="nano", trunk=trunk, ema_decay=0.5, ensemble_size=ensemble_size)
        randomize(critic, seed=1)
        trainer = CriticTrainer(critic, learning_rate=1e-2, jit_compile=jit_compile)
        h, z = random_inputs(critic, 5)
        trainer.train_step(h, z, np.full(5, 7.0, "float32"), np.ones(5, "float32"))
        runs[trunk] = critic
    plain, hooked = runs["mlp"], runs["halving"]
    kernels = {layer.kernel.path for layer in hooked.mlp.dense_layers}
    for p, q in zip(plain.fast_weights, hooked.fast_weights):
        want = to_np(p.value) * (0.5 if q.path in kernels else 1.0)
        np.testing.assert_allclose(to_np(q.value), want, rtol=1e-6, atol=1e-7, err_msg=q.path)
    for pe, pf, he, hf in zip(plain.ema_weights, plain.fast_weights, hooked.ema_weights, hooked.fast_weights):
        # Both slow copies started as the same copy: the hooked one moved towards the halved weights.
        start = 2.0 * to_np(pe.value) - to_np(pf.value)  # (the plain one is 0.5 * start + 0.5 * its update)
        np.testing.assert_allclose(to_np(he.value), 0.5 * start + 0.5 * to_np(hf.value), rtol=1e-5, atol=1e-6)


def test_a_skipped_step_runs_no_hook(halving):
    critic = CriticNetwork(model_size="nano", trunk="halving")
    randomize(critic, seed=2)
    before = [to_np(v.value) for v in critic.weights]
    h, z = random_inputs(critic, 3)
    weights = keras.ops.convert_to_tensor(np.full(3, -1.0, "float32"))
    metrics = CriticTrainer(critic).train_step(h, z, np.ones(3, "float32"), weights)
    assert float(to_np(metrics["step_skipped"])) == 1.0
    for got, want in zip(critic.weights, before):
        np.testing.assert_array_equal(to_np(got.value), want)


def test_every_registered_part_has_the_hooks_with_their_defaults():
    from multicritic.heads import HEADS

    for registry in (HEADS, TRUNKS):
        for name in registry:
            cls = registry[name]
            assert issubclass(cls, part_hooks.PartHooks), name
            assert isinstance(cls.uses_batch_statistics, bool) and isinstance(cls.has_after_update, bool)
    plain = CriticNetwork(model_size="nano")
    assert not part_hooks.has_after_update(plain.mlp) and plain.mlp.batch_statistics == []
    plain.after_update()  # nothing to do: nothing changes
    assert not part_hooks.uses_batch_statistics(object())  # a part without the mixin has the defaults


def test_statistics_are_collected_in_a_training_step_and_assigned_outside():
    v = keras.Variable(np.zeros(3, "float32"), trainable=False, name="stat")
    with part_hooks.training_step() as collected:
        part_hooks.update_statistics(v, np.ones(3, "float32"))
        assert part_hooks.in_training_step() is collected
        seen = []
        thread = threading.Thread(target=lambda: seen.append(part_hooks.in_training_step()))
        thread.start()
        thread.join()
        assert seen == [None]  # per thread
    assert part_hooks.in_training_step() is None
    np.testing.assert_array_equal(to_np(v.value), 0.0)
    assert list(collected.values) == [v.path]
    part_hooks.update_statistics(v, np.full(3, 2.0, "float32"))
    np.testing.assert_array_equal(to_np(v.value), 2.0)


def test_the_training_loss_carries_statistics_to_the_update_averaged_over_replicas():
    v = keras.Variable(np.zeros(2, "float32"), trainable=False, name="stat")

    def loss_fn(x):
        part_hooks.update_statistics(v, x * 2.0)
        return x.sum(), {"total": x.sum()}

    total, metrics = part_hooks.training_loss(loss_fn)(np.array([1.0, 3.0], "float32"))
    assert set(metrics) == {"total", part_hooks.STATISTICS + v.path}
    one = part_hooks.take_statistics(dict(metrics), [v], lambda x: x)
    assert one[0][0] is v and np.allclose(to_np(one[0][1]), [2.0, 6.0])
    two_replicas = part_hooks.take_statistics(metrics, [v], lambda x: keras.ops.concatenate([x, x * 0.0], 0))
    np.testing.assert_allclose(to_np(two_replicas[0][1]), [1.0, 3.0])
    assert set(metrics) == {"total"}  # taken out of the metrics
