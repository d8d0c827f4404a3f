"""The two-hot critic's first phase inside PPO, per reward scale: how far its values are from the returns.

Runs `examples/ppo/keras_agent.py` (CartPole-v1, one seed) with the critic's learning rate and bucket scheme
of each `--configs` entry (`LR:BIN_SCHEME`) at each reward scale, and prints every `--every`-th update's
critic fit (`keras_agent.critic_fit`: explained variance, mean |symlog(value) - symlog(return)|, relative
bias) and the final return. A critic whose mean is decoded in symlog space (`uniform_symlog`, the 2023
reference) starts biased towards symlog 0 by a fraction of the return's symlog, which is larger the larger
the rewards; one decoded in real space (`symexp`, 2024) by the same fraction of the return at every scale.

    KERAS_BACKEND=jax python benchmarks/agents/critic_transient.py --scales 1 1000000 --steps 30000 \
        --configs 2.5e-4:uniform_symlog 1e-3:uniform_symlog 2.5e-4:symexp \
        --json benchmarks/results/results_critic_transient.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "ppo"))
import keras_agent  # noqa: E402


def run(env, lr, bin_scheme, scale, steps, seed):
    """One run's record, with `critic_lr = lr` and the critic's `bin_scheme`."""
    saved = dict(keras_agent.HYPERPARAMETERS), dict(keras_agent.CRITIC_OPTIONS)
    keras_agent.HYPERPARAMETERS["critic_lr"] = lr
    keras_agent.CRITIC_OPTIONS["bin_scheme"] = bin_scheme
    try:
        return keras_agent.train(env, "two_hot", scale, steps, seed, log=lambda message: None)
    finally:
        for table, old in zip((keras_agent.HYPERPARAMETERS, keras_agent.CRITIC_OPTIONS), saved):
            table.clear()
            table.update(old)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--configs", nargs="+", default=["2.5e-4:uniform_symlog", "1e-3:uniform_symlog"])
    parser.add_argument("--scales", nargs="+", type=float, default=[1.0, 1e6])
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--every", type=int, default=10, help="print every N-th update")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    results = {"command": " ".join(["python benchmarks/agents/critic_transient.py", *sys.argv[1:]]), "runs": {}}
    for config in args.configs:
        lr, _, scheme = config.partition(":")
        for scale in args.scales:
            record = run(args.env, float(lr), scheme or "uniform_symlog", scale, args.steps, args.seed)
            final = [r for s, r in record["episodes"] if s > 0.9 * args.steps]
            name = f"{config} x{scale:g}"
            results["runs"][name] = record
            print(f"{name}: update, step, explained variance, symlog error, relative bias")
            for i, (step, explained, error, bias) in enumerate(record["critic"]):
                if i % args.every == 0 or i == len(record["critic"]) - 1:
                    print(f"  {i:4d} {step:7d} {explained:7.3f} {error:7.3f} {bias:7.3f}")
            print(f"  final return {np.mean(final):.1f}", flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(results, f)
    return results


if __name__ == "__main__":
    main()
