"""The TensorFlow backend: `"auto"` switching a step to XLA, and under a `tf.distribute` strategy where a step may run and the hosts it sees."""

import numpy as np
import pytest

from tests.conftest import BACKEND, to_np

pytestmark = pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute")


def test_a_step_inside_the_strategy_scope_is_refused_and_changes_nothing():
    import tensorflow as tf

    from multicritic import CriticNetwork, CriticTrainer
    from tests.distributed.common import batches

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        trainer = CriticTrainer(CriticNetwork(model_size="nano"))
        before = [to_np(v) for v in trainer.state_variables]
        # Keras's optimizer updates from a replica context inside a scope, and the step's update runs in the
        # cross-replica one: refused with the way out, instead of failing inside Keras.
        with pytest.raises(ValueError, match=r"train step: got a call inside `MirroredStrategy.scope\(\)`"):
            trainer.train_step(*batches("direct")[0])
    for a, v in zip(before, trainer.state_variables):
        np.testing.assert_array_equal(a, to_np(v))
    metrics = trainer.train_step(*batches("direct")[0])  # outside the scope: trains
    assert np.isfinite(float(metrics["total"])) and int(to_np(trainer.steps)) == 1


def test_one_worker_is_host_zero_of_one():
    import tensorflow as tf

    from multicritic import backend

    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        assert backend.current().hosts() == (0, 1)
        np.testing.assert_array_equal(backend.current().gather_hosts(np.arange(4, dtype=np.uint8)), [[0, 1, 2, 3]])


def test_auto_switches_a_step_kind_to_xla_at_its_nth_call_with_the_same_values(monkeypatch):
    import keras

    from multicritic import CriticNetwork, CriticTrainer
    from multicritic import backend as backend_contract
    from tests.conftest import randomize
    from tests.distributed.common import batches

    monkeypatch.setattr(backend_contract, "AUTO_COMPILE_AFTER_STEPS", 2)
    data = batches("direct", steps=4)

    def trained(jit_compile):
        keras.utils.set_random_seed(0)
        critic = CriticNetwork(model_size="nano")
        randomize(critic)
        trainer = CriticTrainer(critic, jit_compile=jit_compile)
        losses = [float(trainer.train_step(*batch)["total"]) for batch in data]
        return trainer, losses, [to_np(v) for v in trainer.state_variables]

    auto, auto_losses, auto_state = trained("auto")
    graph, graph_losses, graph_state = trained(False)
    (run,) = auto._compiled.values()
    assert sorted(key[-1] for key in run.compiled) == [False, True]  # two plain-graph calls, then XLA
    (run,) = graph._compiled.values()
    assert [key[-1] for key in run.compiled] == [False]
    np.testing.assert_allclose(auto_losses, graph_losses, rtol=1e-5)
    assert auto_losses[:2] == graph_losses[:2]  # the same graph before the switch
    for a, g in zip(auto_state, graph_state):
        np.testing.assert_allclose(a, g, rtol=1e-4, atol=1e-6)
