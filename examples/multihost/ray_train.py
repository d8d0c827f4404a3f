"""Ray Train on several hosts: a `TorchTrainer` over a Ray cluster, DistributedDataParallel underneath.

The driver (this script) connects to a running Ray cluster and asks Ray
Train for `--workers` training workers of `--cpus-per-worker` CPUs each; Ray
places them on the cluster's nodes, starts a torch.distributed process group
among them (gloo on CPU, NCCL with `--gpu`) and runs the same training loop as
`torch_hosts.py` in each: `CriticTrainer` routes the critic through DDP.
Checkpoints go through Ray: rank 0 reports each sealed checkpoint
(`ray.train.report`), Ray keeps it under `--storage` (a path every node can
reach: a shared file system or cloud storage), and after a failure Ray Train
restarts every worker (`FailureConfig(max_failures=...)`), which resume from
the latest one (`ray.train.get_checkpoint`). Two nodes on one machine (each
with one CPU, so that the two workers land on different nodes):

    python examples/multihost/local.py ray

On real hosts:

    host 0: ray start --head --port=6379
    host 1: ray start --address=10.0.0.1:6379
    host 0: python examples/multihost/ray_train.py --address 10.0.0.1:6379 --workers 2 --storage /shared/ray

A lost worker makes Ray Train stop the others (it watches its workers'
actors) and restart them all, up to `--max-failures` times, or fail the run.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

os.environ["KERAS_BACKEND"] = "torch"  # this example runs PyTorch whatever the environment says
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402


class RayCheckpoints:
    """The critics' checkpoints kept by Ray Train, one folder per report holding each critic's latest file.

    `latest()` reads what `ray.train.get_checkpoint()` gives a restarted
    worker; `save` writes the critic's sealed file (rank 0 writes, the others
    wait: `CriticTrainer.save`) into this worker's folder, and every worker
    calls `ray.train.report` (a barrier), rank 0 with the folder, which Ray
    copies to the run's storage, then waits until Ray has committed it.
    """

    def __init__(self):
        import ray.train

        self.folder = tempfile.mkdtemp(prefix="multicritic-ray-")
        self.steps = {}
        found = ray.train.get_checkpoint()
        if found is not None:
            found.to_directory(self.folder)
            with open(os.path.join(self.folder, "steps.json")) as f:
                self.steps = json.load(f)

    def __call__(self, kind):
        store = self

        class Critic:
            def latest(self):
                step = store.steps.get(kind)
                return None if step is None else (os.path.join(store.folder, f"{kind}.npz"), step)

            def save(self, trainer, step, metrics):
                store.save(kind, trainer, step, metrics)

        return Critic()

    def save(self, kind, trainer, step, metrics):
        import ray.train

        trainer.save(os.path.join(self.folder, f"{kind}.npz"))
        self.steps[kind] = step
        checkpoint = None
        if ray.train.get_context().get_world_rank() == 0:
            with open(os.path.join(self.folder, "steps.json"), "w") as f:
                json.dump(self.steps, f)
            checkpoint = ray.train.Checkpoint.from_directory(self.folder)
        ray.train.report({"critic": kind, "step": step, "total": metrics["total"]}, checkpoint=checkpoint)
        # Ray Train registers a checkpoint once its controller has collected every worker's report (it polls
        # them every few seconds): a worker lost before that would lose the checkpoint with it. Training goes
        # on once it is committed, as `CriticTrainer.save` returns once the file is written.
        ray.train.get_all_reported_checkpoints(consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED)


def train_loop(config):
    """Each Ray Train worker: the process group is up (Ray's `TorchConfig`); train as the other examples."""
    import argparse

    import ray
    import torch

    sys.path.insert(0, config["here"])
    import common as shared  # this worker's import of the example's module

    torch.set_num_threads(1)
    args = argparse.Namespace(**config["args"])
    node = ray.get_runtime_context().get_node_id()
    checkpoints = RayCheckpoints()
    try:
        # Ray stops and restarts its workers itself (SIGTERM, then SIGKILL): no preemption handler here.
        shared.train(
            args,
            checkpoints=checkpoints,
            extra={"node": node},
            preemption=False,
            log=lambda line: print(f"{line} [node {node[:8]}]", flush=True),
        )
    finally:
        shutil.rmtree(checkpoints.folder, ignore_errors=True)  # Ray keeps what was reported


def main():
    p = common.parser(__doc__)
    p.add_argument("--address", default="auto", help="the Ray cluster's head, HOST:PORT")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cpus-per-worker", type=float, default=1.0)
    p.add_argument("--gpu", action="store_true", help="one GPU per worker, NCCL")
    p.add_argument(
        "--storage",
        default=os.path.join(tempfile.gettempdir(), "multicritic-ray"),
        help="where Ray keeps the run's checkpoints (every node must reach it)",
    )
    p.add_argument("--name", default="multicritic-critic", help="the run's name under --storage")
    p.add_argument("--max-failures", type=int, default=1, help="worker-group restarts before the run fails")
    args = p.parse_args()
    common.kinds(args)
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    # The workers' environment: Keras on PyTorch (they do not inherit the driver's).
    ray.init(address=args.address, runtime_env={"env_vars": {"KERAS_BACKEND": "torch"}})
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"args": vars(args), "here": HERE},
        scaling_config=ScalingConfig(
            num_workers=args.workers, use_gpu=args.gpu, resources_per_worker={"CPU": args.cpus_per_worker}
        ),
        run_config=RunConfig(
            storage_path=os.path.abspath(args.storage),
            name=args.name,
            failure_config=FailureConfig(max_failures=args.max_failures),
        ),
        torch_config=TorchConfig(backend="nccl" if args.gpu else "gloo", timeout_s=int(args.timeout)),
    )
    result = trainer.fit()
    print(f"ray_train: finished, last report {result.metrics}, checkpoint {result.checkpoint}", flush=True)


if __name__ == "__main__":
    main()
