"""TensorFlow on several hosts: a `MultiWorkerMirroredStrategy` over the workers named in `TF_CONFIG`.

Every host runs this script with the same cluster in `TF_CONFIG` and its own
task index; worker 0 is the chief (it writes the checkpoints). The critic and
trainer are built inside the strategy's scope, so every variable is mirrored
on every worker (initial values broadcast from the chief); each worker passes
its own rows of the global batch, the gradients and metrics are all-reduced
across the workers (gradients summed, means averaged, counts added), and the
return normaliser's statistics are all-gathered. Two hosts on one machine:

    python examples/multihost/local.py tensorflow

On two real hosts:

    host 0: TF_CONFIG='{"cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]},
                        "task": {"type": "worker", "index": 0}}' python examples/multihost/tensorflow_hosts.py
    host 1: the same with "index": 1

A collective gives up on a lost worker after `--timeout` seconds
(`CommunicationOptions(timeout_seconds=...)`); TensorFlow's coordination
service also notices a worker that stops sending heartbeats.
"""

from __future__ import annotations

import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"  # this example runs TensorFlow whatever the environment says
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def main():
    args = common.parser(__doc__).parse_args()
    import tensorflow as tf

    # TF_CONFIG (the environment) names the cluster and this worker; without it, one worker.
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(timeout_seconds=args.timeout)
    )
    # Built inside the strategy's scope (mirrored variables), trained outside it.
    common.train(args, scope=strategy.scope)


if __name__ == "__main__":
    main()
