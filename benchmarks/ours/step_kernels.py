"""Counts the kernels of multicritic's compiled train step and of the native compiled step.

XLA (JAX, TensorFlow): each step's optimised HLO is dumped (`XLA_FLAGS=--xla_dump_to`), one process per
implementation, and the step's entry computation is counted by opcode. On a GPU each fusion, custom call (a
cuBLAS GEMM) and other non-trivial instruction is about one kernel launch, which is what a small step's time
is bound by there; on a CPU fusions are loops over memory. PyTorch: the inductor code of the compiled step
(whole, ours; the native step's `torch.compile`) is counted the same way, by what its `call` launches:
generated kernels (`cpp_fused_*` on a CPU, Triton kernels on a GPU) and library kernels (`extern_kernels.*`,
ATen fallbacks).

    python benchmarks/ours/step_kernels.py --backend jax --batch 256 4096
    python benchmarks/ours/step_kernels.py --backend tensorflow --batch 4096 --json out.json
    python benchmarks/ours/step_kernels.py --backend torch --batch 256

Each backend counts `multicritic` (the default `metrics="all"`), `multicritic_core` (`metrics="core"`,
returning what the native steps return) and the native compiled step (`native` for JAX, `native_xla` for
TensorFlow, `native_compiled` for PyTorch). `--by-source` also lists where the counts of `multicritic_core`
and the native step differ, by the source op each instruction was traced from (XLA's op_name metadata);
the JSON holds both breakdowns.

`--profile` (JAX) also times them: each step runs `--profile-steps` times under `jax.profiler` and each
instruction's time a step (the trace's events, by their `hlo_op`) is summed by source, printed where ours
and the native step differ most, with the wall time of a step run without the profiler. On a GPU an
instruction's events are its kernels; on a CPU, thunks that may run side by side on the host's threads (their
sum can exceed the wall time).

    python benchmarks/ours/step_kernels.py --backend jax --batch 256 --profile
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, ROOT)

PAIRS = {
    "jax": ("multicritic", "multicritic_core", "native"),
    "tensorflow": ("multicritic", "multicritic_core", "native_xla"),
    "torch": ("multicritic", "multicritic_core", "native_compiled"),
}
# The two that `--by-source` and `--profile` set side by side.
COMPARED = (1, 2)
# Entry instructions that launch nothing: arguments, constants, views and tuples.
FREE = {"parameter", "constant", "bitcast", "tuple", "get-tuple-element", "copy-start", "copy-done"}


def _run_step(backend, size, batch, impl, profile_steps=0, profile_to=None):
    """(In a child process whose XLA_FLAGS dump HLO.) Builds `impl` and runs two steps; with `profile_steps`,
    writes `profile_to` (JSON): the wall time of a step and, from a profile of that many more, each
    instruction's time a step by module."""
    from benchmarks.ours.train_step import _inputs, _sync, make_impls
    from multicritic import get_model_dims

    impls, _ = make_impls(backend, size, batch, [impl])
    dims = get_model_dims(size)
    data = _inputs(backend, batch, dims["gru_units"], dims["num_z_categoricals"], dims["num_z_classes"], seed=0)

    def run(steps):
        for _ in range(steps):
            metrics = impls[impl](*data)
        _sync(backend, metrics)

    run(2)
    if backend == "torch":
        with open(profile_to, "w") as f:
            json.dump(inductor_launches(), f)
        return
    if not profile_steps:
        return
    import jax

    start = time.perf_counter()
    run(profile_steps)
    wall_us = (time.perf_counter() - start) / profile_steps * 1e6
    result = {"wall_us": wall_us, "op_us": {}}
    try:  # a machine without the profiler's libraries (CUPTI on a GPU) still gets its counts and wall time
        with tempfile.TemporaryDirectory() as folder:
            with jax.profiler.trace(folder, create_perfetto_trace=True):
                run(profile_steps)
            trace = next(pathlib.Path(folder).rglob("*.trace.json.gz"))
            result["op_us"] = op_times(json.loads(gzip.decompress(trace.read_bytes())), profile_steps)
    except Exception as e:  # noqa: BLE001 (reported in the record and the table)
        result["error"] = f"{type(e).__name__}: {e}"
    with open(profile_to, "w") as f:
        json.dump(result, f)


