"""The speed targets of the step, each measured in several rounds, to tell a ratio from the machine's noise.

A round runs each target's benchmark in a fresh process (`train_step.py` or
`ensemble.py`, one process per backend and benchmark, side by side in it as
those scripts time). Two-core machines are noisy: the same ratio moves by
several percent from one process to the next, so a target near its bound
is read from all rounds, not from one.

    python benchmarks/ours/targets.py --rounds 3 --json benchmarks/results/results_targets.json
    python benchmarks/ours/targets.py --only jax-256 tensorflow-4096 --rounds 3

Each record: the target, its bound, the ratio of every round (native time /
ours for a step, above 1: ours is faster; ours / native for an ensemble,
below 1: ours is faster), ours and the native time per round, and which
native way was the faster (TensorFlow: its plain graph or XLA; PyTorch:
eager or compiled, as the target names).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from benchmarks.render_tables import targets as rendered  # noqa: E402


def _step(backend, batch, bound, natives=("native",)):
    return {
        "benchmark": "train_step",
        "backend": backend,
        "batch": batch,
        "ours": "multicritic",
        "natives": natives,
        "bound": bound,
    }


def _ensemble(backend, batch, natives=("native",)):
    return {
        "benchmark": "ensemble",
        "backend": backend,
        "batch": batch,
        "ours": "ensemble",
        "natives": natives,
        "bound": 1.05,
    }


# name: what is timed and the bound its ratio must meet.
TARGETS = {
    "torch-8": _step("torch", 8, 0.85),
    **{f"torch-{b}": _step("torch", b, 1.0) for b in (256, 4096, 15360)},
    "torch-compiled-4096": _step("torch", 4096, 0.95, ("native_compiled",)),
    **{
        f"{backend}-{b}": _step(backend, b, 0.95, natives)
        for backend, natives in (("tensorflow", ("native", "native_xla")), ("jax", ("native",)))
        for b in (256, 4096, 15360)
    },
    **{
        f"{backend}-ensemble-{b}": _ensemble(backend, b, natives)
        for backend, natives in (("tensorflow", ("native", "native_xla")), ("torch", ("native",)), ("jax", ("native",)))
        for b in (256, 4096)
    },
}


def _command(benchmark, backend, batches, natives, options, json_path):
    script = os.path.join(HERE, f"{benchmark}.py")
    cmd = [
        sys.executable,
        script,
        "--backend",
        backend,
        "--batch",
        *map(str, batches),
        "--size",
        options["size"],
        "--repeats",
        str(options["repeats"]),
        "--json",
        json_path,
    ]
    if options["block_seconds"] is not None:
        cmd += ["--block-seconds", str(options["block_seconds"])]
    if benchmark == "train_step":
        return cmd + ["--impls", "multicritic", *natives]
    # An ensemble as a long run trains it: compiled (XLA on TensorFlow, the whole step on PyTorch).
    return cmd + ["--members", "5", "--jit-compile", "--impls", "ensemble", *natives]


def _ratio(target, ours, native):
    return ours / native if target["benchmark"] == "ensemble" else native / ours


def _meets(target, ratio):
    return ratio <= target["bound"] if target["benchmark"] == "ensemble" else ratio >= target["bound"]


def run(names, rounds, repeats, size="XS", block_seconds=None):
    """`{name: record}` over `rounds` rounds of the targets `names`, each benchmark timing `repeats` blocks
    of `block_seconds` (its own default: None) at the model size `size`."""
    options = {"size": size, "repeats": repeats, "block_seconds": block_seconds}
    groups = {}
    for name in names:
        t = TARGETS[name]
        key = (t["benchmark"], t["backend"])
        groups.setdefault(key, {"batches": [], "natives": set()})
        groups[key]["batches"].append(t["batch"])
        groups[key]["natives"].update(t["natives"])
    results = {
        name: {
            "target": name,
            **TARGETS[name],
            "natives": list(TARGETS[name]["natives"]),
            "ratios": [],
            "ours_ms": [],
            "native_ms": [],
            "native_impl": [],
        }
        for name in names
    }
    for r in range(rounds):
        for (benchmark, backend), group in groups.items():
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "out.json")
                cmd = _command(
                    benchmark, backend, sorted(set(group["batches"])), sorted(group["natives"]), options, path
                )
                env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                if out.returncode != 0:
                    print(out.stderr[-2000:], file=sys.stderr)
                    raise SystemExit(f"{benchmark} failed on {backend}")
                with open(path) as f:
                    records = json.load(f)
            ms = {(rec["batch"], rec["impl"]): rec["step_ms"] for rec in records if "batch" in rec}
            for name in names:
                t = TARGETS[name]
                if (t["benchmark"], t["backend"]) != (benchmark, backend):
                    continue
                native = min(t["natives"], key=lambda n: ms[(t["batch"], n)])
                res = results[name]
                res["ours_ms"].append(ms[(t["batch"], t["ours"])])
                res["native_ms"].append(ms[(t["batch"], native)])
                res["native_impl"].append(native)
                res["ratios"].append(_ratio(t, res["ours_ms"][-1], res["native_ms"][-1]))
            print(f"round {r + 1}/{rounds}: {benchmark} {backend} done", file=sys.stderr, flush=True)
    for res in results.values():
        res["median"] = statistics.median(res["ratios"])
        res["rounds_met"] = sum(_meets(res, x) for x in res["ratios"])
        res["repeats"], res["size"] = repeats, size
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--only",
        nargs="+",
        choices=sorted(TARGETS),
        metavar="TARGET",
        help=f"a subset of the targets: {', '.join(TARGETS)}",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=7, help="timed blocks of each implementation per round")
    parser.add_argument("--size", default="XS", help="the critic's model size (the targets are set at XS)")
    parser.add_argument("--block-seconds", type=float, help="length of one timed block (each benchmark's default)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1:
        parser.error(f"--rounds and --repeats: got {args.rounds} and {args.repeats}, expected at least 1 each")
    names = args.only or list(TARGETS)
    results = run(names, args.rounds, args.repeats, args.size, args.block_seconds)
    command = [
        "python benchmarks/ours/targets.py",
        "--only",
        *names,
        "--rounds",
        str(args.rounds),
        "--repeats",
        str(args.repeats),
    ]
    command += [] if args.size == "XS" else ["--size", args.size]
    command += [] if args.block_seconds is None else ["--block-seconds", str(args.block_seconds)]
    data = {"command": " ".join(command), "targets": list(results.values())}
    print("\n".join(rendered([data])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)


if __name__ == "__main__":
    main()
