"""The TensorFlow backend under a `tf.distribute` strategy: where a step may run, and the hosts it sees."""

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