# What an inductor wrapper's `call` launches: its generated kernels (C++ on a CPU, `.run(` of Triton on a
# GPU), library kernels and ATen fallbacks.
_LAUNCH = re.compile(
    r"^\s*(?:\w+ = )?(?:(cpp_fused_\w+)\(|(triton_\w+)\.run\(|(extern_kernels\.\w+)\(|"
    r"(torch\.ops\.\w+\.\w+)[.(])"
)


def inductor_launches():
    """`{"ops": {kind: count}, "sources": {kernel: count}}` of the `call` functions of every graph inductor
    compiled in this process (kernel names without their numeric suffix)."""
    import inspect

    from torch._inductor.codecache import PyCodeCache

    ops, sources = collections.Counter(), collections.Counter()
    for module in list(PyCodeCache.modules):
        try:
            code = inspect.getsource(module.call)
        except (AttributeError, OSError, TypeError):
            continue
        for line in code.splitlines():
            m = _LAUNCH.match(line)
            if m:
                cpp, triton, extern, fallback = m.groups()
                kind = "generated" if (cpp or triton) else "library" if extern else "fallback"
                ops[kind] += 1
                sources[re.sub(r"_\d+$", "", cpp or triton or extern or fallback)] += 1
    return {"ops": dict(ops), "sources": dict(sources)}


