"""Subprocess body of the JAX DataParallel test (JAX_NUM_CPU_DEVICES set by the caller)."""

import json
import os

import keras
import numpy as np

from multicritic import CriticTrainer
from tests.distributed.common import batches, for_critic, initial_weights, make_critic

KIND = os.environ.get("MULTICRITIC_DP_CRITIC", "single")


def run():
    critic = make_critic(KIND)
    critic.set_weights(initial_weights(critic))
    trainer = CriticTrainer(critic, learning_rate=1e-3)
    metrics = [trainer.train_step(*for_critic(KIND, b, "direct")) for b in batches("direct")]
    metrics += [trainer.train_on_dream(*for_critic(KIND, b, "dream")) for b in batches("dream")]
    return (
        critic,
        [keras.ops.convert_to_numpy(v.value) for v in critic.weights],
        [{k: float(v) for k, v in m.items()} for m in metrics],
    )


_, single_w, single_m = run()
devices = keras.distribution.list_devices()
keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
critic, multi_w, multi_m = run()
kernel = critic.trainable_variables[0].value
print(
    json.dumps(
        {
            "devices": len(devices),
            "replicated": bool(kernel.sharding.is_fully_replicated) and len(kernel.sharding.device_set) == len(devices),
            "max_weight_diff": max(float(np.abs(a - b).max()) for a, b in zip(single_w, multi_w)),
            "max_loss_diff": max(abs(a["total"] - b["total"]) for a, b in zip(single_m, multi_m)),
            "max_grad_norm_rel": max(
                abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(single_m, multi_m)
            ),
            # Every metric, relative to max(1, |single-device value|), as the TensorFlow test.
            "metric_keys_equal": all(set(a) == set(b) for a, b in zip(single_m, multi_m)),
            "metric_diffs": {
                k: max(abs(a[k] - b[k]) / max(1.0, abs(a[k])) for a, b in zip(single_m, multi_m) if k in a and k in b)
                for k in single_m[-1]
            },
        }
    )
)
