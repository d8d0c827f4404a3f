"""multicritic's own benchmarks: the train step, its memory, ensembles, scaling, export latency, the demo grids."""
