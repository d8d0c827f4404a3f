"""What a PPO run costs as a Keras program against the fastest hand-written loop of the same backend.

The same agent (`examples/ppo/keras_agent.py`'s hyperparameters, rollouts, GAE and critic), the same head
and steps, as a Keras program (`keras_agent.py`: the actor and the critic as one Keras model through
`multicritic.CompiledForward` to act, Keras's `train_on_batch` for the actor, `CriticTrainer` for the
critic) and as each framework's own code (JAX: `jax_agent.py`, one `jax.jit`
update with optax; PyTorch: `torch_agent.py`, a `torch.optim` loop over the critic's modules; TensorFlow:
`tf_agent.py`, plain-graph `tf.function`s). Each run is a process of its own, one thread, one at a time;
a backend's two agents run back to back on each task and seed (a block), the pair's order alternating from
block to block. A run's time is its `seconds` (from building the agent to its last update:
imports and the interpreter's start are not counted, compilation is), split into the agents' phases
(`keras_agent.Phases`: acting, the critic's values, environment steps, updates, the rest).

    python benchmarks/agents/ppo_cost.py --backends jax torch tensorflow --envs CartPole-v1 Acrobot-v1 \
        --seeds 1 2 --steps 25000 --json benchmarks/results/results_ppo_cost.json

Time it on an otherwise idle machine: a job alongside moves a ratio by 25% or more. The target (issue 63):
the Keras program's median within 1.2x of the hand-written loop's, per backend and task.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ppo_scales import run_one  # noqa: E402

# Each backend's hand-written loop (a grid backend of `ppo_scales.AGENTS`); the Keras program is the backend.
NATIVE = {"jax": "jax-jit", "torch": "torch-loop", "tensorflow": "tf-loop"}
TARGET = 1.2


def run_key(agent, env, seed):
    return f"{agent}/{env}/{seed}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=list(NATIVE), choices=list(NATIVE))
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "Acrobot-v1"])
    parser.add_argument("--head", default="two_hot")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--steps", type=int, default=25_000)
    parser.add_argument("--json", metavar="PATH", required=True)
    args = parser.parse_args(argv)
    results = {
        "command": " ".join(["python benchmarks/agents/ppo_cost.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "head": args.head,
        "steps": args.steps,
        "target": TARGET,
        "runs": {},
    }
    if os.path.exists(args.json):
        with open(args.json) as f:
            previous = json.load(f)
        if (previous.get("head"), previous.get("steps")) == (args.head, args.steps):
            results["runs"] = previous["runs"]  # a grid split over sessions: runs done are kept

    def log(message):
        print(time.strftime("%H:%M:%S"), message, flush=True)

    block = 0
    for seed in args.seeds:
        for env in args.envs:
            for backend in args.backends:
                pair = [backend, NATIVE[backend]]
                for agent in pair if block % 2 == 0 else pair[::-1]:
                    name = run_key(agent, env, seed)
                    if name in results["runs"]:
                        continue
                    record = run_one(agent, env, args.head, 1.0, seed, args.steps, lambda line: None)
                    results["runs"][name] = {
                        "backend": backend,
                        "agent": "keras" if agent == backend else "native",
                        "env": env,
                        "seed": seed,
                        "block": block,
                        "seconds": record["seconds"],
                        "phases": record["phases"],
                        "episodes": len(record["episodes"]),
                    }
                    with open(args.json + ".tmp", "w") as f:
                        json.dump(results, f, indent=1)
                    os.replace(args.json + ".tmp", args.json)
                    log(f"{name}: {record['seconds']:.1f} s")
                block += 1
    return results


if __name__ == "__main__":
    main()
