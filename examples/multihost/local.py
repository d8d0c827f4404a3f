"""Two (or more) hosts on this machine: runs one engine's multi-host example as it runs on real hosts.

    python examples/multihost/local.py jax          [example arguments ...]
    python examples/multihost/local.py torch        [--max-restarts 1] [example arguments ...]
    python examples/multihost/local.py tensorflow   [example arguments ...]
    python examples/multihost/local.py ray          [example arguments ...]

Each "host" is a process of its own, with its own devices and rank, and
everything between them goes through localhost, with free ports picked here.
This script only starts what each host runs and waits for it; the engines'
own launchers do the rest:

- jax: `jax_hosts.py` once per host, `--coordinator 127.0.0.1:PORT
  --num-processes N --process-id I`;
- torch: `torchrun --nnodes=N --nproc-per-node=1 --rdzv-backend=c10d
  --rdzv-endpoint=127.0.0.1:PORT ... torch_hosts.py` once per host (the same
  command on each); torchrun restarts failed processes (`--max-restarts`);
- tensorflow: `tensorflow_hosts.py` once per host, each with the cluster's
  `TF_CONFIG` and its own task index;
- ray: a Ray cluster of N nodes (`ray start --head --num-cpus=1`, then
  `ray start --address=...` for each other node; one CPU per node, so Ray
  places one worker per node), then `ray_train.py --workers N` as the
  driver; the nodes are stopped at the end.

Every line a host prints is echoed with the host's tag; at the end one line per
host says how and when it exited (`local.py: host I exited with CODE at
UNIX-TIME`), and the exit code is 0 only if every host exited with 0.
`--host-args I "ARGS"` adds arguments to host I's command alone (to give one
host another configuration).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINES = ("jax", "torch", "tensorflow", "ray")
# torchrun's c10d rendezvous otherwise lends its workers one store for every restart round, where a restarted
# process group can read the previous round's addresses (pytorch/pytorch#135712): a fresh store each round.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def free_ports(n: int) -> list:
    """`n` distinct ports free now (all held open until all are picked)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


