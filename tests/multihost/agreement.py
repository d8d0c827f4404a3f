"""Workers of `test_agreement.py`: two torch.distributed (gloo) processes, each a host, running the same cases.

Every case is run by both hosts in the same order (the checks are collectives); each host records what it
saw, and the test compares. No case trains: they stop at the check meant to refuse them.
"""

import datetime
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(rank, world, port, out_dir):
    os.environ["KERAS_BACKEND"] = "torch"
    sys.path.insert(0, ROOT)
    import torch

    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    import keras
    import numpy as np

    from multicritic import CriticNetwork, CriticTrainer
    from multicritic.training import hosts

    seen = {}

    def case(name, fn):
        try:
            seen[name] = {"ok": fn()}
        except (ValueError, RuntimeError) as err:  # (RuntimeError: hosts out of step)
            seen[name] = {"error": str(err), "type": type(err).__name__}

    def trainer(**kwargs):
        keras.utils.set_random_seed(0)
        critic = CriticNetwork(model_size=kwargs.pop("model_size", "nano"), **kwargs.pop("critic", {}))
        return CriticTrainer(critic, seed=0, **kwargs)

    def weights(t):
        return [np.asarray(keras.ops.convert_to_numpy(v.value)).tolist() for v in t.state_variables]

    # Another critic config, other trainer options, another optimizer on host 1: refused by every host while
    # the trainer is built, before DDP (whose construction is the first collective of training).
    case("critic", lambda: bool(trainer(critic={"ensemble_size": 2 if rank else 1})))
    case("options", lambda: bool(trainer(gamma=0.99 if rank else 0.997)))
    case("optimizer", lambda: bool(trainer(learning_rate=1e-4 if rank else 3e-5)))
    case(
        "seed",
        lambda: bool(CriticTrainer(CriticNetwork(model_size="nano", ensemble_size=3, aggregation="min_of_random"))),
    )
    case("agree", lambda: hosts.agree("config", {"size": "nano" if rank == 0 else "mini"}) or True)
    # Finding 8: each option that changes the numbers, named with both hosts' values (whole configs exchanged).
    hl = {"class_name": "hl_gauss", "config": {"sigma": 1.0 if rank else 0.75}}
    for name, critic in {
        "head kind": {"head": "hl_gauss" if rank else "two_hot"},
        "buckets": {"num_buckets": 127 if rank else 255},
        "sigma": {"head": hl},
        "trunk": {"trunk": "residual" if rank else "mlp"},
        "aggregation": {"ensemble_size": 2, "aggregation": "min" if rank else "mean"},
        "ema decay": {"ema_decay": 0.99 if rank else 0.98},
    }.items():
        case(name, lambda critic=critic: bool(trainer(critic=critic)))
    # Finding 6: the dtype policy, the critic's own and the global one.
    case("critic dtype", lambda: bool(trainer(critic={"dtype": "mixed_bfloat16" if rank else "float32"})))
    keras.config.set_dtype_policy("mixed_bfloat16" if rank else "float32")
    case("global dtype", lambda: bool(trainer()))
    keras.config.set_dtype_policy("float32")
    # A value too large for one round of the exchange (a second, of the largest host's size): still compared.
    big = {f"option {i:04d}": i for i in range(400)}
    case("large", lambda: hosts.agree("config", {"big": dict(big, **{"option 0399": rank})}) or True)
    case("large same", lambda: hosts.agree("config", {"big": big}) or True)

    same = trainer()
    # The per-host batch: another horizon on host 1, then a global batch of 15 split 8 / 7. Refused by both
    # before the step's first collective; then the same shapes train.
    rng = np.random.default_rng(rank)

    def dream(length, rows):
        c = same.critic
        return (
            rng.normal(size=(length, rows, c.gru_units)).astype("float32"),
            rng.random((length, rows, c.num_z_categoricals, c.num_z_classes)).astype("float32"),
            rng.normal(size=(length, rows)).astype("float32"),
            np.ones((length, rows), "float32"),
        )

    case("horizon", lambda: bool(same.train_on_dream(*dream(6 if rank else 7, 8))))
    case("uneven", lambda: bool(same.train_on_dream(*dream(7, 7 if rank else 8))))
    seen["steps before"] = int(np.asarray(keras.ops.convert_to_numpy(same.steps.value)))
    case("even", lambda: bool(same.train_on_dream(*dream(7, 8))))
    case("resume", lambda: hosts.same("resume step", [] if rank else [8, 4], "the same checkpoints") or True)
    # Finding 7: host 0 checkpoints where host 1 checks for a preemption (another schedule). Both refuse at that
    # exchange, naming both kinds, with nothing written; then they are in step again.
    early = os.path.join(out_dir, "early.npz")
    case("out of step", lambda: same.save(early) if rank == 0 else hosts.preempted())
    seen["early written"] = os.path.exists(early)
    # A preemption signal on host 1 alone: every host learns it at the same call.
    import signal

    hosts.watch_preemption()
    seen["preempted before"] = hosts.preempted()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    seen["preempted after"] = hosts.preempted()
    # One writer: host 1's path is in a folder that does not exist; only host 0's is written.
    ours = os.path.join(out_dir, "ckpt.npz")
    case("save", lambda: same.save(ours if rank == 0 else os.path.join(out_dir, "missing", "x.npz")))
    before = weights(same)
    # A checkpoint only host 0 can read, then two hosts with different checkpoints: nothing restored anywhere.
    case("unreadable", lambda: bool(same.restore(ours if rank == 0 else os.path.join(out_dir, "none.npz"))))
    other = trainer(learning_rate=3e-5)
    other.critic.set_weights([w + 1.0 for w in other.critic.get_weights()])
    theirs = os.path.join(out_dir, "other.npz")
    if rank == 0:
        from multicritic.training import checkpoint

        checkpoint.save(other, theirs)
    torch.distributed.barrier()
    case("different", lambda: bool(same.restore(ours if rank == 0 else theirs)))
    seen["unchanged"] = weights(same) == before
    case("same", lambda: same.restore(ours))
    with open(os.path.join(out_dir, f"host{rank}.json"), "w") as f:
        json.dump(seen, f)
    torch.distributed.destroy_process_group()


def launch(out_dir):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(2, port, out_dir), nprocs=2, join=True)
