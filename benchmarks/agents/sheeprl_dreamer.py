"""Learning curves of sheeprl's DreamerV3 with its own critic and with multicritic's, over seeds.

sheeprl 0.8.4's own CLI entry (`run_algorithm`) on a Gymnasium environment
(default CartPole-v1), one process per run, each run in two halves: the
first half ends with sheeprl's own checkpoint (replay buffer included), the
second resumes from it (`checkpoint.resume_from`), so every curve crosses a
resume. Variants, same config and seeds:

- `stock`: sheeprl's critic and target critic;
- `swap`: the README's swap (`sheeprl_critic` + `sheeprl_modules`, 2023
  options, sheeprl's own loss, optimizer and target update on the views).
- `swap-2024`: the swap with the 2024 recipe's critic (`RECIPE_2024_KEYS`: symexp
  buckets decoded in real space, RMS norm, biases, fan-in truncated-normal
  initialisers, zero-initialised output), views in the critic's own layout,
  and sheeprl's distribution replaced by `sheeprl_distribution` where `train`
  reads the critic. sheeprl's optimizer, target update, loss (the lambda
  returns and the target critic's mean as two-hot targets, the 2024
  regulariser too) and sizes stay; the recipe's optimizer (LaProp) and
  replay value loss are the trainer's, not the critic's, so they are not
  part of a critic swap.

Writes the episodes' returns against environment steps, the wall and CPU
time of each half, to `--json` after every finished half (a rerun skips the
halves already there, so a long comparison can be split over sessions).

    KERAS_BACKEND=torch python benchmarks/agents/sheeprl_dreamer.py --steps 12000 --seeds 1 2 3 \
        --workers 2 --json benchmarks/results/results_sheeprl_dreamer.json

Needs the interop session's packages (`sheeprl==0.8.4` and its dependencies).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "torch")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from benchmarks import example  # noqa: E402
from benchmarks.agents import halves  # noqa: E402

VARIANTS = ("stock", "swap", "swap-2024")
# The 2024 recipe's options of the critic itself, from the preset (its sizes are sheeprl's here).
RECIPE_2024_KEYS = (
    "bin_scheme", "num_buckets", "lower_bound", "upper_bound", "norm", "norm_epsilon", "use_bias", "kernel_initializer"
)  # fmt: skip

# The example's settings (CPU, one environment, vector observations), on a Gymnasium task at sizes that learn
# CartPole in a few thousand steps on one CPU thread: dense 64 / recurrent 128 / 16x16 latents, B 16 x T 64,
# replay ratio 0.5, sheeprl's horizon; the replay buffer in the checkpoint (a resume continues on it), the
# episodes' returns printed. `total_steps` and the buffer's size are set per run.
CHANGES = {
    "env": "gym",
    "algo.dense_units": "64",
    "algo.world_model.recurrent_model.recurrent_state_size": "128",
    "algo.world_model.stochastic_size": "16",
    "algo.world_model.discrete_size": "16",
    "algo.world_model.transition_model.hidden_size": "64",
    "algo.world_model.representation_model.hidden_size": "64",
    "algo.per_rank_batch_size": "16",
    "algo.per_rank_sequence_length": "64",
    "algo.replay_ratio": "0.5",
    "algo.learning_starts": "1024",
    "buffer.checkpoint": "True",
    "metric.log_level": "1",
    "metric.disable_timer": "True",
    "checkpoint.save_last": "True",
}
DROPPED = ("algo.total_steps", "algo.horizon", "buffer.size", "checkpoint.every")


def overrides():
    """sheeprl's overrides for these runs: the example's with `CHANGES`, without `DROPPED`."""
    settings = dict(o.split("=", 1) for o in example("sheeprl_critic").OVERRIDES)
    settings = {k: v for k, v in {**settings, **CHANGES}.items() if k not in DROPPED}
    return [f"{k}={v}" for k, v in settings.items()]


_EPISODE = re.compile(r"policy_step=(\d+), reward_env_\d+=([-+0-9.eE]+)")
_SWAPPED, _CPU, _READ = "multicritic swap: ", "cpu seconds: ", "critic distributions: "
_READS = [0]  # how often sheeprl's train read the 2024 critic through `sheeprl_distribution`


def _swap(variant: str) -> None:
    """Puts multicritic's critic into sheeprl's `build_agent` (in this process)."""
    import sheeprl.algos.dreamer_v3.dreamer_v3 as dreamer_v3

    from multicritic.interop import sheeprl as adapter

    build_agent = dreamer_v3.build_agent

    def swapped(fabric, actions_dim, is_continuous, cfg, obs_space, wm_state=None, actor_state=None, *states):
        from sheeprl.utils.fabric import setup_module

        recipe = variant == "swap-2024"
        # The 2024 critic's weights are in its own layout, which sheeprl's critic cannot load: they go into the
        # views below, and sheeprl's critic is built fresh.
        args = (fabric, actions_dim, is_continuous, cfg, obs_space, wm_state, actor_state)
        world_model, actor, critic, target_critic, player = build_agent(*args, *(() if recipe else states))
        wm = cfg.algo.world_model
        sizes = dict(
            gru_units=wm.recurrent_model.recurrent_state_size,
            num_z_categoricals=wm.stochastic_size,
            num_z_classes=wm.discrete_size,
        )
        if recipe:
            ours = _recipe_critic(cfg, sizes)
            critic_module, target_module = adapter.sheeprl_modules(ours, layout="multicritic")
            for module, state in zip((critic_module, target_module), states):
                if state is not None:  # a resume: the checkpoint's critic and target critic
                    module.load_state_dict(state)
            _use_distribution(dreamer_v3, adapter.sheeprl_distribution(ours), (critic_module, target_module))
        else:
            # sheeprl's weights (fresh, or its checkpoint's on a resume) in, the views out.
            ours = adapter.sheeprl_critic(critic.module.state_dict(), target_critic.state_dict(), **sizes)
            critic_module, target_module = adapter.sheeprl_modules(ours)
        resumed = " (resumed)" if any(state is not None for state in states) else ""
        print(f"{_SWAPPED}{variant}: {type(critic_module).__name__}{resumed}", flush=True)
        return world_model, actor, setup_module(fabric, critic_module), target_module, player

    dreamer_v3.build_agent = swapped


def _recipe_critic(cfg, sizes):
    """The 2024 recipe's critic at sheeprl's critic sizes, its initial weights from sheeprl's seed (through
    `keras.utils.set_random_seed`, which also reseeds torch's generator: this variant's random stream is its
    own, the same for every run of a seed)."""
    import keras

    from multicritic import CriticNetwork
    from multicritic.training import presets

    recipe = presets.options("dreamerv3-2024")["critic"]
    keras.utils.set_random_seed(cfg.seed)
    critic = CriticNetwork(
        model_size=None,
        num_dense_layers=cfg.algo.critic.mlp_layers,
        dense_hidden_units=cfg.algo.critic.dense_units,
        input_layout="z_h",
        **sizes,
        **{key: recipe[key] for key in RECIPE_2024_KEYS},
    )
    z = np.zeros((1, sizes["num_z_categoricals"], sizes["num_z_classes"]), "float32")
    critic(np.zeros((1, sizes["gru_units"]), "float32"), z)
    return critic


def _use_distribution(dreamer_v3, distribution, modules):
    """sheeprl's `train` reads the critic's logits through `TwoHotEncodingDistribution`, as it reads the reward
    model's: the critic's (the outputs of `modules`, recorded by a forward hook) get `distribution`, the
    reward model's sheeprl's own."""
    import weakref

    theirs, outputs = dreamer_v3.TwoHotEncodingDistribution, weakref.WeakValueDictionary()
    for module in modules:
        module.register_forward_hook(lambda module, args, out: outputs.__setitem__(id(out), out))

    def either(logits, dims=0):
        if outputs.get(id(logits)) is logits:
            _READS[0] += 1
            return distribution(logits, dims)
        return theirs(logits, dims=dims)

    dreamer_v3.TwoHotEncodingDistribution = either


def child(variant: str, extra) -> None:
    """One half of one run, in this process (`--child`)."""
    import torch

    torch.set_num_threads(1)
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from sheeprl.cli import check_configs, run_algorithm
    from sheeprl.utils.utils import dotdict

    if variant != "stock":
        _swap(variant)
    with initialize_config_module(version_base="1.3", config_module="sheeprl.configs"):
        cfg = compose(config_name="config", overrides=[*overrides(), *extra])
    cfg = dotdict(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))
    check_configs(cfg)
    run_algorithm(cfg)
    print(f"{_READ}{_READS[0]}", flush=True)
    print(f"{_CPU}{time.process_time()}", flush=True)


def _checkpoint(log_root: str) -> str:
    found = [os.path.join(d, f) for d, _, files in os.walk(log_root) for f in files if f.endswith(".ckpt")]
    if len(found) != 1:
        raise RuntimeError(f"expected one checkpoint under {log_root}, found {found}")
    return found[0]


def run_half(variant: str, seed: int, steps: int, half: int, work: str, env_id: str, log, extra=()) -> dict:
    """Runs one half in a child process; returns its episodes and times."""
    log_root = os.path.join(work, f"{variant}-{seed}")
    overrides = [
        *extra,
        f"seed={seed}",
        f"env.id={env_id}",
        f"log_root={log_root}",
        f"buffer.size={steps}",
        f"algo.total_steps={steps // 2 if half == 0 else steps}",
        f"checkpoint.every={steps}",
    ]
    if half == 1:
        overrides.append(f"checkpoint.resume_from={_checkpoint(log_root)}")
    command = [sys.executable, os.path.abspath(__file__), "--child", variant, *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    start, episodes, swapped, cpu, reads = time.perf_counter(), [], None, None, None
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env
    ) as process:
        lines = []
        for line in process.stdout:
            lines.append(line)
            found = _EPISODE.search(line)
            if found:
                episodes.append([int(found[1]), float(found[2])])
                log(f"{variant} seed {seed}: step {found[1]} return {float(found[2]):.1f}")
            if line.startswith(_SWAPPED):
                swapped = line[len(_SWAPPED) :].strip()
            if line.startswith(_CPU):
                cpu = float(line[len(_CPU) :])
            if line.startswith(_READ):
                reads = int(line[len(_READ) :])
    if process.returncode:
        raise RuntimeError(f"{variant} seed {seed} half {half} failed:\n{''.join(lines[-40:])}")
    if (variant != "stock") != bool(swapped):
        raise RuntimeError(f"{variant} seed {seed}: the swap {'did not' if swapped is None else 'did'} take place")
    if variant == "swap-2024" and not reads:
        raise RuntimeError(f"{variant} seed {seed}: sheeprl's train never read the critic through its distribution")
    wall = time.perf_counter() - start
    return {"episodes": episodes, "wall_s": wall, "cpu_s": cpu, "swapped": swapped, "critic_reads": reads}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", metavar="VARIANT", help=argparse.SUPPRESS)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=12000, help="environment steps per run (resumed at half)")
    parser.add_argument("--env", default="CartPole-v1", help="Gymnasium id")
    parser.add_argument("--workers", type=int, default=2, help="runs at a time (one thread each)")
    parser.add_argument("--work", help="folder for sheeprl's logs and checkpoints (default: a temporary one)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("overrides", nargs="*", help="more hydra overrides for sheeprl (smoke runs)")
    args, rest = parser.parse_known_args(argv)
    rest = [*args.overrides, *rest]
    if args.child:
        return child(args.child, rest)
    results = {
        "command": " ".join(["python benchmarks/agents/sheeprl_dreamer.py", *sys.argv[1:]]),
        "env": args.env,
        "steps": args.steps,
        "overrides": [*overrides(), *rest],
        "runs": {},
    }
    halves.resume(results, args.json, ("env", "steps"))
    work = args.work or tempfile.mkdtemp(prefix="sheeprl-dreamer-")
    halves.run_all(
        results,
        args.json,
        [(v, s) for s in args.seeds for v in args.variants],
        logdir=lambda variant, seed: os.path.join(work, f"{variant}-{seed}"),
        resumable=os.path.isdir,
        half=lambda variant, seed, half, _: run_half(variant, seed, args.steps, half, work, args.env, halves.log, rest),
        slots=[None] * args.workers,
    )
    return results


if __name__ == "__main__":
    main()
