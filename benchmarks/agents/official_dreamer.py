"""Learning curves of the official DreamerV3 (danijar/dreamerv3, JAX) with its own critic and with multicritic's.

The official `dreamerv3/main.py` at commit `COMMIT`, run as it is from a
checkout of that commit, one process per half of a run, on CartPole-v1
through its own `from_gym` wrapper (`--task gym_CartPole-v1`), at `size1m`
on the CPU in float32 (`FLAGS`). Each run has two halves on one logdir: the
second half's `cp.load_or_save()` restores the official checkpoint (agent
parameters with the optimizer state, counters, replay buffer, step), so
every curve crosses a resume. Variants, same flags and seeds:

- `stock`: the official value head and slow value head;
- `swap`: `multicritic.interop.dreamerv3_ninjax.swap_value_heads` with
  `official_critic` (`CRITIC_OPTIONS`): the initial parameters drawn by the
  official initialisers (`initializer="host"`, the stock agent's bit for
  bit), the official two-hot distribution (`distribution="host"`); the
  official loss, optimizer, slow critic and checkpoints act on the critic's
  ninjax entries;
- `swap-2024`: the swap with the `"dreamerv3-2024"` preset's critic
  options at the host's sizes, its own initial weights (Keras's draw,
  seeded by `--seed`) and its own two-hot head and support
  (`initializer="critic"`, `distribution="critic"`).

What the driver adds, for every variant alike: `jax.profiler`'s
`start_trace` / `stop_trace` are no-ops (the official `Agent.train`
profiles updates 100 to 120, and a resume from a checkpoint taken in
between fails in `stop_trace`); gym's first `reset()` of each half gets a
seed (`1000 * seed + half`; `FromGym` seeds nothing); and the first half
ends with one more `cp.save()` of the loop's own checkpoint, so that the
second half resumes where the first ended (the official loop saves every
`run.save_every` seconds only, so its last save falls at a step that
depends on the machine's speed; `--clock-saves-only` keeps that, and the
joined curve then keeps the first half's episodes up to `restored_step`).
The official loop is still not reproducible run to run: its replay batches
are sampled by a prefetch thread while the environment keeps adding steps.

Writes the episodes' returns against environment steps (the official
`scores.jsonl`), the restored step and the wall and CPU time of each half
to `--json` after every finished half (a rerun skips the halves already
there, so a long comparison can be split over sessions).

`OFFICIAL` is a folder of your choice outside this checkout (e.g. `OFFICIAL="$PWD/../dreamerv3-official"`).

Setup, once (the source from GitHub at `COMMIT`, the official environment
from PyPI: jax <= 0.6.2, numpy < 2, gym 0.25.2, as `PACKAGES` pins):

    python benchmarks/agents/official_dreamer.py --setup "$OFFICIAL"   # src/ and venv/ under it

Run, in the official environment (multicritic from this checkout):

    export MULTICRITIC_OFFICIAL_SRC="$OFFICIAL"/src
    "$OFFICIAL"/venv/bin/python benchmarks/agents/official_dreamer.py --calibrate 8
    "$OFFICIAL"/venv/bin/python benchmarks/agents/official_dreamer.py --variants stock swap swap-2024 \\
        --seeds 0 1 2 --steps 20000 --cpus 0 1 --work "$OFFICIAL"/logs \\
        --json benchmarks/results/results_official_dreamer.json

Render, in the project's environment: `python benchmarks/agents/plot_curves.py official
benchmarks/results/results_official_dreamer.json docs/images/agents_official_dreamer.png`, then
`python benchmarks/render_tables.py` for the `official_dreamer` table of docs/real-agents.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from benchmarks.agents import halves  # noqa: E402

COMMIT = "e3f02248693a79dc8b0ebd62c93683888ddaccfe"
REPOSITORY = "https://github.com/danijar/dreamerv3"
SOURCE_ENV = "MULTICRITIC_OFFICIAL_SRC"  # a git checkout of REPOSITORY at COMMIT
# The official code's environment: its requirements.txt at COMMIT with CPU jax (its 0.4.33; JAX 0.7 made jit's
# arguments keyword-only, which embodied/jax/transform.py does not pass), numpy < 2 (gym 0.25.2, which from_gym's
# old reset / step API needs), ml_dtypes for numpy 1, and Keras for multicritic.
PACKAGES = (
    "jax==0.4.33", "jaxlib==0.4.33", "numpy==1.26.4", "ml_dtypes==0.5.1", "chex==0.1.90", "optax==0.2.5",
    "ninjax==3.6.3", "elements==3.22.4", "portal==3.8.3", "granular==0.24.2", "scope==0.8.1", "jaxtyping==0.3.11",
    "einops==0.8.2", "tqdm==4.70.1", "ruamel.yaml==0.19.1", "colored_traceback==0.4.2", "av==18.1.0",
    "gym==0.25.2", "keras==3.15.1",
)  # fmt: skip
VARIANTS = ("stock", "swap", "swap-2024")
TASK = "gym_CartPole-v1"
# size1m on one CPU thread in float32 (the dtype in which the swap is exact, and 2.5x faster than bfloat16's
# emulation on the CPU): one environment, train ratio 512 (0.5 updates per step at B 16 x T 64, as the sheeprl
# runs), imagination from the last 8 steps of each replayed sequence (the official `imag_last`, about 5x cheaper
# than from every step), saves every 30 s (the official loop saves on a clock only).
FLAGS = (
    "--configs", "size1m", "--jax.platform", "cpu", "--jax.prealloc", "False", "--jax.compute_dtype", "float32",
    "--run.envs", "1", "--run.train_ratio", "512", "--agent.imag_last", "8", "--replay.size", "1e5",
    "--run.save_every", "30", "--run.log_every", "60", "--run.report_every", "600", "--logger.outputs", "jsonl",
)  # fmt: skip
_SWAPPED, _CPU, _LOADED, _SAVED = "multicritic swap: ", "cpu seconds: ", "Loaded checkpoint.", "final save at step "


def source_problem(path):
    """Why `path` is not the official source at `COMMIT` (a git checkout with `dreamerv3/` and `embodied/` as the
    commit has them), or None."""
    if not path:
        return f"{SOURCE_ENV} is not set (a git checkout of {REPOSITORY} at {COMMIT})"
    if not os.path.isfile(os.path.join(path, "dreamerv3", "main.py")):
        return f"{SOURCE_ENV}={path} holds no dreamerv3/main.py"
    try:
        head = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        changed = subprocess.run(
            ["git", "-C", path, "status", "--porcelain", "--", "dreamerv3", "embodied"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as err:
        return f"git cannot read {path} ({err})"
    if head.returncode or head.stdout.strip() != COMMIT:
        return f"{SOURCE_ENV}={path} is at {head.stdout.strip() or head.stderr.strip()!r}, not {COMMIT}"
    if changed.returncode or changed.stdout.strip():
        return f"{SOURCE_ENV}={path} has changes in dreamerv3/ or embodied/: {changed.stdout.strip()[:200]!r}"
    return None


def official_source() -> str:
    """The checked official source (`$MULTICRITIC_OFFICIAL_SRC`), put on `sys.path`; a `RuntimeError` says why not."""
    path = os.environ.get(SOURCE_ENV)
    problem = source_problem(path)
    if problem:
        raise RuntimeError(f"{problem}. Run `python benchmarks/agents/official_dreamer.py --setup DIR` once.")
    if path not in sys.path:
        sys.path.insert(0, path)
    return path


def official_config(src: str, argv):
    """The config `dreamerv3/main.py` parses from `argv` (its `configs.yaml`, `--configs`, then the flags)."""
    import elements
    import ruamel.yaml as yaml

    with open(os.path.join(src, "dreamerv3", "configs.yaml")) as f:
        configs = yaml.YAML(typ="safe").load(f)
    parsed, other = elements.Flags(configs=["defaults"]).parse_known(argv)
    config = elements.Config(configs["defaults"])
    for name in parsed.configs:
        config = config.update(configs[name])
    return elements.Flags(config).parse(other)


def random_batch(agent, batch, length, rng):
    """A replay batch of the agent's spaces, `[batch, length, ...]`, drawn from `rng` (for timing and tests)."""
    import numpy as np

    data = {}
    for key, space in agent.spaces.items():
        shape = (batch, length, *space.shape)
        if np.issubdtype(space.dtype, np.floating):
            data[key] = rng.normal(size=shape).astype(space.dtype)
        elif space.dtype == bool:
            data[key] = rng.random(shape) < 0.05
        else:
            low = 0 if space.low is None else max(int(np.max(space.low)), 0)
            data[key] = rng.integers(low, max(int(np.min(space.high)), 1), shape).astype(space.dtype)
    data["consec"] = np.zeros((batch, length), np.int32)
    return data


