"""Workers of the PyTorch DistributedDataParallel test: 2 gloo processes vs one process."""

import datetime
import os
import sys
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train(rank, world, port, out_dir, fail_rank=None):
    os.environ["KERAS_BACKEND"] = "torch"
    sys.path.insert(0, ROOT)
    import torch

    torch.set_num_threads(1)
    if world > 1:
        torch.distributed.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=60),
        )
    import keras

    from multicritic import CriticTrainer
    from tests.distributed.common import batches, for_critic, initial_weights, make_critic, split

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        critic_kind = os.environ.get("MULTICRITIC_DP_CRITIC", "single")
        critic = make_critic(critic_kind)
        weights = initial_weights(critic)
        if rank == 1:  # DDP must broadcast rank 0's weights, EMA copy included
            weights = [w + 1.0 for w in weights]
        critic.set_weights(weights)
        trainer = CriticTrainer(critic, learning_rate=1e-3, check_finite=False)
        # As the TensorFlow test: one direct batch with a non-finite target in
        # each rank's half, so the per-rank counts must add up to the global one.
        h, z, targets, loss_weights = batches("direct")[0]
        targets = targets.copy()
        targets[[1, 12]] = np.nan
        steps = [("direct", 0, b) for b in batches("direct") + [(h, z, targets, loss_weights)]]
        steps += [("dream", 1, b) for b in batches("dream")]
        # Every metric of every step as this rank saw it (the test combines the
        # ranks' per-slice values), and the weights, fast and EMA, at the end.
        out = {}
        for step, (kind, axis, batch) in enumerate(steps):
            if rank == fail_rank and kind == "dream":
                # The other rank is now waiting in DDP's gradient all-reduce; the
                # test times how long the launcher takes to raise from here.
                with open(os.path.join(out_dir, f"failed_rank{rank}.time"), "w") as f:
                    f.write(repr(time.time()))
                raise RuntimeError(f"injected failure on rank {rank}")
            part = for_critic(critic_kind, split(batch, world, rank, axis), kind)
            metrics = trainer.train_step(*part) if kind == "direct" else trainer.train_on_dream(*part)
            out.update(
                {
                    f"m{step}_{k.replace('/', '.')}": np.asarray(keras.ops.convert_to_numpy(v))
                    for k, v in metrics.items()
                }
            )
    # What DDP said of its options (PyTorch 2.13 warns where a deprecated one is passed).
    out["ddp_warnings"] = np.array([str(w.message) for w in seen if "buffers" in str(w.message)], dtype=str)
    out.update({f"w{i}": keras.ops.convert_to_numpy(v.value) for i, v in enumerate(critic.weights)})
    np.savez(os.path.join(out_dir, f"rank{rank}_of{world}.npz"), steps=len(steps), **out)
    if world > 1:
        torch.distributed.destroy_process_group()


def launch(world, out_dir, fail_rank=None):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(world, port, out_dir, fail_rank), nprocs=world, join=True)
