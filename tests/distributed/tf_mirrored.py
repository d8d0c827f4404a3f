"""Subprocess body of the TensorFlow MirroredStrategy test: 2 logical CPUs, data-parallel vs single step."""

import json
import os
import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

from multicritic import CriticTrainer  # noqa: E402
from tests.distributed.common import batches, for_critic, initial_weights, make_critic  # noqa: E402

KIND = os.environ.get("MULTICRITIC_DP_CRITIC", "single")


def run(strategy=None):
    scope = strategy.scope() if strategy else tf.name_scope("single")
    with scope:
        critic = make_critic(KIND)
        critic.set_weights(initial_weights(critic))
        trainer = CriticTrainer(critic, learning_rate=1e-3, check_finite=False)
    # One batch with a non-finite target in each replica's half: the count
    # must add up across replicas, the means must average.
    h, z, targets, weights = batches("direct")[0]
    targets = targets.copy()
    targets[[1, 12]] = np.nan
    metrics = [
        trainer.train_step(*for_critic(KIND, b, "direct")) for b in batches("direct") + [(h, z, targets, weights)]
    ]
    metrics += [trainer.train_on_dream(*for_critic(KIND, b, "dream")) for b in batches("dream")]
    return (
        [keras.ops.convert_to_numpy(v.value) for v in critic.weights],
        [{k: float(keras.ops.convert_to_numpy(v)) for k, v in m.items()} for m in metrics],
        critic,
    )


single_w, single_m, _ = run()
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
multi_w, multi_m, critic = run(strategy)
assert strategy.num_replicas_in_sync == 2
mirrored = type(critic.trainable_variables[0].value).__name__
max_w = max(float(np.abs(a - b).max()) for a, b in zip(single_w, multi_w))
max_loss = max(abs(a["total"] - b["total"]) for a, b in zip(single_m, multi_m))
max_norm = max(abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(single_m, multi_m))
max_metric = max(abs(a[k] - b[k]) / max(1.0, abs(b[k])) for a, b in zip(single_m, multi_m) for k in b)
print(
    json.dumps(
        {
            "max_weight_diff": max_w,
            "max_loss_diff": max_loss,
            "max_grad_norm_rel": max_norm,
            "max_metric_diff": max_metric,
            "nonfinite_targets": multi_m[3]["nonfinite_targets"],
            "metric_keys_equal": all(set(a) == set(b) for a, b in zip(single_m, multi_m)),
            "variable": mirrored,
        }
    )
)
sys.exit(0)