def make_swap(variant: str, config, namespace):
    """`variant`'s `ValueHeadSwap` of `namespace` (the host's `embodied.jax`) for the agent `config` describes."""
    import numpy as np

    from multicritic.interop import dreamerv3_ninjax
    from multicritic.training import presets

    value, rssm = config.agent.value, config.agent.dyn.rssm
    if variant == "swap":
        critic = dreamerv3_ninjax.official_critic(value, rssm)
        return dreamerv3_ninjax.swap_value_heads(namespace, critic, initializer="host", distribution="host")
    if variant != "swap-2024":
        raise ValueError(f"variant: got {variant!r}, expected one of {list(VARIANTS[1:])}.")
    import keras

    sizes = {"model_size", "num_dense_layers", "dense_hidden_units", "num_buckets", "gru_units"}
    sizes |= {"num_z_categoricals", "num_z_classes"}
    options = {k: v for k, v in presets.options("dreamerv3-2024", "1m")["critic"].items() if k not in sizes}
    # The critic's own draw, from the run's seed; the host's Python and numpy streams are left as they were.
    states = random.getstate(), np.random.get_state()
    try:
        keras.utils.set_random_seed(int(config.seed))
        critic = dreamerv3_ninjax.official_critic(value, rssm, **options)
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
    return dreamerv3_ninjax.swap_value_heads(namespace, critic, initializer="critic", distribution="critic")


