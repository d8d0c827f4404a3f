"""Learning curves of PPO with multicritic's critic at reward scales 1, 1e3 and 1e6, per head and backend.

Runs a PPO agent over a grid of backends x tasks x value heads x reward scales x seeds, one process per
run, `--workers` at a time (one thread each), and merges every run's curve into `--json` as it goes (runs
already there are skipped, so a grid can be split over sessions). A backend of the grid is a Keras backend
running `examples/ppo/keras_agent.py` (one Keras program), `torch-loop` (`examples/ppo/torch_agent.py`, a
PyTorch user's own loop), `jax-jit` (`examples/ppo/jax_agent.py`, a JAX user's) or `tf-loop`
(`examples/ppo/tf_agent.py`, a TensorFlow user's). One set of
hyperparameters for every run (`keras_agent.HYPERPARAMETERS`), no reward normalisation. `--trunks` is the
critic's trunk (the agents' `--trunk`; `mlp` by default): a run of another trunk is keyed
`backend/env/head/scale/seed/trunk`, an MLP's as before, `backend/env/head/scale/seed`. The other top-level
fields of an existing `--json` are kept (`benchmarks/ours/critic_comparison.py` writes its plan there).

    python benchmarks/agents/ppo_scales.py --backends jax torch tensorflow torch-loop jax-jit \
        --envs CartPole-v1 Acrobot-v1 --heads two_hot hl_gauss --scales 1 1000 1000000 --seeds 1 2 3 \
        --steps 100000 --workers 2 --json benchmarks/results/results_ppo_scales.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A grid's "backend": a Keras backend running the Keras agent, "torch-loop", the PyTorch user's agent
# (examples/ppo/torch_agent.py: its own torch.optim loop around the critic's modules), or "jax-jit", the JAX
# user's (examples/ppo/jax_agent.py: jax.jit and optax over the critic's pure functions), or "tf-loop", the
# TensorFlow user's (examples/ppo/tf_agent.py: plain-graph tf.functions around the critic).
AGENTS = {
    "torch-loop": ("torch", "torch_agent.py"),
    "jax-jit": ("jax", "jax_agent.py"),
    "tf-loop": ("tensorflow", "tf_agent.py"),
}


def agent(backend):
    """`(KERAS_BACKEND, the agent's path)` of a grid's backend."""
    keras_backend, script = AGENTS.get(backend, (backend, "keras_agent.py"))
    return keras_backend, os.path.join(ROOT, "examples", "ppo", script)


def key(backend, env, head, scale, seed, trunk="mlp"):
    """A run's name in the JSON: the trunk is added only where it is not the MLP (older files' keys name none)."""
    return f"{backend}/{env}/{head}/{scale:g}/{seed}" + ("" if trunk == "mlp" else f"/{trunk}")


def run_one(backend, env, head, scale, seed, steps, log, trunk="mlp"):
    """One run in its own process; returns its record (the agent's JSON; a trunk other than the MLP in its
    `critic_options`)."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "run.json")
        keras_backend, script = agent(backend)
        command = [
            sys.executable,
            script,
            "--env",
            env,
            "--head",
            head,
            "--reward-scale",
            str(scale),
            "--steps",
            str(steps),
            "--seed",
            str(seed),
            "--json",
            out,
        ]
        if trunk != "mlp":  # the MLP's command as it always was
            command += ["--trunk", trunk]
        env_vars = {
            **os.environ,
            "KERAS_BACKEND": keras_backend,
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false",
            "TF_NUM_INTRAOP_THREADS": "1",
            "TF_NUM_INTEROP_THREADS": "1",
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "PYTHONUNBUFFERED": "1",
        }
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env_vars
        ) as process:
            tail = []
            for line in process.stdout:
                tail = (tail + [line])[-30:]
                if "return" in line:
                    log(line.strip())
        if process.returncode:
            raise RuntimeError(f"{key(backend, env, head, scale, seed, trunk)} failed:\n{''.join(tail)}")
        with open(out) as f:
            return json.load(f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["jax", "torch", "tensorflow"])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "Acrobot-v1"])
    parser.add_argument("--heads", nargs="+", default=["two_hot", "hl_gauss"])
    parser.add_argument("--trunks", nargs="+", default=["mlp"], help="the critic's trunks (default: mlp)")
    parser.add_argument("--scales", nargs="+", type=float, default=[1.0, 1e3, 1e6])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", metavar="PATH", required=True)
    args = parser.parse_args(argv)
    command = " ".join(["python benchmarks/agents/ppo_scales.py", *(sys.argv[1:] if argv is None else argv)])
    results = {"command": command, "runs": {}}
    if os.path.exists(args.json):
        with open(args.json) as f:
            results = {**json.load(f), "command": command}
    lock = threading.Lock()

    def log(message):
        print(time.strftime("%H:%M:%S"), message, flush=True)

    def one(grid):
        *run, trunk = grid
        name = key(*run, trunk)
        if name in results["runs"] and results["runs"][name]["steps"] >= args.steps:
            return
        record = run_one(*run, args.steps, log, trunk)
        with lock:
            results["runs"][name] = record
            with open(args.json + ".tmp", "w") as f:
                json.dump(results, f)
            os.replace(args.json + ".tmp", args.json)
        log(f"{name} done in {record['seconds']:.0f} s")

    grid = list(itertools.product(args.backends, args.envs, args.heads, args.scales, args.seeds, args.trunks))
    with ThreadPoolExecutor(args.workers) as pool:
        for future in [pool.submit(one, g) for g in grid]:
            future.result()
    return results


if __name__ == "__main__":
    main()
