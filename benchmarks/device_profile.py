"""What a step asks of a GPU: its kernels a step and the GPU's busy time a step, from the frameworks' profilers.

`profile_step(backend, step, data, steps)` runs `steps` steps under the backend's profiler (PyTorch:
`torch.profiler` with CUDA activity; JAX: `jax.profiler`, a perfetto trace) and reads the device's events
from the trace: each kernel (and device memcpy / memset) is one launch, and the GPU's busy time is the union
of their intervals. Kernels inside a replayed CUDA graph are traced one by one, so a captured step counts the
kernels it runs, not its one graph launch. Without a GPU (or a profiler that records none) it returns None.

`launch_costs()` measures what one kernel costs the host and the GPU on this machine (PyTorch, CUDA): a
tiny kernel launched eagerly, and the same kernel inside a replayed CUDA graph. A step's floor is then
`max(busy time, kernels x the in-graph cost)`; how far a step is from it is its time over that floor.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import tempfile
import time

# Device event categories in PyTorch's Chrome trace.
_TORCH_DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")


def device_events(trace):
    """The complete events of a Chrome / perfetto trace that ran on a GPU: PyTorch's `kernel` / `gpu_memcpy` /
    `gpu_memset` categories, or any event of a process named `/device:GPU:*` (JAX)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    gpu_pids = {
        e.get("pid")
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "process_name"
        and str((e.get("args") or {}).get("name", "")).startswith("/device:GPU")
    }
    return [e for e in events if e.get("ph") == "X" and (e.get("cat") in _TORCH_DEVICE or e.get("pid") in gpu_pids)]


def busy_and_count(events, steps):
    """`(kernels a step, busy microseconds a step)`: the events' number and the union of their intervals
    (overlapping kernels of several streams count once), each divided by `steps`."""
    intervals = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in events)
    busy, end = 0.0, float("-inf")
    for start, stop in intervals:
        if start > end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    return len(intervals) / steps, busy / steps


def profile_step(backend, step, data, steps=20):
    """`{"kernels_per_step", "busy_us_per_step"}` of `step(*data)` on the GPU, or None (no GPU, TensorFlow,
    or a profiler that recorded no device event)."""
    try:
        if backend == "torch":
            trace = _torch_trace(step, data, steps)
        elif backend == "jax":
            trace = _jax_trace(step, data, steps)
        else:
            return None
    except Exception as e:  # noqa: BLE001 (a profiler missing its libraries: the timings still stand)
        return {"error": f"{type(e).__name__}: {e}"}
    if trace is None:
        return None
    events = device_events(trace)
    if not events:
        return None
    kernels, busy = busy_and_count(events, steps)
    return {"kernels_per_step": kernels, "busy_us_per_step": busy}


def _torch_trace(step, data, steps):
    import torch

    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(*data)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)


def _jax_trace(step, data, steps):
    import jax

    if not any(d.platform == "gpu" for d in jax.devices()):
        return None
    metrics = step(*data)
    jax.block_until_ready(metrics)
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            for _ in range(steps):
                metrics = step(*data)
            jax.block_until_ready(metrics)
        found = glob.glob(os.path.join(folder, "**", "*.trace.json.gz"), recursive=True)
        with open(found[0], "rb") as f:
            return json.loads(gzip.decompress(f.read()))


def launch_costs(kernels=2000):
    """`{"eager_us", "in_graph_us"}`: microseconds per tiny kernel launched eagerly (host-bound: the launch
    path) and inside a replayed CUDA graph (the GPU's per-kernel cost), or None without CUDA (PyTorch)."""
    import torch

    if not torch.cuda.is_available():
        return None
    x = torch.zeros(1, device="cuda")

    def launches():
        for _ in range(kernels):
            x.add_(1.0)

    launches()
    torch.cuda.synchronize()
    start = time.perf_counter()
    launches()
    torch.cuda.synchronize()
    eager = (time.perf_counter() - start) / kernels * 1e6
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launches()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        launches()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / kernels * 1e6)
    return {"eager_us": eager, "in_graph_us": best}
