"""Times sheeprl's own DreamerV3 training with its critic and with multicritic swapped in.

sheeprl 0.8.4's DreamerV3 through its CLI entry (`run_algorithm`), the
settings of `examples/sheeprl_critic.py` (dummy environment, CPU, tiny
sizes) with `--steps` policy steps: as sheeprl ships it (`stock`) and with
the README's swap (`swap`: `sheeprl_critic` + `sheeprl_modules` as critic
and target critic), in alternating order in one process (stock, swap, swap,
stock, ...), medians of the wall times. The time to import Keras and
multicritic, which a swapped run adds once per process, is measured apart in
a fresh interpreter that has imported what a sheeprl run imports first.

    KERAS_BACKEND=torch python benchmarks/peers/host_training.py --steps 256 --repeats 3 \
        --json benchmarks/results/results_host_training.json

Needs the interop session's packages (`sheeprl==0.8.4` and its
dependencies).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "torch")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _example():
    spec = importlib.util.spec_from_file_location("sheeprl_critic_example",
                                                  os.path.join(ROOT, "examples", "sheeprl_critic.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def import_seconds() -> float:
    """Seconds a fresh interpreter takes to import Keras and multicritic on top of what a sheeprl DreamerV3 run
    has imported already (sheeprl's CLI and DreamerV3 modules, and with them PyTorch, Lightning and dynamo)."""
    code = ("import sheeprl.cli, sheeprl.algos.dreamer_v3.dreamer_v3, time; t = time.perf_counter(); "
            "import keras, multicritic.interop.sheeprl; print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "KERAS_BACKEND": "torch"})
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=256, help="sheeprl's algo.total_steps")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    example = _example()
    overrides = [f"algo.total_steps={args.steps}"]
    times = {"stock": [], "swap": []}
    example.run(False, overrides)  # warm-up: sheeprl's and Hydra's first-run costs
    example.run(True, overrides)
    for r in range(args.repeats):
        for name in (("stock", "swap") if r % 2 == 0 else ("swap", "stock")):
            start = time.perf_counter()
            example.run(name == "swap", overrides)
            times[name].append(time.perf_counter() - start)
    stock, swap = statistics.median(times["stock"]), statistics.median(times["swap"])
    record = {"host": "sheeprl 0.8.4 DreamerV3 (dummy env, examples/sheeprl_critic.py settings)",
              "steps": args.steps, "repeats": args.repeats, "stock_s": stock, "swap_s": swap,
              "swap_over_stock": swap / stock, "stock_s_all": times["stock"], "swap_s_all": times["swap"],
              "keras_import_s": import_seconds()}
    print(f"sheeprl DreamerV3, {args.steps} steps: stock {stock:.2f} s, swap {swap:.2f} s, "
          f"swap / stock {swap / stock:.3f}; importing Keras + multicritic {record['keras_import_s']:.2f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([record], f, indent=1)


if __name__ == "__main__":
    main()
