"""What the four multi-host examples share: the critics, the data, and the training loop with checkpoints.

Each example (`jax_hosts.py`, `torch_hosts.py`, `tensorflow_hosts.py`,
`ray_train.py`) starts its engine's multi-host runtime its own way, then
calls `train` here. The loop is the same on every engine and any number of
hosts:

- every host builds the same critic (`--critic single`, `ensemble` or
  `multi`, nano sizes; a comma-separated list trains each in turn) from the
  same seed, after `hosts.agree` has checked that every host asks for the
  same one;
- step `k` trains on the global dream batch `global_batch(k)` (a function of
  the seed and the step only), of which host `i` of `n` takes rows
  `i * B/n ... (i+1) * B/n - 1` (axis 1); a real run would read each host's
  own data instead;
- every `--checkpoint-every` steps the chief writes `<critic>/step-NNNNNN.npz`
  (`CriticTrainer.save`: one writer, sealed, atomic), and a run that finds
  checkpoints resumes from the latest (`CriticTrainer.restore`: every host
  the same file, or none), so stopping after N steps and starting again gives
  the uninterrupted run's result;
- `--out DIR` writes each host's final state (weights, EMA weights, return
  normaliser, optimizer slots, step counters) and the metrics of every step,
  as that host saw them, to `DIR/<critic>/host<i>.npz`.

`--kill-host I --kill-at-step K [--kill-critic NAME]` makes host I kill
itself (SIGKILL, no clean-up) before step K of that critic (default: the
first), unless that critic resumed from a checkpoint: a host lost mid-run, to
see how the other hosts and the launchers react (a restarted run resumes, so
it is not killed again).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import os
import re
import signal
import sys
import time

import numpy as np

# The critics of the examples (nano sizes): one critic; an ensemble whose targets take the minimum over 2 of
# its 3 members, drawn from (seed, step); and a MultiCritic whose task stream has the official percentile
# return normaliser (its statistics from the global batch) and whose second stream is an HL-Gauss ensemble.
CRITICS = {
    "single": {"model_size": "nano"},
    "ensemble": {"model_size": "nano", "ensemble_size": 3, "aggregation": "min_of_random"},
    "multi": {
        "critics": {
            "task": {"model_size": "nano"},
            "explore": {"model_size": "nano", "head": "hl_gauss", "ensemble_size": 3},
        },
        "stream_weights": {"explore": 0.5},
        "normalizers": {"task": {"impl": "perc", "rate": 0.01, "debias": True}, "explore": {"impl": "meanstd"}},
    },
}


def parser(description: str) -> argparse.ArgumentParser:
    """The arguments every example takes (an engine adds its own)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--critic", default="multi",
                   help=f"the critic(s) to train, one after the other: any of {sorted(CRITICS)}, comma-separated")
    p.add_argument("--steps", type=int, default=8, help="train until this many steps are done")
    p.add_argument("--batch", type=int, default=16, help="global batch: dreams per step, split over the hosts")
    p.add_argument("--horizon", type=int, default=6, help="dream horizon H (batches are [H+1, B, ...])")
    p.add_argument("--seed", type=int, default=0, help="weights, data and member draws (the same on every host)")
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--checkpoint-dir", help="write DIR/<critic>/step-NNNNNN.npz; resume from the latest found")
    p.add_argument("--checkpoint-every", type=int, default=4)
    p.add_argument("--out", help="write each host's final state and per-step metrics to OUT/<critic>/host<i>.npz")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds before a collective (or the JAX heartbeat) gives up on a lost host")
    p.add_argument("--kill-host", type=int, help="this host kills itself (SIGKILL) ...")
    p.add_argument("--kill-at-step", type=int, help="... before this step ...")
    p.add_argument("--kill-critic", help="... of this critic (default: the first), unless it resumed")
    return p


def kinds(args):
    names = [k.strip() for k in args.critic.split(",") if k.strip()]
    unknown = sorted(set(names) - set(CRITICS))
    if unknown or not names:
        raise SystemExit(f"--critic: got {args.critic!r}, expected a comma-separated list of {sorted(CRITICS)}")
    if getattr(args, "kill_critic", None) not in (None, *names):
        raise SystemExit(f"--kill-critic: got {args.kill_critic!r}, expected one of --critic {names}")
    return names


def build(args, kind):
    """The critic and trainer of `kind`, with weights drawn from `args.seed`."""
    import keras

    from multicritic import CriticNetwork, CriticTrainer, MultiCritic
    from multicritic.training import hosts

    spec = CRITICS[kind]
    # Before the critic exists: building it under a JAX or TensorFlow distribution is itself collective.
    hosts.agree("critic", {"critic": kind, "config": spec, "seed": args.seed, "batch": args.batch})
    keras.utils.set_random_seed(args.seed)
    critic = MultiCritic(**spec) if "critics" in spec else CriticNetwork(**spec)
    rng = np.random.default_rng(args.seed)
    critic.set_weights([rng.normal(scale=0.2, size=tuple(v.shape)).astype(np.float32) for v in critic.weights])
    trainer = CriticTrainer(critic, learning_rate=args.learning_rate, seed=args.seed)
    return critic, trainer


