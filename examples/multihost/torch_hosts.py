"""PyTorch on several hosts: `torchrun` on each, a c10d rendezvous, DistributedDataParallel underneath.

Every host runs the same `torchrun` command (`--nnodes=2 --nproc-per-node=1`
here: one process per host), pointed at one rendezvous endpoint that every
host can reach; torchrun gives each process its rank, world size and the
process group's address. `CriticTrainer` then routes the fast critic through
DDP, which broadcasts rank 0's weights (EMA copy included) once and averages
the gradients over the hosts in `backward()`; every host applies the same
clipped update and EMA step. Process group: gloo on CPU, NCCL on GPU (one
GPU per process: `--nproc-per-node` = GPUs per host). Two hosts on one
machine:

    python examples/multihost/local.py torch

On two real hosts (the same command on both; 10.0.0.1 hosts the rendezvous):

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d \\
        --rdzv-endpoint=10.0.0.1:29400 --rdzv-id=critic --max-restarts=1 \\
        examples/multihost/torch_hosts.py --checkpoint-dir /shared/ckpt

With `--max-restarts=1`, a failed process makes torchrun restart the
processes of every host, which resume from the latest checkpoint
(`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`: a fresh store for each restart
round; torch 2.13 otherwise lends the restarted processes the previous
round's, pytorch/pytorch#135712). A host's collective gives up on a lost
peer after `--timeout` seconds at most (gloo reports a closed connection at
once).
"""

from __future__ import annotations

import datetime
import os
import sys

os.environ["KERAS_BACKEND"] = "torch"  # this example runs PyTorch whatever the environment says
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def main():
    args = common.parser(__doc__).parse_args()
    import torch

    torch.set_num_threads(1)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        gpu = torch.cuda.is_available()
        if gpu:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        # The rank, world size and store address come from torchrun's environment (env://).
        torch.distributed.init_process_group(
            "nccl" if gpu else "gloo", timeout=datetime.timedelta(seconds=args.timeout)
        )
    try:
        common.train(args)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
