"""Times a host's own DreamerV3 training with its critic and with multicritic swapped in.

`--host sheeprl`: sheeprl 0.8.4's DreamerV3 through its CLI entry
(`run_algorithm`), the settings of `examples/sheeprl_critic.py` (dummy
environment, CPU, tiny sizes) with `--steps` policy steps: as sheeprl ships it
(`stock`) and with the README's swap (`swap`: `sheeprl_critic` +
`sheeprl_modules` as critic and target critic).

`--host rllib`: RLlib 2.60's DreamerV3 (PyTorch) on CartPole-v1, model size
nano, env runner and learner in this process, `--iterations` calls of
`algo.train()` on a freshly built algorithm: as RLlib ships it and with the
swap of `docs/hosts/rllib.md` (the RL module's critic replaced by
`rllib_torch_module` holding its weights, before the learner builds its
optimizers). Timed: the build and the calls, not `algo.stop()`, which waits
for a timer of Ray's (`rllib_run`).

Runs alternate (stock, swap, swap, stock, ...) in one process; medians of the
wall times. The time to import Keras and multicritic, which a swapped run adds
once per process, is measured apart in a fresh interpreter that has imported
what the host's run imports first.

    KERAS_BACKEND=torch python benchmarks/peers/host_training.py --steps 1024 --repeats 3 \
        --json benchmarks/results/results_host_training.json
    KERAS_BACKEND=torch python benchmarks/peers/host_training.py --host rllib --iterations 100 --repeats 3 \
        --json benchmarks/results/results_host_training_rllib.json

Needs the interop session's packages (`sheeprl==0.8.4`, `ray[rllib]==2.60.0`
and their dependencies).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "torch")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


# What a host's DreamerV3 run has imported before a swap imports Keras and multicritic.
HOST_IMPORTS = {
    "sheeprl": "sheeprl.cli, sheeprl.algos.dreamer_v3.dreamer_v3",
    "rllib": "ray.rllib.algorithms.dreamerv3, ray.rllib.algorithms.dreamerv3.torch.dreamerv3_torch_learner",
}


def import_seconds(host: str = "sheeprl") -> float:
    """Seconds a fresh interpreter takes to import Keras and multicritic on top of what the host's DreamerV3
    run has imported already (and with it PyTorch and, for sheeprl, Lightning and dynamo)."""
    code = (
        f"import {HOST_IMPORTS[host]}, time; t = time.perf_counter(); "
        "import keras, multicritic.interop; print(time.perf_counter() - t)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "KERAS_BACKEND": "torch"},
    )
    return float(out.stdout.strip().splitlines()[-1])


def rllib_run(swap: bool, iterations: int) -> float:
    """Seconds to build a fresh RLlib DreamerV3 (CartPole-v1, nano), with its own critic or (`swap`)
    multicritic's in its place, and run `iterations` calls of `algo.train()`. `algo.stop()` is left out: it
    ends on a periodic timer of the runtime's (measured: it took whatever brought the whole run to the next
    multiple of about 0.72 s, 0.08-0.69 s, whichever critic ran)."""
    from ray.rllib.algorithms.dreamerv3 import DreamerV3Config, dreamerv3_rl_module

    from multicritic.interop.rllib import rllib_torch_critic, rllib_torch_module
    from multicritic.model.sizes import get_model_dims

    stock = dreamerv3_rl_module.CriticNetwork

    def swapped(**kwargs):
        theirs = stock(**kwargs)
        dims = get_model_dims(kwargs["model_size"])
        return rllib_torch_module(
            rllib_torch_critic(
                theirs.state_dict(),
                gru_units=dims["gru_units"],
                num_z_categoricals=dims["num_z_categoricals"],
                num_z_classes=dims["num_z_classes"],
            )
        )

    start = time.perf_counter()
    if swap:
        dreamerv3_rl_module.CriticNetwork = swapped
    try:
        config = (
            DreamerV3Config()
            .environment("CartPole-v1")
            .training(model_size="nano", training_ratio=64, batch_size_B=4, batch_length_T=16, horizon_H=5)
            .env_runners(num_env_runners=0)
            .learners(num_learners=0)
            .debugging(seed=0)
        )
        algo = config.build_algo()
    finally:
        dreamerv3_rl_module.CriticNetwork = stock
    critic = algo.learner_group._learner.module["default_policy"].unwrapped().critic
    if swap != type(critic).__module__.startswith("multicritic"):
        raise RuntimeError(f"the learner's critic is {type(critic)}: the swap did not take place as asked")
    for _ in range(iterations):
        algo.train()
    seconds = time.perf_counter() - start
    algo.stop()
    return seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", choices=sorted(HOST_IMPORTS), default="sheeprl")
    parser.add_argument("--steps", type=int, default=256, help="sheeprl's algo.total_steps")
    parser.add_argument("--iterations", type=int, default=100, help="RLlib's algo.train() calls")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.host == "sheeprl":
        from benchmarks import example as example_module

        example = example_module("sheeprl_critic")
        overrides = [f"algo.total_steps={args.steps}"]
        run = lambda swap: example.run(swap, overrides)  # noqa: E731
        host = "sheeprl 0.8.4 DreamerV3 (dummy env, examples/sheeprl_critic.py settings)"
        size = {"steps": args.steps}
    else:
        import ray

        # A cluster of this process only: no authentication token (`ray.init()` would write one to
        # `~/.ray/auth_token`, which then turns token authentication on for every later Ray cluster here).
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        run = lambda swap: rllib_run(swap, args.iterations)  # noqa: E731
        host = "RLlib 2.60 DreamerV3 (CartPole-v1, nano, training_ratio 64, B 4, T 16)"
        size = {"iterations": args.iterations}
    run(False)  # warm-up: the host's first-run costs
    run(True)
    times = {"stock": [], "swap": []}
    for r in range(args.repeats):
        for name in ("stock", "swap") if r % 2 == 0 else ("swap", "stock"):
            start = time.perf_counter()
            seconds = run(name == "swap")
            # sheeprl: the whole CLI run; RLlib: the run's own measure (without the teardown's timer wait).
            times[name].append(seconds if args.host == "rllib" else time.perf_counter() - start)
    stock, swap = statistics.median(times["stock"]), statistics.median(times["swap"])
    record = {
        "host": host,
        **size,
        "repeats": args.repeats,
        "stock_s": stock,
        "swap_s": swap,
        "swap_over_stock": swap / stock,
        "stock_s_all": times["stock"],
        "swap_s_all": times["swap"],
        "keras_import_s": import_seconds(args.host),
    }
    print(
        f"{host}: stock {stock:.2f} s, swap {swap:.2f} s, swap / stock {swap / stock:.3f}; "
        f"importing Keras + multicritic {record['keras_import_s']:.2f} s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump([record], f, indent=1)


if __name__ == "__main__":
    main()