class Hosts:
    """The processes started here, their output echoed with a tag, stopped by their ids at the end."""

    def __init__(self):
        self.procs = []  # (tag, Popen)
        self.exits = {}  # tag -> (code, time)
        self._threads = []
        self._ready = {}

    def start(self, tag, cmd, env=None, ready=None):
        proc = subprocess.Popen(
            cmd,
            env=dict(os.environ, **(env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self.procs.append((tag, proc))
        event = self._ready[tag] = threading.Event()

        def echo():
            for line in proc.stdout:
                print(f"[{tag}] {line}", end="", flush=True)
                if ready and ready in line:
                    event.set()
            code = proc.wait()
            self.exits[tag] = (code, time.time())
            event.set()

        thread = threading.Thread(target=echo, daemon=True)
        thread.start()
        self._threads.append(thread)
        return proc

    def wait_ready(self, tag, timeout):
        if not self._ready[tag].wait(timeout):
            raise SystemExit(f"local.py: {tag} did not start within {timeout:.0f} s")
        if tag in self.exits:
            raise SystemExit(f"local.py: {tag} exited with {self.exits[tag][0]} while starting")

    def wait(self, tags):
        for tag, proc in self.procs:
            if tag in tags:
                proc.wait()
        for thread in self._threads:
            thread.join(timeout=5)

    def stop(self, grace=20.0):
        """SIGTERM to every process still running (their launchers stop what they started), then SIGKILL."""
        running = [(tag, p) for tag, p in self.procs if p.poll() is None]
        for _, proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.time() + grace
        for _, proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("engine", choices=ENGINES)
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--max-restarts", type=int, default=0, help="torch: torchrun's --max-restarts")
    p.add_argument(
        "--host-args",
        nargs=2,
        action="append",
        default=[],
        metavar=("I", "ARGS"),
        help="more arguments for host I alone",
    )
    args, example = p.parse_known_args()
    if example[:1] == ["--"]:
        example = example[1:]
    extra = {int(i): shlex.split(more) for i, more in args.host_args}
    python, n = sys.executable, args.hosts
    hosts = Hosts()
    signal.signal(signal.SIGTERM, lambda *_: (hosts.stop(), sys.exit(143)))
    tags = [f"host {i}" for i in range(n)]
    cleanup = []
    try:
        if args.engine == "jax":
            address = f"127.0.0.1:{free_port()}"
            for i in range(n):
                hosts.start(
                    tags[i],
                    [
                        python,
                        os.path.join(HERE, "jax_hosts.py"),
                        "--coordinator",
                        address,
                        "--num-processes",
                        str(n),
                        "--process-id",
                        str(i),
                        *example,
                        *extra.get(i, []),
                    ],
                )
        elif args.engine == "torch":
            endpoint = f"127.0.0.1:{free_port()}"
            # An id of this launch's own, not the port's: a launch that picked the same port cannot join this
            # one's rendezvous. The hosts' addresses are this machine's loopback, not its hostname's.
            rdzv_id = f"multicritic-{uuid.uuid4().hex[:12]}"
            for i in range(n):
                # `python -m torch.distributed.run` is `torchrun`.
                hosts.start(
                    tags[i],
                    [
                        python,
                        "-m",
                        "torch.distributed.run",
                        f"--nnodes={n}",
                        "--nproc-per-node=1",
                        "--rdzv-backend=c10d",
                        f"--rdzv-endpoint={endpoint}",
                        f"--rdzv-id={rdzv_id}",
                        "--local-addr=127.0.0.1",
                        f"--max-restarts={args.max_restarts}",
                        "--monitor-interval=0.5",
                        os.path.join(HERE, "torch_hosts.py"),
                        *example,
                        *extra.get(i, []),
                    ],
                    env=TORCHRUN_ENV,
                )
        elif args.engine == "tensorflow":
            workers = [f"127.0.0.1:{port}" for port in free_ports(n)]
            for i in range(n):
                config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
                hosts.start(
                    tags[i],
                    [python, os.path.join(HERE, "tensorflow_hosts.py"), *example, *extra.get(i, [])],
                    env={"TF_CONFIG": json.dumps(config)},
                )
        else:
            port, client, *agents = free_ports(2 + 4 * n)
            # Without token authentication: Ray turns it on for a cluster as soon as `~/.ray/auth_token` exists
            # (a `ray.init()` elsewhere on this machine writes one), which this local cluster must not depend on.
            ray_env = {"RAY_AUTH_MODE": "disabled"}
            ray = [
                python,
                "-m",
                "ray.scripts.scripts",
                "start",
                "--block",
                "--num-cpus=1",
                "--disable-usage-stats",
                "--node-ip-address=127.0.0.1",
                "--object-store-memory=100000000",
            ]
            for i in range(n):
                # A temporary directory of its own: `ray.init()` elsewhere on this machine must not find this cluster.
                node_dir = tempfile.mkdtemp(prefix="mcray-", dir="/tmp")
                node = [f"--temp-dir={node_dir}"]
                node += (
                    ["--head", f"--port={port}", f"--ray-client-server-port={client}", "--include-dashboard=false"]
                    if i == 0
                    else [f"--address=127.0.0.1:{port}"]
                )
                names = ("dashboard-agent-listen", "metrics-export", "runtime-env-agent", "dashboard-agent-grpc")
                ports = [f"--{name}-port={agents[4 * i + k]}" for k, name in enumerate(names)]
                # Stopped at the end without draining (what `ray stop` does).
                hosts.start(
                    f"node {i}",
                    ray + node + ports,
                    ready="Ray runtime started",
                    env={"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", **ray_env},
                )
                cleanup.append(node_dir)
                hosts.wait_ready(f"node {i}", timeout=120)
            storage = tempfile.mkdtemp(prefix="multicritic-ray-storage-")
            cleanup.append(storage)
            tags = ["driver"]
            hosts.start(
                "driver",
                [
                    python,
                    os.path.join(HERE, "ray_train.py"),
                    "--address",
                    f"127.0.0.1:{port}",
                    "--workers",
                    str(n),
                    "--storage",
                    storage,
                    *example,
                ],
                env=ray_env,
            )
        hosts.wait(tags)
    finally:
        hosts.stop()
        for folder in cleanup:
            shutil.rmtree(folder, ignore_errors=True)
    failed = False
    for tag in tags:
        code, when = hosts.exits.get(tag, (None, time.time()))
        print(f"local.py: {tag} exited with {code} at {when:.3f}", flush=True)
        failed |= code != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
