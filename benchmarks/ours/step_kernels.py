"""Counts the top-level operations of multicritic's XLA-compiled train step and of the native step.

XLA dumps each step's optimised HLO (`XLA_FLAGS=--xla_dump_to`), one process per implementation; the
step's entry computation is counted by opcode. On a GPU each fusion, custom call (a cuBLAS GEMM) and
other non-trivial instruction is about one kernel launch, which is what a small step's time is bound by
there; on a CPU fusions are loops over memory.

    python benchmarks/ours/step_kernels.py --backend jax --batch 256 4096
    python benchmarks/ours/step_kernels.py --backend tensorflow --batch 4096 --json out.json

JAX compares `multicritic` with `native`; TensorFlow its XLA step (`multicritic`) with `native_xla`.
`--by-source` also lists where the counts differ, by the source op each instruction was traced from (XLA's
op_name metadata); the JSON holds both breakdowns.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
sys.path.insert(0, ROOT)

PAIRS = {"jax": ("multicritic", "native"), "tensorflow": ("multicritic", "native_xla")}
# Entry instructions that launch nothing: arguments, constants, views and tuples.
FREE = {"parameter", "constant", "bitcast", "tuple", "get-tuple-element", "copy-start", "copy-done"}


def _run_step(backend, size, batch, impl):
    """(In a child process whose XLA_FLAGS dump HLO.) Builds `impl` and runs two steps."""
    from benchmarks.ours.train_step import _inputs, _sync, make_impls
    from multicritic import get_model_dims

    impls, _ = make_impls(backend, size, batch, [impl])
    dims = get_model_dims(size)
    data = _inputs(backend, batch, dims["gru_units"], dims["num_z_categoricals"], dims["num_z_classes"], seed=0)
    for _ in range(2):
        metrics = impls[impl](*data)
    _sync(backend, metrics)


def _entry_instructions(hlo_text):
    """`(opcode, op_name)` of each instruction of the entry computation that launches work; op_name is the
    traced source op XLA's metadata names ("" where it names none)."""
    entry = hlo_text[hlo_text.index("\nENTRY"):]
    out = []
    for line in entry.splitlines():
        m = re.match(r"^\s*(?:ROOT )?%?[\w.\-]+ = .*? ([a-z][\w-]*)\(", line)
        if m and m.group(1) not in FREE:
            name = re.search(r'op_name="([^"]*)"', line)
            out.append((m.group(1), name.group(1) if name else ""))
    return out


def entry_ops(hlo_text):
    """`{opcode: count}` of the entry computation's instructions that launch work."""
    return collections.Counter(op for op, _ in _entry_instructions(hlo_text))


def entry_sources(hlo_text):
    """`{source: count}` of the same instructions by the source op each was traced from: its op_name without
    the outer `jit(...)` and with at most three parts ("jvp()/reduce_sum", "adam/jit(_where)/select_n";
    "?" where XLA's metadata names none). What a step has beyond another shows as the sources it has more of."""
    counts = collections.Counter()
    for _, name in _entry_instructions(hlo_text):
        parts = name.split("/")[1:4] if name.startswith("jit(") else name.split("/")[:3]
        counts["/".join(parts) or "?"] += 1
    return counts


def source_table(records):
    """Per batch: the sources whose counts differ between the two steps, the most extra first."""
    lines = ["| backend | batch | source | " + " | ".join(PAIRS[records[0]["backend"]]) + " |",
             "|---|---:|---|---:|---:|"]
    for batch in dict.fromkeys(r["batch"] for r in records):
        ours, native = (r["sources"] for r in records if r["batch"] == batch)
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


def count(backend, size, batch, impl):
    with tempfile.TemporaryDirectory() as folder:
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
                   XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={folder} --xla_dump_hlo_as_text")
        cmd = [sys.executable, __file__, "--child", impl, "--backend", backend, "--size", size, "--batch", str(batch)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{impl} failed:\n{out.stderr[-2000:]}")
        module = step_module(folder)
        return entry_ops(module), entry_sources(module)


def table(records):
    lines = ["| backend | size | batch | step | launches | fusions | custom calls | other |",
             "|---|---|---:|---|---:|---:|---:|---:|"]
    for r in records:
        ops = r["ops"]
        fusions, calls = ops.get("fusion", 0), ops.get("custom-call", 0)
        lines.append(f"| {r['backend']} | {r['size']} | {r['batch']} | {r['impl']} | {sum(ops.values())} | {fusions} | "
                     f"{calls} | {sum(ops.values()) - fusions - calls} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "jax"), choices=sorted(PAIRS))
    parser.add_argument("--size", default="XS")
    parser.add_argument("--batch", type=int, nargs="+", default=[256])
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--by-source", action="store_true",
                        help="also print, per batch, the source ops whose launch counts differ between the steps")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _run_step(args.backend, args.size, args.batch[0], args.child)
    records = []
    for batch in args.batch:
        for impl in PAIRS[args.backend]:
            ops, sources = count(args.backend, args.size, batch, impl)
            records.append({"backend": args.backend, "size": args.size, "batch": batch, "impl": impl,
                            "ops": dict(ops.most_common()), "sources": dict(sources.most_common())})
    print(table(records))
    if args.by_source:
        print()
        print(source_table(records))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