def op_times(trace, steps):
    """`{module: {instruction: microseconds a step}}` from a perfetto trace's complete events that name the
    HLO instruction they ran (`args.hlo_op`; a GPU kernel's and a CPU thunk's events do)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    out = collections.defaultdict(lambda: collections.defaultdict(float))
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") == "X" and "hlo_op" in args:
            out[args.get("hlo_module", "?")][args["hlo_op"]] += e.get("dur", 0.0) / steps
    return {module: dict(ops) for module, ops in out.items()}


def step_op_times(op_us, name):
    """The step module's `{instruction: us}` from `op_times`' modules: those named `name`, or `name` with a
    suffix a runtime may add (`jit_step(3)`, `jit_step.1`)."""
    out = collections.defaultdict(float)
    for module, ops in op_us.items():
        if module == name or module.startswith((f"{name}(", f"{name}.")):
            for op, us in ops.items():
                out[op] += us
    return dict(out)


def _entry_instructions(hlo_text):
    """`(instruction, opcode, op_name)` of each instruction of the entry computation that launches work;
    op_name is the traced source op XLA's metadata names ("" where it names none)."""
    entry = hlo_text[hlo_text.index("\nENTRY") :]
    out = []
    for line in entry.splitlines():
        m = re.match(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*? ([a-z][\w-]*)\(", line)
        if m and m.group(2) not in FREE:
            name = re.search(r'op_name="([^"]*)"', line)
            out.append((m.group(1), m.group(2), name.group(1) if name else ""))
    return out


def _source(op_name):
    """An op_name without the outer `jit(...)` and with at most three parts ("?" for none)."""
    parts = op_name.split("/")[1:4] if op_name.startswith("jit(") else op_name.split("/")[:3]
    return "/".join(parts) or "?"


def module_name(hlo_text):
    """The name an HLO module's text gives itself (`HloModule jit_step, ...`)."""
    return re.match(r"HloModule ([\w.\-]+)", hlo_text).group(1)


def entry_ops(hlo_text):
    """`{opcode: count}` of the entry computation's instructions that launch work."""
    return collections.Counter(op for _, op, _ in _entry_instructions(hlo_text))


def entry_sources(hlo_text):
    """`{source: count}` of the same instructions by the source op each was traced from: its op_name without
    the outer `jit(...)` and with at most three parts ("jvp()/reduce_sum", "adam/jit(_where)/select_n";
    "?" where XLA's metadata names none). What a step has beyond another shows as the sources it has more of."""
    return collections.Counter(_source(name) for _, _, name in _entry_instructions(hlo_text))


def source_times(hlo_text, op_us):
    """`{source: microseconds a step}`: `op_us` (`{instruction: us}`, the step module's profile) summed by
    the source op of each entry instruction; time of instructions outside the entry computation (in a loop's
    body, say) under "(not in entry)"."""
    sources = {name: _source(op_name) for name, _, op_name in _entry_instructions(hlo_text)}
    times = collections.defaultdict(float)
    for name, us in op_us.items():
        times[sources.get(name, "(not in entry)")] += us
    return dict(times)


def source_table(records):
    """Per batch: the sources whose counts differ between the two steps, the most extra first."""
    names = [PAIRS[records[0]["backend"]][i] for i in COMPARED]
    lines = ["| backend | batch | source | " + " | ".join(names) + " |", "|---|---:|---|---:|---:|"]
    for batch in dict.fromkeys(r["batch"] for r in records):
        ours, native = (r["sources"] for name in names for r in records if r["batch"] == batch and r["impl"] == name)
        differ = [k for k in set(ours) | set(native) if ours.get(k, 0) != native.get(k, 0)]
        for k in sorted(differ, key=lambda k: (native.get(k, 0) - ours.get(k, 0), k)):
            lines.append(f"| {records[0]['backend']} | {batch} | `{k}` | {ours.get(k, 0)} | {native.get(k, 0)} |")
    return "\n".join(lines)


def step_module(folder):
    """The optimised HLO of the largest module a process compiled (its train step)."""
    files = sorted(pathlib.Path(folder).glob("*after_optimizations.txt"), key=lambda p: p.stat().st_size)
    if not files:
        raise SystemExit(f"no optimised HLO was dumped in {folder}")
    return files[-1].read_text()


def count(backend, size, batch, impl, profile_steps=0):
    """`(ops, sources, profile)` of `impl`'s step; `profile` (with `profile_steps`): `{"wall_us", "op_us":
    {source: us}, "total_us"}`, else None."""
    with tempfile.TemporaryDirectory() as folder:
        env = dict(
            os.environ,
            KERAS_BACKEND=backend,
            TF_CPP_MIN_LOG_LEVEL="3",
            XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={folder} --xla_dump_hlo_as_text",
        )
        profile_to = os.path.join(folder, "profile.json")
        cmd = [sys.executable, __file__, "--child", impl, "--backend", backend, "--size", size, "--batch", str(batch)]
        if profile_steps:
            cmd += ["--profile", "--profile-steps", str(profile_steps)]
        if profile_steps or backend == "torch":
            cmd += ["--profile-to", profile_to]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{impl} failed:\n{out.stderr[-2000:]}")
        if backend == "torch":
            with open(profile_to) as f:
                counted = json.load(f)
            return collections.Counter(counted["ops"]), collections.Counter(counted["sources"]), None
        module = step_module(folder)
        profile = None
        if profile_steps:
            with open(profile_to) as f:
                timed = json.load(f)
            op_us = step_op_times(timed["op_us"], module_name(module))
            profile = {
                "wall_us": timed["wall_us"],
                "total_us": sum(op_us.values()),
                "op_us": dict(sorted(source_times(module, op_us).items(), key=lambda kv: -kv[1])),
            }
            if "error" in timed or not op_us:
                profile["error"] = timed.get("error", f"the trace named no instruction of {module_name(module)}")
        return entry_ops(module), entry_sources(module), profile


def launches(record):
    """A record's launches: its entry instructions (XLA) or its `call`'s kernels (inductor)."""
    return sum(record["ops"].values())


def ratios(records):
    """`{(batch, impl): launches / the native step's}` (the native step: the last of `PAIRS`)."""
    native = {r["batch"]: launches(r) for r in records if r["impl"] == PAIRS[r["backend"]][-1]}
    return {(r["batch"], r["impl"]): launches(r) / native[r["batch"]] for r in records}


def table(records):
    lines = [
        "| backend | size | batch | step | launches | x native | fusions / generated | custom calls / library "
        "| other |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    ratio = ratios(records)
    for r in records:
        ops = r["ops"]
        fusions, calls = (
            ops.get("fusion", 0) + ops.get("generated", 0),
            ops.get("custom-call", 0) + ops.get("library", 0),
        )
        lines.append(
            f"| {r['backend']} | {r['size']} | {r['batch']} | {r['impl']} | {launches(r)} | "
            f"{ratio[(r['batch'], r['impl'])]:.2f} | {fusions} | {calls} | {launches(r) - fusions - calls} |"
        )
    return "\n".join(lines)


def time_table(records, rows=20):
    """Per batch: the wall and profiled time of a step, then the sources whose time differs most (ours
    minus native, the largest first), in microseconds a step."""
    names = [PAIRS[records[0]["backend"]][i] for i in COMPARED]
    lines = ["| backend | batch | source | " + " | ".join(f"{n} us" for n in names) + " |", "|---|---:|---|---:|---:|"]
    for batch in dict.fromkeys(r["batch"] for r in records):
        ours, native = (r["profile"] for name in names for r in records if r["batch"] == batch and r["impl"] == name)
        backend = records[0]["backend"]
        for name, profile in zip(names, (ours, native)):
            if "error" in profile:
                lines.append(f"| {backend} | {batch} | {name}: not profiled ({profile['error'][:80]}) | | |")
        for label, key in (("wall time a step", "wall_us"), ("instructions' time, summed", "total_us")):
            lines.append(f"| {backend} | {batch} | {label} | {ours[key]:.1f} | {native[key]:.1f} |")
        a, b = ours["op_us"], native["op_us"]
        differ = sorted(set(a) | set(b), key=lambda k: (-(a.get(k, 0.0) - b.get(k, 0.0)), k))
        for k in differ[:rows]:
            lines.append(f"| {backend} | {batch} | `{k}` | {a.get(k, 0.0):.1f} | {b.get(k, 0.0):.1f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "jax"), choices=sorted(PAIRS))
    parser.add_argument("--size", default="XS")
    parser.add_argument("--batch", type=int, nargs="+", default=[256])
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument(
        "--by-source",
        action="store_true",
        help="also print, per batch, the source ops whose launch counts differ between the steps",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="(JAX) also time each step's instructions under jax.profiler, summed by source",
    )
    parser.add_argument("--profile-steps", type=int, default=20, help="steps profiled (and timed) per step")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.profile and args.backend != "jax":
        parser.error(f"--profile: got --backend {args.backend}, expected jax (jax.profiler's trace)")
    if args.profile_steps < 1:
        parser.error(f"--profile-steps: got {args.profile_steps}, expected a positive number of steps")
    profile_steps = args.profile_steps if args.profile else 0
    if args.child:
        return _run_step(args.backend, args.size, args.batch[0], args.child, profile_steps, args.profile_to)
    records = []
    for batch in args.batch:
        for impl in PAIRS[args.backend]:
            ops, sources, profile = count(args.backend, args.size, batch, impl, profile_steps)
            record = {
                "backend": args.backend,
                "size": args.size,
                "batch": batch,
                "impl": impl,
                "ops": dict(ops.most_common()),
                "sources": dict(sources.most_common()),
            }
            if profile is not None:
                record["profile"] = profile
            records.append(record)
    print(table(records))
    if args.by_source:
        print()
        print(source_table(records))
    if args.profile:
        print()
        print(time_table(records))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
