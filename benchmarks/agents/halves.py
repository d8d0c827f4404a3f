"""Runs in two halves on one host checkpoint, resumable: the shared loop of the agent drivers that train a host's
own agent (`sheeprl_dreamer.py`, `official_dreamer.py`).

Each run (a variant and a seed) is two halves on one logdir: the second resumes from the host's checkpoint of
the first. A half's record goes into the results file as soon as it ends, so a driver stopped at any point
starts again where it was: a run with one half recorded and its checkpoint still there runs its second half;
one whose checkpoint is gone, or whose first half never ended, runs again whole.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Sequence, Tuple


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, flush=True)


def resume(results: dict, path: Optional[str], same: Sequence[str]) -> dict:
    """`results` with the runs of the file at `path` where it was made with the same values of the keys `same`
    (else with none: a changed setting starts over)."""
    if path and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if all(old.get(key) == results[key] for key in same):
            results["runs"] = old["runs"]
    return results


def save(results: dict, path: Optional[str]) -> None:
    """Writes `results` to `path` whole or not at all (a stopped driver leaves the last complete file)."""
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(path + ".tmp", path)


def run_all(
    results: dict,
    path: Optional[str],
    runs: Sequence[Tuple[str, int]],
    logdir: Callable[[str, int], str],
    resumable: Callable[[str], bool],
    half: Callable[..., dict],
    slots: Sequence,
) -> dict:
    """Runs each `(variant, seed)` of `runs` in two halves, `len(slots)` runs at a time, recording each half's
    record in `results["runs"]["variant/seed"]` and saving to `path` as it ends.

    Args:
        logdir: `(variant, seed) -> folder`: the run's host logdir.
        resumable: `folder -> bool`: whether the host's checkpoint of a first half is there to resume from.
        half: `(variant, seed, half, slot) -> record` (a dict with `wall_s`): runs one half.
        slots: what each worker hands its halves (a CPU to pin to, or None), one per worker.
    """
    free = queue.Queue()
    for slot in slots:
        free.put(slot)

    def one(variant, seed):
        key = f"{variant}/{seed}"
        halves = results["runs"].setdefault(key, [])
        folder = logdir(variant, seed)
        if len(halves) == 1 and not resumable(folder):
            halves.clear()  # its checkpoint is gone: run it again whole
        if not halves and os.path.isdir(folder):
            shutil.rmtree(folder)  # an interrupted first half's files: the second half takes the one checkpoint
        slot = free.get()
        try:
            for number in range(len(halves), 2):
                halves.append(half(variant, seed, number, slot))
                save(results, path)
                log(f"{key} half {number} done in {halves[-1]['wall_s']:.0f} s")
        finally:
            free.put(slot)

    with ThreadPoolExecutor(len(slots)) as pool:
        for future in [pool.submit(one, v, s) for v, s in runs]:
            future.result()
    save(results, path)
    return results