def global_batch(args, critic, step: int):
    """The global dream batch of `step`: `(h, z, rewards, continues)`, `[H+1, B, ...]`."""
    from multicritic import MultiCritic

    first = critic.streams[critic.stream_names[0]] if isinstance(critic, MultiCritic) else critic
    rng = np.random.default_rng([args.seed, step])
    n, b = args.horizon + 1, args.batch
    h = rng.normal(size=(n, b, first.gru_units)).astype(np.float32)
    z = rng.random((n, b, first.num_z_categoricals, first.num_z_classes)).astype(np.float32)
    rewards = (3 * rng.normal(size=(n, b))).astype(np.float32)
    continues = (rng.random((n, b)) > 0.1).astype(np.float32)
    if isinstance(critic, MultiCritic):
        rewards = {"task": rewards, "explore": 0.1 * rewards + 1.0}
    return h, z, rewards, continues


def host_rows(batch, index: int, count: int):
    """Host `index`'s rows (axis 1) of a dream batch."""
    def take(x):
        if isinstance(x, dict):
            return {k: take(v) for k, v in x.items()}
        return np.array_split(x, count, axis=1)[index]

    return tuple(take(x) for x in batch)


class FileCheckpoints:
    """Checkpoints as `step-NNNNNN.npz` files in a folder every host reads (a shared file system)."""

    def __init__(self, folder):
        self.folder = folder
        if folder:
            os.makedirs(folder, exist_ok=True)

    def latest(self):
        """`(path, step)` of the newest checkpoint, or None."""
        if not self.folder:
            return None
        found = sorted(glob.glob(os.path.join(self.folder, "step-*.npz")))
        if not found:
            return None
        return found[-1], int(re.search(r"step-(\d+)\.npz$", found[-1]).group(1))

    def save(self, trainer, step: int, metrics) -> None:
        if self.folder:
            trainer.save(os.path.join(self.folder, f"step-{step:06d}.npz"))


def state_digest(trainer) -> str:
    """SHA-256 of the trainer's whole state (what `save` writes), to compare runs at a glance."""
    import keras

    from multicritic.training.checkpoint import keyed_variables

    digest = hashlib.sha256()
    for key, var in sorted(keyed_variables(trainer).items()):
        digest.update(key.encode())
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(var.value)).tobytes())
    return digest.hexdigest()


def train(args, checkpoints=None, log=print, extra=None, scope=contextlib.nullcontext):
    """Trains each critic of `args.critic` in turn (see the module docstring).

    Args:
        args: the parsed `parser()` arguments.
        checkpoints: `checkpoints(kind)` -> where that critic's checkpoints
            are (default: `FileCheckpoints` in `--checkpoint-dir/<kind>`).
        log: prints a line.
        extra: more arrays for the `--out` files.
        scope: a context in which to build the critics and trainers
            (TensorFlow: the strategy's scope; the steps run outside it).
    """
    names = kinds(args)
    for kind in names:
        folder = os.path.join(args.checkpoint_dir, kind) if args.checkpoint_dir else None
        store = checkpoints(kind) if checkpoints else FileCheckpoints(folder)
        train_one(args, kind, store, log, extra, scope, may_kill=kind == (args.kill_critic or names[0]))


def train_one(args, kind, checkpoints, log, extra, scope, may_kill):
    import keras

    from multicritic.training import hosts
    from multicritic.training.checkpoint import keyed_variables

    with scope():
        critic, trainer = build(args, kind)
    index, count = hosts.topology(trainer.state_variables)
    tag = f"[host {index}/{count}] {kind}:"
    start = 0
    latest = checkpoints.latest()
    if latest is not None:
        path, start = latest
        info = trainer.restore(path)
        log(f"{tag} restored step {start} from {path} (saved on {info['saved_on_hosts']} host(s), "
            f"restored on {info['hosts']}) at time {time.time():.3f}")
    metrics, times = {}, []
    for step in range(start, args.steps):
        if may_kill and start == 0 and step == args.kill_at_step and index == args.kill_host:
            log(f"{tag} killing itself before step {step} at time {time.time():.3f} (--kill-host, --kill-at-step)")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        began = time.perf_counter()
        out = trainer.train_on_dream(*host_rows(global_batch(args, critic, step), index, count))
        metrics[step] = {k: float(np.asarray(keras.ops.convert_to_numpy(v))) for k, v in out.items()}
        times.append(time.perf_counter() - began)
        done = step + 1
        if done % args.checkpoint_every == 0 or done == args.steps:
            checkpoints.save(trainer, done, metrics[step])
    rate = f"{1e3 * np.median(times[1:]):.1f} ms/step after the first" if len(times) > 1 else "-"
    log(f"{tag} trained steps {start}..{args.steps - 1} ({rate}); state sha256 {state_digest(trainer)[:16]}")
    sys.stdout.flush()
    if args.out:
        folder = os.path.join(args.out, kind)
        os.makedirs(folder, exist_ok=True)
        arrays = {"state/" + key: np.asarray(keras.ops.convert_to_numpy(var.value))
                  for key, var in keyed_variables(trainer).items()}
        arrays.update({f"metrics/{step}/{name}": np.float64(value)
                       for step, values in metrics.items() for name, value in values.items()})
        arrays.update({"hosts": np.int64(count), "start": np.int64(start), "step_seconds": np.asarray(times)})
        arrays.update({k: np.asarray(v) for k, v in (extra or {}).items()})
        np.savez(os.path.join(folder, f"host{index}.npz"), **arrays)
