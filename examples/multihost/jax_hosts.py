"""JAX on several hosts: one process per host, `jax.distributed.initialize`, a Keras `DataParallel` over all.

Every process runs this same script with its own `--process-id`; process 0
also runs the coordinator (at `--coordinator`, an address every host can
reach). The critic's variables are replicated on the global device list
(every device of every host); each process passes only its own rows of the
global batch, and XLA all-reduces the gradients across the hosts (gloo on
CPU, NCCL on GPU). Two hosts on one machine:

    python examples/multihost/local.py jax

On two real hosts (10.0.0.1 runs the coordinator):

    host 0: python examples/multihost/jax_hosts.py --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0
    host 1: python examples/multihost/jax_hosts.py --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 1

A lost process is noticed by the coordinator's heartbeat (`--timeout`
seconds) or, sooner, by the peer's collective failing; the others then stop
with an error instead of waiting. A process late to its first collective
is waited for 30 s: the deadline of the CPU collectives' (gloo's) set-up
through the coordinator, fixed in jax 0.10.2 (`jax.distributed.initialize`
takes no such timeout, and `--xla_cpu_collective_timeout_seconds` does not
change it); the others then fail, and their shutdown waits at most
`--timeout` seconds more for it (`shutdown_timeout_seconds`, 300 s unless
set), after which every process, the late one included, stops with an
error.
"""

from __future__ import annotations

import os
import sys

os.environ["KERAS_BACKEND"] = "jax"  # this example runs JAX whatever the environment says
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def main():
    p = common.parser(__doc__)
    p.add_argument("--coordinator", default="127.0.0.1:1234", help="HOST:PORT of process 0's coordinator")
    p.add_argument("--num-processes", type=int, default=1)
    p.add_argument("--process-id", type=int, default=0)
    args = p.parse_args()
    import jax

    if args.num_processes > 1:
        jax.distributed.initialize(
            args.coordinator,
            args.num_processes,
            args.process_id,
            initialization_timeout=int(args.timeout),
            heartbeat_timeout_seconds=int(args.timeout),
            # A process that failed waits this long at exit for the others (a late one among them) to shut down.
            shutdown_timeout_seconds=int(args.timeout),
        )
    import keras

    # Every device of every process; the batch is split over them in process order.
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=keras.distribution.list_devices()))
    common.train(args)


if __name__ == "__main__":
    main()
