"""Benchmarks: multicritic's step against hand-written native steps and the peers' own code."""

import faulthandler
import itertools
import math
import os
import signal

if os.environ.get("MULTICRITIC_BENCH_KEEP_GOING") == "1":
    # The GPU script's time limits stop a part with SIGTERM: the stack shows where it was.
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
