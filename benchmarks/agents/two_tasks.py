"""One critic for two tasks whose returns differ by 1e4 in scale, with a return normaliser per task (issue 74).

Two of the demo's random Markov reward processes (`multicritic.demo.mdp`), task 0 at reward scale 1 and task 1
at reward scale 1e4, with the demo's hyperparameters (`DemoConfig`: gamma 0.9, horizon 15, Adam at 3e-3 with
cosine decay). Each task's states have their own demo codes (two environments), with the task's one-hot in the
last units of `h`. Four critics
train on the same dreams, step by step, each a `MultiCritic` stream with the 2024 preset's percentile normaliser
(`impl="perc"`, rate 0.01, limit 1):

- `per_task`: one critic on both tasks' dreams, its normaliser per task (`num_tasks=2`), trained with
  `CriticTrainer.train_on_dream(..., task_ids=...)`;
- `shared`: the same critic (same initial weights, same dreams) with one normaliser for both tasks;
- `task_0`, `task_1`: one critic and normaliser per task, on that task's dreams only.

Scored per task after training: the critic's relative RMSE against the exact values (a linear solve), and the
normaliser's scale `S` (what an actor divides its advantages by). The normaliser does not enter the critic's
loss: `per_task` and `shared` learn the same values, and differ only in `S`.

    KERAS_BACKEND=jax python benchmarks/agents/two_tasks.py --json benchmarks/results/results_two_tasks.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Sequence

import keras
import numpy as np

from multicritic import CriticNetwork, CriticTrainer, MultiCritic, inverse_symlog
from multicritic.demo import numerics
from multicritic.demo.config import DemoConfig
from multicritic.demo.mdp import encode_states, random_mdp
from multicritic.model.sizes import get_model_dims

RUNS = ("per_task", "shared", "task_0", "task_1")
# The 2024 preset's return normaliser (`multicritic.training.presets`).
NORMALIZER = {"impl": "perc", "rate": 0.01, "limit": 1.0}
DEMO = DemoConfig()


@dataclass
class Settings:
    scales: Sequence[float] = (1.0, 1e4)
    size: str = "mini"
    bins: str = "symexp"  # the demo's (and the 2024 code's) bins
    steps: int = 1500
    batch: int = 32  # dreams per task and step
    seeds: Sequence[int] = (0,)
    eval_every: int = 100
    num_states: int = DEMO.num_states
    noise: float = DEMO.noise
    horizon: int = DEMO.horizon
    gamma: float = DEMO.gamma
    lambda_: float = DEMO.lambda_
    learning_rate: float = DEMO.learning_rate
    normalizer: Dict[str, object] = field(default_factory=lambda: dict(NORMALIZER))
    jit_compile: object = True  # thousands of steps of one shape: compiled from the first (the demo's choice)


def _run_tasks(run: str, tasks: int) -> List[int]:
    return list(range(tasks)) if run in ("per_task", "shared") else [int(run.split("_")[1])]


def _trainer(settings: Settings, run: str, seed: int, tasks: int):
    """A fresh critic (the seed's initial weights: every run starts from the same) in a one-stream MultiCritic."""
    random.seed(seed)
    np.random.seed(seed)
    critic = CriticNetwork(model_size=settings.size, bin_scheme=settings.bins, name="value")
    normalizer = dict(settings.normalizer, num_tasks=tasks) if run == "per_task" else dict(settings.normalizer)
    multi = MultiCritic({"value": critic}, normalizers={"value": normalizer})
    schedule = keras.optimizers.schedules.CosineDecay(settings.learning_rate, settings.steps, alpha=0.02)
    optimizer = keras.optimizers.Adam(schedule, epsilon=1e-5)
    return multi, CriticTrainer(
        multi, optimizer, gamma=settings.gamma, lambda_=settings.lambda_, jit_compile=settings.jit_compile
    )


def run_seed(settings: Settings, seed: int, log=print) -> dict:
    rng = np.random.default_rng(seed)
    tasks = len(settings.scales)
    mdps = [
        random_mdp(rng, num_states=settings.num_states, noise=settings.noise, gamma=settings.gamma).scaled(scale)
        for scale in settings.scales
    ]
    exact = [mdp.values() for mdp in mdps]
    dims = get_model_dims(settings.size)
    # Each task's states are its own (two environments): state `s` of task `t` is the demo's code of state
    # `t * S + s`, with the task's one-hot at the end of `h`.
    h, z = encode_states(
        rng, tasks * settings.num_states, dims["gru_units"] - tasks, dims["num_z_categoricals"], dims["num_z_classes"]
    )
    one_hot = np.repeat(np.eye(tasks, dtype=np.float32), settings.num_states, axis=0)
    h = np.concatenate([h, one_hot], 1).reshape(tasks, settings.num_states, -1)
    z = z.reshape((tasks, settings.num_states) + z.shape[1:])
    runs = {run: _trainer(settings, run, seed, tasks) for run in RUNS}
    curves = {run: [] for run in runs}
    seconds = dict.fromkeys(runs, 0.0)

    def errors(run):
        critic = runs[run][0].critics["value"]
        out = []
        for t in _run_tasks(run, tasks):
            values = keras.ops.convert_to_numpy(inverse_symlog(critic(h[t], z[t])[0])).astype(np.float64)
            out.append(float(np.sqrt(np.mean((values - exact[t]) ** 2)) / np.sqrt(np.mean(exact[t] ** 2))))
        return out

    for step in range(1, settings.steps + 1):
        dreams = [
            mdps[t].rollouts(rng, rng.integers(settings.num_states, size=settings.batch), settings.horizon)
            for t in range(tasks)
        ]
        for run, (_, trainer) in runs.items():
            mine = _run_tasks(run, tasks)
            states = np.concatenate([dreams[t][0] for t in mine], 1)
            task_of = np.repeat(mine, settings.batch)
            rewards = np.concatenate([dreams[t][1] for t in mine], 1)
            continues = np.concatenate([dreams[t][2] for t in mine], 1)
            extra = {"task_ids": task_of} if run == "per_task" else {}
            tasks_of = task_of[None, :]  # [1, B]: each dream's task, with its states [H+1, B]
            start = time.perf_counter()
            trainer.train_on_dream(h[tasks_of, states], z[tasks_of, states], {"value": rewards}, continues, **extra)
            seconds[run] += time.perf_counter() - start
        if step % settings.eval_every == 0 or step == settings.steps:
            for run in runs:
                curves[run].append([step, *errors(run)])
    record = {"seed": seed, "exact_value_range": [[float(v.min()), float(v.max())] for v in exact], "runs": {}}
    for run, (multi, _) in runs.items():
        scale = np.atleast_1d(keras.ops.convert_to_numpy(multi.normalizers["value"].scale())).tolist()
        record["runs"][run] = {
            "tasks": _run_tasks(run, tasks),
            "relative_rmse": curves[run][-1][1:],
            "scale": scale,
            "curve": curves[run],
            "train_seconds": seconds[run],
        }
        log(f"seed {seed} {run}: relative RMSE {curves[run][-1][1:]}, normaliser scale {scale}")
    return record


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Settings()
    parser.add_argument("--scales", nargs="+", type=float, default=list(defaults.scales))
    parser.add_argument("--size", default=defaults.size)
    parser.add_argument("--bins", default=defaults.bins, choices=["symexp", "uniform_symlog"])
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--batch", type=int, default=defaults.batch, help="dreams per task and step")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(defaults.seeds))
    parser.add_argument("--eval-every", type=int, default=defaults.eval_every)
    parser.add_argument("--jit-compile", default="true", choices=["true", "false", "auto"])
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if len(args.scales) != 2:
        parser.error(f"--scales: got {len(args.scales)} scales, expected two (one per task)")
    backend = keras.backend.backend()
    print(numerics.describe(numerics.pin(backend)))  # before JAX starts (the critic's first computation)
    settings = Settings(
        scales=tuple(args.scales),
        size=args.size,
        bins=args.bins,
        steps=args.steps,
        batch=args.batch,
        seeds=tuple(args.seeds),
        eval_every=args.eval_every,
        jit_compile={"true": True, "false": False}.get(args.jit_compile, args.jit_compile),
    )
    start, cpu = time.perf_counter(), time.process_time()
    seeds = [run_seed(settings, seed) for seed in settings.seeds]
    results = {
        "command": " ".join([f"KERAS_BACKEND={backend} python benchmarks/agents/two_tasks.py", *sys.argv[1:]])
        if argv is None
        else " ".join(["python benchmarks/agents/two_tasks.py", *argv]),
        "backend": backend,
        "settings": asdict(settings) | {"scales": list(settings.scales), "seeds": list(settings.seeds)},
        "seeds": seeds,
        "wall_seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu,
        "environment": numerics.environment(backend),
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
