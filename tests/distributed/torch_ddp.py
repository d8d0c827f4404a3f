"""Workers of the PyTorch DistributedDataParallel test: 2 gloo processes vs one process."""

import datetime
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train(rank, world, port, out_dir, fail_rank=None):
    os.environ["KERAS_BACKEND"] = "torch"
    sys.path.insert(0, ROOT)
    import torch

    torch.set_num_threads(1)
    if world > 1:
        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
            timeout=datetime.timedelta(seconds=60),
        )
    import keras

    from multicritic import CriticNetwork, CriticTrainer
    from tests.distributed.common import batches, initial_weights, split

    critic = CriticNetwork(model_size="nano")
    weights = initial_weights(critic)
    if rank == 1:  # DDP must broadcast rank 0's weights, EMA copy included
        weights = [w + 1.0 for w in weights]
    critic.set_weights(weights)
    trainer = CriticTrainer(critic, learning_rate=1e-3)
    losses = []
    for kind, axis in (("direct", 0), ("dream", 1)):
        for step, batch in enumerate(batches(kind)):
            if rank == fail_rank and kind == "dream":
                raise RuntimeError(f"injected failure on rank {rank}")
            metrics = trainer.train_step(*split(batch, world, rank, axis)) if kind == "direct" else trainer.train_on_dream(
                *split(batch, world, rank, axis)
            )
            total = metrics["total"].detach().clone()
            if world > 1:
                torch.distributed.all_reduce(total)
                total /= world
            losses.append(float(total))
    np.savez(
        os.path.join(out_dir, f"rank{rank}_of{world}.npz"),
        losses=np.array(losses),
        **{f"w{i}": keras.ops.convert_to_numpy(v.value) for i, v in enumerate(critic.weights)},
    )
    if world > 1:
        torch.distributed.destroy_process_group()


def launch(world, out_dir, fail_rank=None):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(world, port, out_dir, fail_rank), nprocs=world, join=True)
