"""Benchmarks: multicritic's step against hand-written native steps and the peers' own code."""

import math


def fastest_for(table, batch):
    """The entry of `table` (`{measured batch: variant}`) measured at the batch nearest `batch` (log scale)."""
    return dict(table[min(table, key=lambda measured: abs(math.log(measured / batch)))])
