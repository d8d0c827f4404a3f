"""Benchmarks: multicritic's step against hand-written native steps and the peers' own code."""

import faulthandler
import itertools
import math
import os
import signal

# The GPU script's setting (`MULTICRITIC_BENCH_KEEP_GOING=1`): one command on a lent machine should bring back
# what did run. An implementation that fails its warm-up is reported and left out (`train_step.time_side_by_side`),
# and a part its time limit stops with SIGTERM prints where it was.
KEEP_GOING = os.environ.get("MULTICRITIC_BENCH_KEEP_GOING") == "1"
if KEEP_GOING:
    faulthandler.register(signal.SIGTERM, chain=True)


def variants(native):
    """Every combination of a native module's `VARIANTS` (the variants of its step, computing the same math), as
    `make_step` keywords."""
    return [dict(zip(native.VARIANTS, values)) for values in itertools.product(*native.VARIANTS.values())]


def options_for(native, batch):
    """The `make_step` keywords of a native module's fastest variant for `batch`: its `FASTEST` entry
    (`{measured batch: variant}`, from `benchmarks/ours/baseline_variants.py`) at the batch nearest `batch` (log
    scale)."""
    table = native.FASTEST
    return dict(table[min(table, key=lambda measured: abs(math.log(measured / batch)))])


def example(name):
    """`examples/<name>.py` loaded as a module (the examples are scripts, not a package)."""
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(f"example_{name}", os.path.join(root, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
