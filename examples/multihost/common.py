"""What the four multi-host examples share: the critics, the data, and the training loop with checkpoints.

Each example (`jax_hosts.py`, `torch_hosts.py`, `tensorflow_hosts.py`,
`ray_train.py`) starts its engine's multi-host runtime its own way, then
calls `train` here. The loop is the same on every engine and any number of
hosts:

- every host builds the same critic (`--critic single`, `ensemble` or
  `multi`, nano sizes, with `--critic-options`; a comma-separated list
  trains each in turn) from the same seed, after `hosts.agree_critic` has
  checked that every host asks for the same one (the configs the specs
  resolve to, defaults filled in), under the same dtype policies, with the
  same batch, steps and checkpoint schedule (`run_options`): a host that
  differs is refused on every host, the error naming the option and each
  host's value;
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

`--late-host I --late-by S` makes host I wait S seconds after the engine
started, before its first exchange: a host slow to arrive (a long import,
a busy file system), to see how long the others wait for it (`--timeout`).

`--kill-host I --kill-at-step K [--kill-critic NAME]` makes host I kill
itself (SIGKILL, no clean-up) before step K of that critic (default: the
first), unless that critic resumed from a checkpoint: a host lost mid-run, to
see how the other hosts and the launchers react (a restarted run resumes, so
it is not killed again).

Preemption: a host that receives SIGTERM (a scheduler's notice) does not
die; every host learns it at the same step (`hosts.preempted`, a few bytes
exchanged per step), writes a checkpoint of that step and exits with 0, and
a restart resumes from it. `--preempt-host I --preempt-at-step K` makes host
I send itself SIGTERM before step K, to see it. At start the chief removes
what killed writes left (temporary files; never a partial checkpoint), every
host must find the same checkpoints (else a `ValueError` on every host naming
what each found), and a damaged newest checkpoint is passed over, with a
warning, for the newest intact one.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
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
    p.add_argument(
        "--critic",
        default="multi",
        help=f"the critic(s) to train, one after the other: any of {sorted(CRITICS)}, comma-separated",
    )
    p.add_argument("--steps", type=int, default=8, help="train until this many steps are done")
    p.add_argument("--batch", type=int, default=16, help="global batch: dreams per step, split over the hosts")
    p.add_argument("--horizon", type=int, default=6, help="dream horizon H (batches are [H+1, B, ...])")
    p.add_argument("--seed", type=int, default=0, help="weights, data and member draws (the same on every host)")
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--checkpoint-dir", help="write DIR/<critic>/step-NNNNNN.npz; resume from the latest found")
    p.add_argument("--checkpoint-every", type=int, default=4)
    p.add_argument(
        "--critic-options",
        type=json.loads,
        default={},
        help='JSON options for every critic (a MultiCritic: every stream), e.g. \'{"head": "hl_gauss"}\'',
    )
    p.add_argument("--dtype-policy", help="keras.config.set_dtype_policy(NAME) before the critics are built")
    p.add_argument("--out", help="write each host's final state and per-step metrics to OUT/<critic>/host<i>.npz")
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds before a collective (or the JAX heartbeat, or JAX's shutdown) gives up on a lost host",
    )
    p.add_argument("--kill-host", type=int, help="this host kills itself (SIGKILL) ...")
    p.add_argument("--kill-at-step", type=int, help="... before this step ...")
    p.add_argument("--kill-critic", help="... of this critic (default: the first), unless it resumed")
    p.add_argument("--preempt-host", type=int, help="this host sends itself SIGTERM (a scheduler's preemption) ...")
    p.add_argument("--preempt-at-step", type=int, help="... before this step of the first critic")
    p.add_argument("--late-host", type=int, help="this host waits, once the engine has started, ...")
    p.add_argument("--late-by", type=float, default=0.0, help="... this many seconds before its first exchange")
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

    spec = spec_of(args, kind)
    # Before the critic exists: building it under a JAX or TensorFlow distribution is itself collective. What
    # changes the numbers, and the checkpoint schedule (the hosts' exchanges must line up step by step); the
    # critics compared as the configs the specs resolve to, defaults filled in.
    hosts.agree_critic(f"critic {kind!r}", spec, {"run option": run_options(args, kind)})
    keras.utils.set_random_seed(args.seed)
    critic = MultiCritic(**spec) if "critics" in spec else CriticNetwork(**spec)
    rng = np.random.default_rng(args.seed)
    critic.set_weights([rng.normal(scale=0.2, size=tuple(v.shape)).astype(np.float32) for v in critic.weights])
    trainer = CriticTrainer(critic, learning_rate=args.learning_rate, seed=args.seed)
    return critic, trainer


def run_options(args, kind):
    """The arguments every host must share: what changes the numbers, and when checkpoints are written (the
    folder itself may differ: each host its own copy of a shared one). The learning rate is `CriticTrainer`'s
    to check, before its optimizer exists."""
    names = ("steps", "batch", "horizon", "seed", "checkpoint_every")
    return dict({n: getattr(args, n) for n in names}, critic=kind, checkpoints=bool(args.checkpoint_dir))


def spec_of(args, kind):
    """`CRITICS[kind]` with `--critic-options` (a MultiCritic's: in every stream's)."""
    spec, more = CRITICS[kind], dict(args.critic_options or {})
    if "critics" in spec:
        return dict(spec, critics={name: dict(stream, **more) for name, stream in spec["critics"].items()})
    return dict(spec, **more)


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

    def candidates(self):
        """`[(path, step)]` of the checkpoints found, newest first."""
        if not self.folder:
            return []
        found = sorted(glob.glob(os.path.join(self.folder, "step-*.npz")), reverse=True)
        return [(path, int(re.search(r"step-(\d+)\.npz$", path).group(1))) for path in found]

    def latest(self):
        """`(path, step)` of the newest checkpoint, or None."""
        found = self.candidates()
        return found[0] if found else None

    def clean(self, log):
        """Removes what killed writes left behind (`multicritic.files.integrity` writes a temporary file, then renames
        it: a write killed before the rename leaves the temporary file, never a partial checkpoint)."""
        for path in glob.glob(os.path.join(self.folder or "", ".multicritic-*")):
            os.remove(path)
            log(f"removed {path}, left by a write that was killed")

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


def train(args, checkpoints=None, log=print, extra=None, scope=contextlib.nullcontext, preemption=True):
    """Trains each critic of `args.critic` in turn (see the module docstring).

    Args:
        args: the parsed `parser()` arguments.
        checkpoints: `checkpoints(kind)` -> where that critic's checkpoints
            are (default: `FileCheckpoints` in `--checkpoint-dir/<kind>`).
        log: prints a line.
        extra: more arrays for the `--out` files.
        scope: a context in which to build the critics and trainers
            (TensorFlow: the strategy's scope; the steps run outside it).
        preemption: take SIGTERM as a preemption request (every host
            checkpoints one step and exits 0); off where the launcher
            stops its workers with SIGTERM itself (Ray).
    """
    names = kinds(args)
    from multicritic.training import hosts

    log(f"started at time {time.time():.3f}")  # (the engine's hosts are connected: how long the checks take)
    if args.late_host is not None and args.late_by > 0:
        with scope():  # (TensorFlow: the strategy's hosts)
            index = hosts.topology()[0]
        if index == args.late_host:
            log(f"late by {args.late_by:g} s (--late-host, --late-by)")
            sys.stdout.flush()
            time.sleep(args.late_by)
    if args.dtype_policy:
        import keras

        keras.config.set_dtype_policy(args.dtype_policy)
    if preemption:
        hosts.watch_preemption()  # a scheduler's SIGTERM: every host checkpoints at one step and exits cleanly
    for kind in names:
        folder = os.path.join(args.checkpoint_dir, kind) if args.checkpoint_dir else None
        store = checkpoints(kind) if checkpoints else FileCheckpoints(folder)
        if train_one(args, kind, store, log, extra, scope, may_kill=kind == (args.kill_critic or names[0])) is False:
            return


def resume(trainer, checkpoints, variables, log) -> int:
    """The step to start from: 0, or that of the newest intact checkpoint, restored. Every host must find the
    same checkpoints (a `ValueError` on every host naming what each found, before anything is restored). A
    damaged newest checkpoint is passed over for the one before it, with a warning: the state it holds is a
    state the run went through, and the run is deterministic from it (stopping would wait for a person to
    delete the file)."""
    from multicritic.training import hosts

    found = (
        checkpoints.candidates()
        if hasattr(checkpoints, "candidates")
        else [c for c in [checkpoints.latest()] if c is not None]
    )
    hosts.same(
        "resume step",
        [step for _, step in found],
        "the same checkpoints on every host: a shared folder, or a copy of it that has fully arrived",
        variables,
    )
    for path, step in found:
        try:
            info = trainer.restore(path)
        except hosts.DifferentCheckpoints:
            raise  # intact files that differ between hosts: a setup to fix, not damage to pass over
        except (ValueError, OSError) as err:  # raised on every host alike (`restore` compares them first)
            log(f"WARNING: skipping checkpoint {path}: {err}")
            continue
        log(
            f"restored step {step} from {path} (saved on {info['saved_on_hosts']} host(s), "
            f"restored on {info['hosts']}) at time {time.time():.3f}"
        )
        return step
    if found:
        raise ValueError(
            f"checkpoint-dir: got {len(found)} checkpoint(s), none intact; expected at least one "
            "that restores (or none, to start from scratch)."
        )
    return 0


def train_one(args, kind, checkpoints, log, extra, scope, may_kill):
    import keras

    from multicritic.training import hosts
    from multicritic.training.checkpoint import keyed_variables

    with scope():
        critic, trainer = build(args, kind)
    variables = trainer.state_variables
    index, count = hosts.topology(variables)
    tag = f"[host {index}/{count}] {kind}:"
    if index == 0 and hasattr(checkpoints, "clean"):
        checkpoints.clean(lambda line: log(f"{tag} {line}"))
    start = resume(trainer, checkpoints, variables, lambda line: log(f"{tag} {line}"))
    metrics, times = {}, []
    for step in range(start, args.steps):
        if may_kill and step == args.preempt_at_step and index == args.preempt_host:
            os.kill(os.getpid(), signal.SIGTERM)
        if hosts.preempted(variables):  # every host stops here at the same step, with a checkpoint of it
            if step > start and step % args.checkpoint_every:  # (else just written)
                checkpoints.save(trainer, step, metrics[step - 1])
            log(
                f"{tag} preempted ({hosts.preemption_signal() or 'another host'}) before step {step}: "
                f"checkpoint of step {step} written, exiting at time {time.time():.3f}"
            )
            sys.stdout.flush()
            return False
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
        arrays = {
            "state/" + key: np.asarray(keras.ops.convert_to_numpy(var.value))
            for key, var in keyed_variables(trainer).items()
        }
        arrays.update(
            {
                f"metrics/{step}/{name}": np.float64(value)
                for step, values in metrics.items()
                for name, value in values.items()
            }
        )
        arrays.update({"hosts": np.int64(count), "start": np.int64(start), "step_seconds": np.asarray(times)})
        arrays.update({k: np.asarray(v) for k, v in (extra or {}).items()})
        np.savez(os.path.join(folder, f"host{index}.npz"), **arrays)