def _patch_host(env_seed):
    """What the driver changes around the official code, for every variant alike (see the module's docstring)."""
    import gym
    import jax

    jax.profiler.start_trace = lambda *args, **kwargs: None
    jax.profiler.stop_trace = lambda *args, **kwargs: None
    if env_seed is None:
        return
    make = gym.make

    def seeded(*args, **kwargs):
        env = make(*args, **kwargs)
        reset, first = env.reset, [True]

        def reset_once_seeded(*a, **k):
            if first[0] and "seed" not in k:
                first[0], k = False, {**k, "seed": env_seed}
            return reset(*a, **k)

        env.reset = reset_once_seeded
        return env

    gym.make = seeded


def child(variant: str, argv, env_seed, final_save=False) -> None:
    """One half of one run, in this process (`--child`): the official `main(argv)`, the swap in its `make_agent`;
    `final_save`: the official checkpoint saved once more when the loop ends (`cp.save()`)."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    sys.path.insert(0, ROOT)
    official_source()
    _patch_host(env_seed)
    import elements

    made = []
    if final_save:
        # The training loop's checkpoint (`cp = elements.Checkpoint(logdir / 'ckpt')` in embodied/run/train.py),
        # kept to save it when main() returns: the official loop saves on a clock only, never at its end.
        init = elements.Checkpoint.__init__

        def recorded(self, *args, **kwargs):
            init(self, *args, **kwargs)
            made.append(self)

        elements.Checkpoint.__init__ = recorded
    import dreamerv3.main as mainlib  # the official entry point (puts its folders on sys.path)
    import embodied.jax

    if variant != "stock":
        make_agent = mainlib.make_agent

        def swapped(config):
            # Built before the Agent turns on jax_transfer_guard='disallow'; the heads are made in its __init__.
            with make_swap(variant, config, embodied.jax) as swap:
                agent = make_agent(config)
            served = ", ".join(f"{name}={type(head).__name__}" for name, head in sorted(swap.heads.items()))
            print(f"{_SWAPPED}{variant}: {served} (initializer {swap.initializer})", flush=True)
            return agent

        mainlib.make_agent = swapped
    mainlib.main(list(argv))
    for checkpoint in made:
        checkpoint.save()
        print(f"{_SAVED}{int(checkpoint.step)}", flush=True)
    print(f"{_CPU}{time.process_time()}", flush=True)


def calibrate(variant: str, argv, steps: int) -> None:
    """Times the variant's jitted train step (`agent.train`) on random batches of the flags' shapes (`--child
    --calibrate`): build and compile time, the median of `steps` steps after the first."""
    import numpy as np

    os.environ.setdefault("KERAS_BACKEND", "jax")
    sys.path.insert(0, ROOT)
    src = official_source()
    _patch_host(None)
    import dreamerv3.main as mainlib
    import embodied.jax
    import jax

    config = official_config(src, argv).update(logdir=tempfile.mkdtemp(prefix="official-calibrate-"))
    start = time.perf_counter()
    if variant == "stock":
        agent = mainlib.make_agent(config)
    else:
        with make_swap(variant, config, embodied.jax):
            agent = mainlib.make_agent(config)
    built = time.perf_counter() - start
    rng = np.random.default_rng(0)
    length = config.batch_length + config.replay_context
    batches = iter(agent.stream(iter(random_batch(agent, config.batch_size, length, rng) for _ in range(steps + 2))))
    carry, times = agent.init_train(config.batch_size), []
    for _ in range(steps + 1):
        batch = next(batches)
        begin = time.perf_counter()
        carry, _, _ = agent.train(carry, batch)
        jax.block_until_ready(agent.params)
        times.append(time.perf_counter() - begin)
    print(
        f"calibrate {variant}: build and compile {built:.1f} s, train step median {np.median(times[1:]):.3f} s "
        f"(min {np.min(times[1:]):.3f} s, {steps} steps, B {config.batch_size} x T {length})",
        flush=True,
    )


def _restored_step(logdir: str):
    """`(step, updates)` of the official checkpoint the next half loads (`ckpt/latest`), or `(None, None)`."""
    latest = os.path.join(logdir, "ckpt", "latest")
    if not os.path.isfile(latest):
        return None, None
    with open(latest) as f:
        folder = os.path.join(logdir, "ckpt", f.read().strip())
    with open(os.path.join(folder, "step.pkl"), "rb") as f:
        step = int(pickle.load(f))
    with open(os.path.join(folder, "agent.pkl"), "rb") as f:
        updates = int(pickle.load(f)["counters"]["updates"])
    return step, updates


def _scores(path: str, offset: int):
    """The episodes the official logger appended to `scores.jsonl` from byte `offset`: `[[step, return], ...]`."""
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        f.seek(offset)
        lines = [json.loads(line) for line in f if line.strip()]
    return [[int(r["step"]), float(r["episode/score"])] for r in lines if "episode/score" in r]


def run_half(variant, seed, steps, half, work, log, extra=(), cpu=None, env_seed=True, final_save=True) -> dict:
    """Runs one half in a child process; returns its episodes, restored step and times."""
    logdir = os.path.join(work, f"{variant}-{seed}")
    flags = [*FLAGS, "--task", TASK, *extra, "--seed", str(seed), "--logdir", logdir]
    flags += ["--run.steps", str(steps // 2 if half == 0 else steps)]
    restored, updates = _restored_step(logdir) if half == 1 else (None, None)
    if half == 1 and restored is None:
        raise RuntimeError(f"{variant} seed {seed}: no official checkpoint under {logdir} to resume from")
    scores = os.path.join(logdir, "scores.jsonl")
    offset = os.path.getsize(scores) if os.path.isfile(scores) else 0
    command = [sys.executable, os.path.abspath(__file__), "--child", variant]
    if env_seed:
        command += ["--env-seed", str(1000 * seed + half)]
    if final_save and half == 0:
        command += ["--final-save"]
    command += ["--", *flags]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "KERAS_BACKEND": "jax", "PYTHONPATH": ROOT}
    pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    start, swapped, cpu_s, loaded, saved, lines = time.perf_counter(), None, None, False, None, []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env, preexec_fn=pin
    ) as process:
        for line in process.stdout:
            lines.append(line)
            if line.startswith(_SWAPPED):
                swapped = line[len(_SWAPPED) :].strip()
            if line.startswith(_CPU):
                cpu_s = float(line[len(_CPU) :])
            if line.startswith(_SAVED):
                saved = int(line[len(_SAVED) :])
            loaded = loaded or line.strip() == _LOADED
    if process.returncode:
        raise RuntimeError(f"{variant} seed {seed} half {half} failed:\n{''.join(lines[-40:])}")
    if (variant != "stock") != bool(swapped):
        raise RuntimeError(f"{variant} seed {seed}: the swap {'did not' if swapped is None else 'did'} take place")
    if loaded != (half == 1):
        raise RuntimeError(
            f"{variant} seed {seed} half {half}: the official checkpoint was {'not ' * (not loaded)}loaded"
        )
    episodes = _scores(scores, offset)
    wall = time.perf_counter() - start
    last = episodes[-1][1] if episodes else "-"
    log(f"{variant} seed {seed} half {half}: {len(episodes)} episodes, the last one's return {last}")
    return {
        "episodes": episodes,
        "wall_s": wall,
        "cpu_s": cpu_s,
        "swapped": swapped,
        "restored_step": restored,
        "restored_updates": updates,
        "env_seed": 1000 * seed + half if env_seed else None,
        "final_save_step": saved,
    }


def versions() -> dict:
    from importlib import metadata

    out = {"commit": COMMIT, "python": sys.version.split()[0]}
    for name in ("jax", "jaxlib", "numpy", "keras", "ninjax", "elements", "gym"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def setup(root: str, dry_run: bool = False) -> None:
    """Clones the official source at `COMMIT` into `root/src` and makes its environment in `root/venv` (`PACKAGES`
    from PyPI). Prints each command; `dry_run`: only prints them."""
    src, venv = os.path.join(root, "src"), os.path.join(root, "venv")
    commands = []
    if not os.path.isdir(os.path.join(src, ".git")):
        commands.append(["git", "clone", "--quiet", REPOSITORY, src])
    commands.append(["git", "-C", src, "checkout", "--quiet", COMMIT])
    if not os.path.isfile(os.path.join(venv, "bin", "python")):
        commands.append([sys.executable, "-m", "venv", venv])
    commands.append([os.path.join(venv, "bin", "pip"), "install", "--quiet", *PACKAGES])
    for command in commands:
        print("+", " ".join(command), flush=True)
        if not dry_run:
            subprocess.run(command, check=True)
    print(f"export {SOURCE_ENV}={src}; run this driver with {os.path.join(venv, 'bin', 'python')}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", metavar="VARIANT", help=argparse.SUPPRESS)
    parser.add_argument("--env-seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--final-save", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--setup", metavar="DIR", help="clone the official source and make its environment in DIR")
    parser.add_argument("--dry-run", action="store_true", help="with --setup: print the commands only")
    parser.add_argument("--calibrate", type=int, metavar="STEPS", help="time STEPS train steps of each variant")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20000, help="environment steps per run (resumed at half)")
    parser.add_argument("--workers", type=int, default=1, help="runs at a time")
    parser.add_argument("--cpus", nargs="+", type=int, help="pin each run to one of these CPUs (one per worker)")
    parser.add_argument("--no-env-seed", action="store_true", help="leave gym's first reset unseeded")
    parser.add_argument(
        "--clock-saves-only", action="store_true", help="resume from the official loop's last timed save only"
    )
    parser.add_argument("--work", help="folder for the official logdirs (default: a temporary one)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("flags", nargs="*", help="more flags for the official main.py (after --)")
    args = parser.parse_args(argv)
    if args.setup:
        return setup(args.setup, args.dry_run)
    if args.child:
        if args.calibrate:
            return calibrate(args.child, [*FLAGS, "--task", TASK, *args.flags], args.calibrate)
        return child(args.child, args.flags, args.env_seed, args.final_save)
    official_source()  # fail before any run
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": ROOT}
    if args.calibrate:
        for variant in args.variants:
            command = [
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                variant,
                "--calibrate",
                str(args.calibrate),
            ]
            subprocess.run([*command, "--", *args.flags], check=True, cwd=ROOT, env=env)
        return None
    results = {
        "command": " ".join(["python benchmarks/agents/official_dreamer.py", *sys.argv[1:]]),
        "env": TASK,
        "steps": args.steps,
        "flags": [*FLAGS, *args.flags],
        "versions": versions(),
        "env_seeded": not args.no_env_seed,
        "final_save": not args.clock_saves_only,
        "runs": {},
    }
    halves.resume(results, args.json, ("env", "steps", "flags", "env_seeded", "final_save"))
    work = args.work or tempfile.mkdtemp(prefix="official-dreamer-")

    def half(variant, seed, number, cpu):
        return run_half(
            variant, seed, args.steps, number, work, halves.log, args.flags, cpu, not args.no_env_seed,
            not args.clock_saves_only,
        )  # fmt: skip

    halves.run_all(
        results,
        args.json,
        [(v, s) for s in args.seeds for v in args.variants],
        logdir=lambda variant, seed: os.path.join(work, f"{variant}-{seed}"),
        resumable=lambda folder: bool(glob.glob(os.path.join(folder, "ckpt", "latest"))),
        half=half,
        slots=(args.cpus or [None] * args.workers)[: args.workers],
    )
    return results


if __name__ == "__main__":
    main()
