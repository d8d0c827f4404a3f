"""Renders the documentation's performance and accuracy tables from the result files in `benchmarks/results/`.

A generated table sits in a Markdown page (README.md, docs/**/*.md) between two markers: the opening one
names the table's renderer, its result file(s) and options,

    <!-- table: train_step results_train_step_latest.json -->
    | backend | ... |
    <!-- /table -->

and everything between them is this script's output. Pages are never edited by hand between the markers:

    python benchmarks/render_tables.py            # rewrite every generated table from its file
    python benchmarks/render_tables.py --check    # list the tables that differ from their files (exit 1)

`tests/docs/test_tables.py` runs the check. To add a table: put the markers in a page, naming an existing
renderer with a new file (`<!-- table: train_step results_train_step_compiled.json backends=torch -->`; the
option `part=NAME` takes one part of a merged file such as `results_gpu.json`), or
register a new renderer below (a function of the loaded JSON files and the marker's `key=value` options,
returning the table's Markdown lines), then run the script.

It needs numpy and the package itself (the registries' tables), which every test session has, so the check
runs in every test session.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from typing import Callable, Dict, List

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the agents' summaries are `benchmarks.agents.plot_curves`'s
RESULTS = ROOT / "benchmarks" / "results"
PAGES = ("README.md", "docs/**/*.md")

MARKER = re.compile(r"^<!-- table: (?P<spec>[^>]*?) -->\n(?P<body>.*?)^<!-- /table -->$", re.M | re.S)

RENDERERS: Dict[str, Callable[..., List[str]]] = {}


def table(name: str, files: bool = True):
    """Registers a renderer under `name`: `fn(files: list of loaded JSON, **options: str) -> Markdown lines`
    (`files=False`: a table of the source tree, whose marker names no result file)."""

    def register(fn):
        RENDERERS[name] = fn
        fn.needs_files = files
        return fn

    return register


# ---------------------------------------------------------------- helpers

SIZES = ("nano", "micro", "mini", "XXS", "XS", "S", "M", "L", "XL")
BACKENDS = ("jax", "tensorflow", "torch")
FRAMEWORKS = {"torch": "PyTorch", "tensorflow": "TensorFlow", "jax": "JAX"}


def _ints(text: str | None):
    return None if text is None else [int(x) for x in text.split(",")]


def _names(text: str | None):
    return None if text is None else text.split(",")


def _pairs(records, key="impl"):
    """`{(backend, size, batch): {impl: record}}` and `{backend: matmul peak GFLOP/s}` of a timing file."""
    peaks = {r["backend"]: r["gflops"] for r in records if r.get(key) == "matmul_peak"}
    rows: Dict[tuple, dict] = {}
    for r in records:
        if r.get(key) != "matmul_peak":
            rows.setdefault((r["backend"], r["size"], r["batch"]), {})[r[key]] = r
    return rows, peaks


def _and(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _ratio(x: float) -> str:
    """A speed ratio (> 1: ours is faster), bold when ours is at least as fast."""
    text = f"{x:.2f}"
    return f"**{text}**" if x >= 1.0 or text == "1.00" else text


def _peaks_line(peaks: dict, backends) -> str:
    shown = ", ".join(f"{b} {peaks[b]:.0f}" for b in backends if b in peaks)
    return f"Float32 matmul peak measured in the same run (GFLOP/s): {shown}."


# ---------------------------------------------------------------- renderers


@table("train_step")
def train_step(files, backends=None, batches=None, ours="multicritic", native="native"):
    """One row per backend and batch: both steps' times, native time / ours, utilisation of the backend's peak."""
    rows, peaks = _pairs(files[0])
    backends, batches = _names(backends), _ints(batches)
    lines = [
        "| backend | size | batch | multicritic ms | native ms | native time / ours | multicritic util | native util |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    shown = []
    for (backend, size, batch), impls in sorted(rows.items()):
        if (backends and backend not in backends) or (batches and batch not in batches):
            continue
        if ours not in impls or native not in impls:
            continue
        a, b = impls[ours], impls[native]
        shown.append(backend)
        lines.append(
            f"| {backend} | {size} | {batch} | {a['step_ms']:.2f} | {b['step_ms']:.2f} | "
            f"{_ratio(b['step_ms'] / a['step_ms'])} | {100 * a['utilization']:.0f}% | "
            f"{100 * b['utilization']:.0f}% |"
        )
    return lines + ["", _peaks_line(peaks, sorted(set(shown)))]


def _spread(r) -> str:
    """`ms [min–max]` of a timing record (the median alone where the run kept no spread)."""
    if "step_ms_min" not in r:
        return f"{r['step_ms']:.2f}"
    return f"{r['step_ms']:.2f} [{r['step_ms_min']:.2f}–{r['step_ms_max']:.2f}]"


def _device(r) -> str:
    """`kernels, busy µs` a step from the run's profile of a step, "–" where there is none."""
    d = r.get("device") or {}
    if "kernels_per_step" not in d:
        return "–"
    return f"{d['kernels_per_step']:.0f}, {d['busy_us_per_step']:.0f} µs"


def _floor_us(r, launch):
    """The step's floor in µs: the GPU's busy time, or its kernels at the in-graph launch cost if that is more."""
    d = r.get("device") or {}
    if "kernels_per_step" not in d or not launch:
        return None
    return max(d["busy_us_per_step"], d["kernels_per_step"] * launch["in_graph_us"])


def _pins() -> Dict[str, str]:
    """The test-suite's pinned versions (`backends_matrix.yaml`): `{"torch": "2.13.0", "jax": ..., "keras": ...}`."""
    pins: Dict[str, str] = {}
    for name, version in re.findall(r"\b(torch|jax|keras)==([\w.+]+)", (ROOT / "backends_matrix.yaml").read_text()):
        pins.setdefault(name, version)
    return pins


def _provenance(machine: List[str], commit: str | None) -> str:
    """What a GPU file was measured with (its `machine` lines), the commit that recorded it, and how that
    differs from the test-suite's pins, as a sentence."""
    if commit is not None and not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        raise ValueError(f"commit: got {commit!r}, expected a commit's hexadecimal id")
    versions = dict(re.findall(r"\b(torch|jax|keras|tensorflow) (\S+)", " ".join(machine)))
    pins = _pins()
    differ = [f"{name} {pins[name]}" for name in versions if name in pins and versions[name] != pins[name]]
    measured = ", ".join(f"{name} {version}" for name, version in versions.items())
    gpu = machine[0].split(", ")  # nvidia-smi's name, memory, driver
    where = f"one {gpu[0]} ({gpu[1]}, driver {gpu[2]})" if len(gpu) == 3 else machine[0]
    text = (
        f"Measured once, on {where}, with {measured}"
        + (f", and recorded in commit {commit}" if commit else "")
        + "; not remeasured since, so later changes to the step are not in these numbers."
    )
    if differ:
        text += f" The test-suite pins other versions: {', '.join(differ)} (`backends_matrix.yaml`)."
    return text


@table("gpu_summary")
def gpu_summary(files):
    """`results_gpu.json`'s train steps in one sentence per backend: native time / ours against its own
    framework's fastest native step and against the fastest of any framework, over the batches."""
    rows: Dict[tuple, dict] = {}
    for part, records in files[0].items():
        if part.startswith("train_step"):
            for r in records:
                if r.get("impl") != "matmul_peak":
                    rows.setdefault((r["backend"], r["batch"], r.get("precision", "float32")), {})[r["impl"]] = r
    own: Dict[str, List[float]] = {}
    anywhere: Dict[str, List[float]] = {}
    for (backend, batch, precision), impls in sorted(rows.items()):
        if "multicritic" not in impls:
            continue
        ours = impls["multicritic"]["step_ms"]
        natives = [r["step_ms"] for n, r in impls.items() if n.startswith("native")]
        every = [
            r["step_ms"]
            for (b, ba, p), i in rows.items()
            if (ba, p) == (batch, precision)
            for n, r in i.items()
            if n.startswith("native")
        ]
        if natives:
            own.setdefault(backend, []).append(min(natives) / ours)
            anywhere.setdefault(backend, []).append(min(every) / ours)

    def span(values):
        return f"{min(values):.2f}–{max(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"

    parts = [
        f"{FRAMEWORKS.get(b, b)} {span(own[b])} against its own fastest native step"
        + (
            " (the fastest of any framework)"
            if own[b] == anywhere[b]
            else f", {span(anywhere[b])} against the fastest of any framework"
        )
        for b in own
    ]
    slower = [FRAMEWORKS.get(b, b) for b in anywhere if max(anywhere[b]) < 1]
    verb = "is" if len(slower) == 1 else "are"
    verdict = f": {_and(slower)} {verb} slower than the fastest native step at every batch" if slower else ""
    return [f"Native time / ours (above 1: ours is faster): {'; '.join(parts)}{verdict}."]


@table("gpu_train_step")
def gpu_train_step(files, commit=None):
    """`results_gpu.json` (every `train_step*` part): per backend, size, batch and precision, our step's ms
    (median and min–max over blocks), the fastest native step of its own framework and of any framework,
    each step's kernels and GPU busy time a step (profiler), and our time over the floor (the busy time, or
    the kernels at the measured in-graph launch cost if more); `commit=ID`: the commit that recorded the file,
    said under the table with the versions it was measured with."""
    merged = files[0]
    records = [r for part, recs in merged.items() if part.startswith("train_step") for r in recs]
    rows: Dict[tuple, dict] = {}
    for r in records:
        if r.get("impl") != "matmul_peak":
            key = (r["backend"], r["size"], r["batch"], r.get("precision", "float32"))
            rows.setdefault(key, {})[r["impl"]] = r
    launch = merged.get("launch_cost")
    lines = [
        "| backend | size | batch | precision | ours ms | fastest native of its framework, ms | native / ours "
        "| fastest native of any framework / ours | ours: kernels, busy a step | native: kernels, busy a step "
        "| ours / floor |",
        "|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for (backend, size, batch, precision), impls in sorted(rows.items()):
        ours = impls.get("multicritic")
        natives = {n: r for n, r in impls.items() if n.startswith("native")}
        if ours is None or not natives:
            continue
        name, best = min(natives.items(), key=lambda kv: kv[1]["step_ms"])
        anywhere = [
            r["step_ms"]
            for (b, s_, ba, p), i in rows.items()
            if (s_, ba, p) == (size, batch, precision)
            for n, r in i.items()
            if n.startswith("native")
        ]
        floor = _floor_us(ours, launch)
        lines.append(
            f"| {backend} | {size} | {batch} | {precision} | {_spread(ours)} | {name} {_spread(best)} | "
            f"{_ratio(best['step_ms'] / ours['step_ms'])} | {_ratio(min(anywhere) / ours['step_ms'])} | "
            f"{_device(ours)} | {_device(best)} | "
            + ("–" if floor is None else f"{ours['step_ms'] * 1e3 / floor:.2f}")
            + " |"
        )
    cost = (
        f" Launch cost: {launch['eager_us']:.1f} µs a kernel launched eagerly, {launch['in_graph_us']:.2f} µs "
        "inside a replayed CUDA graph."
        if launch
        else ""
    )
    return lines + ["", f"{_provenance(merged['machine'], commit)}{cost}"]


@table("step_kernels")
def step_kernels(files):
    """`benchmarks/ours/step_kernels.py --json` files (one per backend): each compiled step's launches (XLA's
    top-level instructions; inductor's kernels) and their number over the native step's."""
    lines = ["| backend | size | batch | step | launches | x native |", "|---|---|---:|---|---:|---:|"]
    for records in files:
        native = {r["batch"]: sum(r["ops"].values()) for r in records if r["impl"].startswith("native")}
        for r in records:
            count = sum(r["ops"].values())
            lines.append(
                f"| {r['backend']} | {r['size']} | {r['batch']} | {r['impl']} | {count} | "
                f"{count / native[r['batch']]:.2f} |"
            )
    return lines


@table("train_step_ratios")
def train_step_ratios(files, ours="multicritic", native="native"):
    """Compact: native time / ours, one row per backend, one column per batch."""
    rows, _ = _pairs(files[0])
    batches = sorted({batch for (_, _, batch) in rows})
    lines = ["| backend | " + " | ".join(f"batch {b}" for b in batches) + " |", "|---|" + "---:|" * len(batches)]
    for backend in BACKENDS:
        cells = []
        for batch in batches:
            impls = next((i for (be, _, ba), i in rows.items() if be == backend and ba == batch), {})
            cells.append(
                _ratio(impls[native]["step_ms"] / impls[ours]["step_ms"]) if ours in impls and native in impls else "–"
            )
        if any(c != "–" for c in cells):
            lines.append(f"| {backend} | " + " | ".join(cells) + " |")
    return lines


@table("first_input")
def first_input(files):
    """A single critic's step with the first Dense's input parts split or concatenated, per backend and batch."""
    lines = [
        "| backend | step | batch | split ms | concatenated ms | concatenated / split |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in files[0]:
        names = {"tensorflow": ("XLA", "graph"), "torch": ("compiled", "eager"), "jax": ("jit", "jit")}[r["backend"]]
        lines.append(
            f"| {r['backend']} | {names[0] if r['jit_compile'] else names[1]} | {r['batch']} | "
            f"{r['split_ms']:.2f} | {r['concatenated_ms']:.2f} | {r['concatenated_over_split']:.3f} |"
        )
    return lines


@table("targets")
def targets(files):
    """The speed targets, each read in several rounds (benchmarks/ours/targets.py): every round's ratio."""
    data = files[0]
    lines = ["| target | bound | ratio per round | median | met in |", "|---|---:|---|---:|---:|"]
    for t in data["targets"]:
        sign = "<=" if t["benchmark"] == "ensemble" else ">="
        rounds = ", ".join(f"{x:.3f}" for x in t["ratios"])
        lines.append(
            f"| {t['target']} | {sign} {t['bound']} | {rounds} | {t['median']:.3f} | "
            f"{t['rounds_met']} of {len(t['ratios'])} |"
        )
    return lines + ["", f"`{data['command']}`"]


def _target_group(t) -> str:
    """What a target times, without its batch: "PyTorch", "the JAX K = 5 ensemble", ..."""
    name = FRAMEWORKS.get(t["backend"], t["backend"])
    if t["benchmark"] == "ensemble":
        return f"the {name} K = 5 ensemble"
    if list(t["natives"]) == ["native_compiled"]:
        return f"{name} against its compiled native step"
    return name


@table("targets_met")
def targets_met(files):
    """One paragraph over every round of the files (`benchmarks/ours/targets.py`'s): the targets met in every
    round, in some and in none, the last two with their rounds and their ratios' range."""
    rounds: Dict[str, dict] = {}  # target: {"record", "met", "ratios"}, in the files' order
    for data in files:
        for t in data["targets"]:
            seen = rounds.setdefault(t["target"], {"record": t, "met": 0, "ratios": []})
            seen["met"] += t["rounds_met"]
            seen["ratios"] += t["ratios"]
    verdicts = {"every": [], "some": [], "none": []}
    for seen in rounds.values():
        n = len(seen["ratios"])
        verdicts["every" if seen["met"] == n else "some" if seen["met"] else "none"].append(seen)

    def phrase(group, detailed):
        by_what: Dict[str, List[str]] = {}
        for seen in group:
            t = seen["record"]
            text = str(t["batch"])
            if detailed:
                low, high = min(seen["ratios"]), max(seen["ratios"])
                text += f" ({seen['met']} of {len(seen['ratios'])}, {low:.3f}–{high:.3f})"
            by_what.setdefault(_target_group(t), []).append(text)
        return "; ".join(f"{what} at batch {_and(batches)}" for what, batches in by_what.items())

    total = sum(len(s["ratios"]) for s in rounds.values())
    lines = [
        f"Over all {total} rounds of the {len(rounds)} targets (in brackets: the rounds met of those run, and the "
        "ratios' range; a step's ratio is native time / ours, an ensemble's ours / native):",
        "",
    ]
    labels = {"every": "Met in every round", "some": "Met in some rounds", "none": "Met in none"}
    for verdict, group in verdicts.items():
        if group:
            lines.append(f"- **{labels[verdict]}:** {phrase(group, detailed=verdict != 'every')}.")
    return lines


@table("extras_cost")
def extras_cost(files):
    """The step with its work beyond the native step left out (benchmarks/ours/extras_cost.py), over the full."""
    records = [r for f in files for r in f]
    variants = [n for n in records[0]["over_full"] if n != "full" and not n.startswith("native")]
    labels = {"native": "graph", "native_xla": "XLA"}  # TensorFlow's; JAX has one native step
    lines = [
        "| backend | batch | K | full ms | " + " | ".join(f"without {v}" for v in variants) + " | native |",
        "|---|---:|---:|---:|" + "---:|" * len(variants) + "---|",
    ]
    for r in records:
        natives = [n for n in r["over_full"] if n.startswith("native")]
        native = ", ".join(
            f"{labels[n]} {r['over_full'][n]:.3f}" if len(natives) > 1 else f"{r['over_full'][n]:.3f}" for n in natives
        )
        lines.append(
            f"| {r['backend']} | {r['batch']} | {r['members']} | {r['step_ms']['full']:.2f} | "
            + " | ".join(f"{r['over_full'][v]:.3f}" for v in variants)
            + f" | {native} |"
        )
    return lines + ["", "Time over the full step's (the median of each round's ratio): below 1 is faster."]


@table("forward_views")
def forward_views(files):
    """PyTorch forward passes a host calls in its loops: ours against the same `nn.Module`, per entry point."""
    lines = [
        "| size | batch | call | autograd | ours us | nn.Module us | ours / nn.Module |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    for r in files[0]:
        lines.append(
            f"| {r['size']} | {r['batch']} | `{r['entry']}` | {'on' if r['autograd'] else 'no_grad'} | "
            f"{r['ours_us']:.1f} | {r['native_us']:.1f} | {r['ratio']:.2f} |"
        )
    return lines


@table("compiled_forward")
def compiled_forward(files):
    """A host's actor at batch 1 per call: Keras eagerly, `predict_on_batch`, `CompiledForward` and the native
    network (`benchmarks/ours/compiled_forward.py`)."""
    results = files[0]
    rows: Dict[tuple, dict] = {}
    for r in results["records"]:
        rows.setdefault((r["backend"], r["autograd"]), {})[r["variant"]] = r
    native_names = {"jax": "`jax.jit`", "tensorflow": "`tf.function`", "torch": "`nn.Sequential`"}
    lines = [
        "| backend | autograd | Keras call us | `predict_on_batch` us | `CompiledForward` us | native us | native "
        "| `CompiledForward` / native |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]

    def cell(r):
        return f"{r['us_median']:.1f} [{r['us_min']:.1f}, {r['us_max']:.1f}]"

    for (backend, autograd), v in rows.items():
        mode = {None: "–", True: "on", False: "`no_grad`"}[autograd]
        ratio = v["compiled_forward"]["us_median"] / v["native"]["us_median"]
        lines.append(
            f"| {backend} | {mode} | {cell(v['keras_call'])} | {cell(v['predict_on_batch'])} | "
            f"{cell(v['compiled_forward'])} | {cell(v['native'])} | {native_names[backend]} | {ratio:.2f} |"
        )
    blocks = results["records"][0]["blocks"]
    return lines + [
        "",
        f"Median over {blocks} alternating blocks [min, max], µs per call; `{results['command']}`.",
    ]


@table("sweep")
def sweep(files):
    """Batch sweep at XS, then model sizes: per backend ours / native ms, the ratio and our utilisation."""
    rows, peaks = _pairs(files[0])
    backends = sorted({b for (b, _, _) in rows})
    keys = sorted({(size, batch) for (_, size, batch) in rows}, key=lambda k: (k[0] != "XS", SIZES.index(k[0]), k[1]))
    lines = [
        "| size | batch | " + " | ".join(f"{b}: ours / native ms, native / ours, util" for b in backends) + " |",
        "|---|---:|" + "---:|" * len(backends),
    ]
    for size, batch in keys:
        cells = []
        for backend in backends:
            impls = rows.get((backend, size, batch), {})
            if "multicritic" in impls and "native" in impls:
                a, b = impls["multicritic"], impls["native"]
                cells.append(
                    f"{a['step_ms']:.2f} / {b['step_ms']:.2f}, {_ratio(b['step_ms'] / a['step_ms'])}, "
                    f"{100 * a['utilization']:.0f}%"
                )
            else:
                cells.append("–")
        lines.append(f"| {size} | {batch} | " + " | ".join(cells) + " |")
    return lines + ["", _peaks_line(peaks, backends)]


@table("step_memory")
def step_memory(files):
    """Peak memory of one step: ours / native MiB and their ratio, per backend and batch."""
    rows, _ = _pairs(files[0])
    batches = sorted({batch for (_, _, batch) in rows})
    lines = [
        "| backend | " + " | ".join(f"batch {b}: ours / native MiB | ratio" for b in batches) + " |",
        "|---|" + "---:|---:|" * len(batches),
    ]
    for backend in sorted({b for (b, _, _) in rows}):
        cells = []
        for batch in batches:
            impls = next((i for (be, _, ba), i in rows.items() if be == backend and ba == batch), {})
            a, b = impls["multicritic"]["step_mib"], impls["native"]["step_mib"]
            cells.append(f"{a:.1f} / {b:.1f} | {a / b:.2f}")
        lines.append(f"| {backend} | " + " | ".join(cells) + " |")
    return lines


PEER_LABELS = {
    "official": "official DreamerV3 (JAX)",
    "sheeprl": "sheeprl (PyTorch)",
    "sheeprl_compiled": "sheeprl, `algo.compile` (PyTorch)",
    "rllib": "RLlib (PyTorch)",
    "torchrl": "TorchRL (PyTorch)",
}


@table("peers")
def peers(files, ours="compiled"):
    """Each peer's shipped critic update against ours: peer time / ours (> 1: ours is faster) and both times.

    `ours=compiled`: our step as `"auto"` runs it from a step kind's 1000th call (PyTorch: `jit_compile=True`,
    a record's `multicritic_jit_ms`; JAX: always jitted); `ours=eager`: PyTorch's eager step (its first 1000
    calls), JAX's rows left out."""
    if ours not in ("compiled", "eager"):
        raise ValueError(f"ours: got {ours!r}, expected 'compiled' or 'eager'")

    def ours_ms(r):
        if r["backend"] != "torch":
            return r["multicritic_ms"] if ours == "compiled" else None
        return r.get("multicritic_jit_ms") if ours == "compiled" else r["multicritic_ms"]

    records = [r for f in files for r in f if "skipped" not in r and ours_ms(r) is not None]
    batches = sorted({r["batch"] for r in records})
    order = list(dict.fromkeys(r["peer"] for r in records))
    lines = [
        "| peer | " + " | ".join(f"batch {b}: peer / ours (ms)" for b in batches) + " |",
        "|---|" + "---:|" * len(batches),
    ]
    for peer in order:
        cells = []
        for batch in batches:
            r = next((r for r in records if r["peer"] == peer and r["batch"] == batch), None)
            cells.append(
                "–" if r is None else f"{_ratio(r['peer_ms'] / ours_ms(r))} ({r['peer_ms']:.2f} / {ours_ms(r):.2f})"
            )
        lines.append(f"| {PEER_LABELS.get(peer, peer)} | " + " | ".join(cells) + " |")
    return lines


@table("host_training")
def host_training(files, form="table"):
    """A host's own DreamerV3 training as it ships and with the swap (`benchmarks/peers/host_training.py`):
    medians of the alternating runs, their ratio and the one-off import of Keras and multicritic; `form=sentence`:
    the ratios and imports in one sentence."""
    records = [r for f in files for r in f]
    if form == "sentence":
        imports = [r["keras_import_s"] for r in records]
        ratios = "; ".join(f"{r['host']}: {r['swap_over_stock']:.2f}x its own time" for r in records)
        return [
            f"{ratios}; importing Keras and multicritic adds {min(imports):.1f}–{max(imports):.1f} s once a process."
        ]
    if form != "table":
        raise ValueError(f"form: got {form!r}, expected 'table' or 'sentence'")
    lines = [
        "| host | run | runs | stock s | swap s | swap / stock | Keras + multicritic import s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        run = f"{r['steps']} steps" if "steps" in r else f"build + {r['iterations']} × `algo.train()`"
        lines.append(
            f"| {r['host']} | {run} | {r['repeats']} | {r['stock_s']:.2f} | {r['swap_s']:.2f} | "
            f"{r['swap_over_stock']:.2f} | {r['keras_import_s']:.1f} |"
        )
    return lines


NATIVE_ENSEMBLES = ("native", "native_xla")  # native_xla: TensorFlow's native ensemble under XLA


def fastest_native(row):
    """The name of the fastest native ensemble timed in `row` (`{impl: record}`), or None."""
    timed = [name for name in NATIVE_ENSEMBLES if name in row]
    return min(timed, key=lambda name: row[name]["step_ms"]) if timed else None


@table("ensemble")
def ensemble(files):
    """K-member ensemble step against one critic, a loop of K critics and a native vectorised ensemble."""
    rows, _ = _pairs(files[0])
    lines = [
        "| backend | batch | single ms | K ms | loop of K ms | native K ms | native | K / single | "
        "loop / single | ours / native |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for (backend, size, batch), r in sorted(rows.items()):
        native = fastest_native(r)
        if native is None or not {"single", "ensemble"} <= set(r):
            continue
        ms = {k: r[k]["step_ms"] for k in ("single", "ensemble", "loop", native) if k in r}
        loop = (f"{ms['loop']:.2f}", f"{ms['loop'] / ms['single']:.2f}") if "loop" in ms else ("–", "–")
        label = "XLA" if native == "native_xla" else ("graph" if backend == "tensorflow" else "–")
        lines.append(
            f"| {backend} | {batch} | {ms['single']:.2f} | {ms['ensemble']:.2f} | {loop[0]} | "
            f"{ms[native]:.2f} | {label} | {ms['ensemble'] / ms['single']:.2f} | "
            f"{loop[1]} | {ms['ensemble'] / ms[native]:.2f} |"
        )
    members = sorted({r["ensemble"]["members"] for r in rows.values() if "ensemble" in r})
    return lines + [
        "",
        f"K = {', '.join(map(str, members))} members; size {', '.join(sorted({s for _, s, _ in rows}))}.",
    ]


def head_label(run):
    """`head (+ trunk) | ensemble | bins` of a demo run."""
    from multicritic.heads import HEADS

    c = run["config"]
    head = HEADS[c["head"]]()
    bins = c["bin_scheme"] if head.units == head.num_buckets else "n/a (no buckets)"
    trunk = "" if c.get("trunk", "mlp") == "mlp" else f", {c['trunk']} trunk"
    return f"{c['head']}{trunk} | {c['ensemble']} | {bins}" + ("" if run.get("main_table", True) else " (control)")


@table("demo_heads")
def demo_heads(files, seconds="yes"):
    """The demo's relative RMSE per value head and ensemble size, at each reward scale."""
    runs = files[0]["runs"]
    scales = [s["reward_scale"] for s in runs[0]["scales"]]
    show_seconds = seconds == "yes"
    lines = [
        "| head | ensemble | bins | "
        + " | ".join(f"rel. RMSE @ {s:g}" for s in scales)
        + (" | seconds (all scales) |" if show_seconds else " |"),
        "|---|---:|---|" + "---:|" * (len(scales) + show_seconds),
    ]
    for run in runs:
        errors = " | ".join(f"{100 * s['relative_rmse']:.2f}%" for s in run["scales"])
        tail = f" | {sum(s['seconds'] for s in run['scales']):.0f} |" if show_seconds else " |"
        lines.append(f"| {head_label(run)} | {errors}{tail}")
    return lines


@table("demo_summary")
def demo_summary(files):
    """The demo's default run (the first of the grid): relative RMSE per reward scale; with a second file
    (`results_demo_threads.json`), how far the unpinned numbers moved with XLA's thread count."""
    run = files[0]["runs"][0]
    lines = ["| reward scale | relative RMSE | steps |", "|---:|---:|---:|"]
    for s in run["scales"]:
        lines.append(f"| {s['reward_scale']:g} | {100 * s['relative_rmse']:.2f}% | {s['steps']} |")
    c = run["config"]
    lines += ["", f"Backend {files[0]['backend']}, size {c['size']}, {c['bin_scheme']} bins, seed {c['seed']}."]
    env = run.get("environment")
    if env:  # issue 72: what the numbers depend on
        versions = ", ".join(f"{name} {version}" for name, version in env["versions"].items() if version)
        where = f"{versions}; {env['cpu']['model']}, {env['cpu']['cpus']} CPUs."
        if env["numerics"].get("pinned"):
            where += (
                " The demo pins XLA's threads, instruction set and math (`multicritic/demo/numerics.py`) so that"
                " the CPU does not move these digits (checked: this AVX-512 EPYC against an emulated AVX2 Haswell,"
                " 1 and 2 CPUs)."
            )
        lines += ["", where]
    if len(files) > 1:
        threads = files[1]["runs"]
        scale = threads[0]["reward_scale"]
        moved = " / ".join(f"{100 * r['relative_rmse']:.2f}" for r in threads)
        counts = " / ".join(str(r["PJRT_NPROC"]) for r in threads)
        lines.append("")
        lines.append(f"Unpinned (`MULTICRITIC_DEMO_PIN=0`), the {scale:g} row was {moved}% with {counts} XLA threads.")
    return lines


def _seeds(values) -> str:
    """`mean [min, max]` of per-seed values."""
    return f"{np.mean(values):.0f} [{min(values):.0f}, {max(values):.0f}]"


def _ppo_table(per_run):
    from benchmarks.agents.plot_curves import ranges_overlap, within_spread

    scales = sorted({s for per_scale in per_run.values() for s in per_scale})
    lines = [
        "| task | head | backend | seeds | "
        + " | ".join(f"x{s:g}" for s in scales)
        + " | means in ranges | ranges overlap |",
        "|---|---|---|---:|" + "---:|" * len(scales) + "---|---|",
    ]
    for (env, head, backend), per_scale in sorted(per_run.items()):
        seeds = min(len(v) for v in per_scale.values())
        cells = " | ".join(_seeds(per_scale[s]) if s in per_scale else "" for s in scales)
        checks = [("yes" if check(per_scale) else "no") for check in (within_spread, ranges_overlap)]
        if len(per_scale) != len(scales):
            checks = ["n/a", "n/a"]
        lines.append(f"| {env} | {head} | {backend} | {seeds} | {cells} | {checks[0]} | {checks[1]} |")
    return lines


@table("ppo_scales")
def ppo_scales(files):
    """PPO's final return (last 10% of the steps) per task, head and backend at each reward scale: mean over
    seeds [min, max]; "means in ranges": each scale's mean inside every other scale's seed range; "ranges
    overlap": every two scales' seed ranges overlap."""
    from benchmarks.agents.plot_curves import ppo_finals

    return _ppo_table(ppo_finals(files[0]))


@table("ppo_scales_run")
def ppo_scales_run(files):
    """As `ppo_scales`, of the mean return over the whole run (20 equal spans of its steps): how fast each
    scale learned."""
    from benchmarks.agents.plot_curves import ppo_finals, run_return

    return _ppo_table(ppo_finals(files[0], run_return))


@table("ppo_scales_learned")
def ppo_scales_learned(files):
    """Per task, head, backend and reward scale: how many seeds learned (`plot_curves.learned`: the final return
    beats the first 10%'s) and the final return of those, mean [min, max]; "ranges overlap" as in `ppo_scales`,
    over the seeds that learned."""
    from benchmarks.agents.plot_curves import final_return, learned, ppo_finals, ranges_overlap

    # Each run's final return and whether it learned, in one pass: the pairs stay together.
    runs = ppo_finals(files[0], lambda episodes, steps: (final_return(episodes, steps), learned(episodes, steps)))
    scales = sorted({s for per_scale in runs.values() for s in per_scale})
    lines = [
        "| task | head | backend | " + " | ".join(f"x{s:g}" for s in scales) + " | ranges overlap |",
        "|---|---|---|" + "---:|" * len(scales) + "---|",
    ]
    for key, per_scale in sorted(runs.items()):
        kept = {s: [final for final, ok in pairs if ok] for s, pairs in per_scale.items()}
        cells = []
        for s in scales:
            if s not in kept:
                cells.append("")
                continue
            cells.append(f"{len(kept[s])}/{len(per_scale[s])}" + (f": {_seeds(kept[s])}" if kept[s] else ""))
        check = "yes" if ranges_overlap(kept) else "no"
        if len(kept) != len(scales) or not all(kept.values()):
            check = "n/a"
        lines.append(f"| {' | '.join(key)} | {' | '.join(cells)} | {check} |")
    return lines


def _ppo_cost_cells(results):
    """`{(env, backend): {"keras": [runs], "native": [runs]}}` of a `ppo_cost.py` result file."""
    cells = {}
    for run in results["runs"].values():
        cells.setdefault((run["env"], run["backend"]), {"keras": [], "native": []})[run["agent"]].append(run)
    return cells


def _pair_ratios(cell):
    """The Keras program's seconds over the hand-written loop's, per (seed) pair run back to back."""
    native = {run["seed"]: run["seconds"] for run in cell["native"]}
    return [run["seconds"] / native[run["seed"]] for run in cell["keras"] if run["seed"] in native]


@table("ppo_cost")
def ppo_cost(files):
    """Median seconds per PPO run of the Keras program and of the same backend's hand-written loop, and the
    ratio (median of the seeds' pairs [min, max]), per task; "within target": the median ratio at most the
    file's target."""
    results = files[0]
    lines = [
        f"| task | backend | hand-written loop, s | Keras program, s | ratio | within {results['target']:g}x |",
        "|---|---|---:|---:|---|---|",
    ]
    for (env, backend), cell in sorted(_ppo_cost_cells(results).items()):
        ratios = _pair_ratios(cell)
        if not ratios:
            continue
        native = float(np.median([run["seconds"] for run in cell["native"]]))
        keras_s = float(np.median([run["seconds"] for run in cell["keras"]]))
        ratio = float(np.median(ratios))
        lines.append(
            f"| {env} | {backend} | {native:.1f} | {keras_s:.1f} | "
            f"{ratio:.2f} [{min(ratios):.2f}, {max(ratios):.2f}] | {'yes' if ratio <= results['target'] else 'no'} |"
        )
    return lines


@table("ppo_cost_phases")
def ppo_cost_phases(files, env="CartPole-v1"):
    """Where a PPO run's time goes on one task: median seconds per phase (`keras_agent.Phases`) of each
    backend's hand-written loop and Keras program."""
    results = files[0]
    names = ("act", "value", "env", "update", "other")
    lines = [
        "| backend | agent | " + " | ".join(names) + " | run |",
        "|---|---|" + "---:|" * (len(names) + 1),
    ]
    for (task, backend), cell in sorted(_ppo_cost_cells(results).items()):
        if task != env:
            continue
        for agent in ("native", "keras"):
            runs = cell[agent]
            if not runs:
                continue
            phases = [float(np.median([run["phases"][name] for run in runs])) for name in names]
            total = float(np.median([run["seconds"] for run in runs]))
            label = "hand-written loop" if agent == "native" else "Keras program"
            lines.append(f"| {backend} | {label} | " + " | ".join(f"{p:.1f}" for p in phases) + f" | {total:.1f} |")
    return lines


@table("sheeprl_dreamer")
def sheeprl_dreamer(files):
    """sheeprl DreamerV3 per critic: return at budgets (mean over seeds [min, max] of the episodes ending in
    the budget's last eighth), wall and CPU seconds per run (both halves)."""
    from benchmarks.agents.plot_curves import final_return

    results = files[0]
    steps = results["steps"]
    budgets = [steps // 4, steps // 2, 3 * steps // 4, steps]
    per_variant = {}
    for key, halves in results["runs"].items():
        if len(halves) < 2:
            continue  # a run still going
        episodes = [e for half in halves for e in half["episodes"]]
        row = per_variant.setdefault(key.split("/")[0], {"budgets": [[] for _ in budgets], "wall": [], "cpu": []})
        for i, budget in enumerate(budgets):
            row["budgets"][i].append(final_return([e for e in episodes if e[0] <= budget], budget, 0.125))
        row["wall"].append(sum(h["wall_s"] for h in halves))
        row["cpu"].append(sum(h["cpu_s"] for h in halves))
    lines = [
        "| critic | seeds | " + " | ".join(f"return @ {b}" for b in budgets) + " | wall s / run | CPU s / run |",
        "|---|---:|" + "---:|" * (len(budgets) + 2),
    ]
    for variant, row in per_variant.items():
        cells = " | ".join(_seeds(v) for v in row["budgets"])
        lines.append(
            f"| {variant} | {len(row['wall'])} | {cells} | {np.mean(row['wall']):.0f} | {np.mean(row['cpu']):.0f} |"
        )
    return lines + [
        "",
        f"{results['env']}, {steps} environment steps per run, resumed from sheeprl's checkpoint at {steps // 2}. "
        "A return @ N is each seed's mean return over the episodes that end in the last eighth of the first N "
        f"steps (after {7 * budgets[0] // 8} and by {budgets[0]} for the first column), then the mean over seeds "
        "[min, max].",
    ]


@table("official_dreamer")
def official_dreamer(files):
    """The official DreamerV3 per critic: return at budgets (as `sheeprl_dreamer`, each run's halves joined at the
    step its second half restored), and for each swap, per seed, how many of the run's first episodes are the
    stock run's (same step, same return) of how many."""
    from benchmarks.agents.plot_curves import final_return, joined, leading_equal

    results = files[0]
    steps = results["steps"]
    budgets = [steps // 4, steps // 2, 3 * steps // 4, steps]
    done = {key: joined(halves) for key, halves in results["runs"].items() if len(halves) == 2}
    per_variant = {}
    for key, episodes in done.items():
        variant, seed = key.split("/")
        row = per_variant.setdefault(variant, {"budgets": [[] for _ in budgets], "wall": [], "cpu": [], "same": []})
        for i, budget in enumerate(budgets):
            row["budgets"][i].append(final_return([e for e in episodes if e[0] <= budget], budget, 0.125))
        row["wall"].append(sum(h["wall_s"] for h in results["runs"][key]))
        row["cpu"].append(sum(h["cpu_s"] for h in results["runs"][key]))
        stock = done.get(f"stock/{seed}")
        if variant != "stock" and stock is not None:
            row["same"].append(f"{leading_equal(episodes, stock)} / {len(stock)}")
    lines = [
        "| critic | seeds | "
        + " | ".join(f"return @ {b}" for b in budgets)
        + " | first episodes as stock's | wall s / run | CPU s / run |",
        "|---|---:|" + "---:|" * len(budgets) + "---|---:|---:|",
    ]
    for variant, row in per_variant.items():
        cells = " | ".join(_seeds(v) for v in row["budgets"])
        same = ", ".join(row["same"]) or "–"
        lines.append(
            f"| {variant} | {len(row['wall'])} | {cells} | {same} | {np.mean(row['wall']):.0f} | "
            f"{np.mean(row['cpu']):.0f} |"
        )
    resumed = "its end" if results.get("final_save") else "the official loop's last timed save"
    notes = [
        "",
        f"{results['env']}, {steps} environment steps per run, resumed from the official checkpoint of the first "
        f"half ({steps // 2} steps) at {resumed}. A return @ N is each seed's mean return over the episodes that end "
        f"in the last eighth of the first N steps (after {7 * budgets[0] // 8} and by {budgets[0]} for the first "
        "column), then the mean over seeds [min, max]. First episodes as stock's: per seed, how many of the run's "
        "first episodes end at the stock run's step with its return, of the stock run's episodes.",
    ]
    around = [[], []]  # the last five episodes' returns before each run's resume, the first five after it
    for key in done:
        first, second = results["runs"][key]
        restored = second.get("restored_step")
        around[0] += [r for step, r in first["episodes"] if restored is None or step <= restored][-5:]
        around[1] += [r for _, r in second["episodes"][:5]]
    if done:
        notes[-1] += (
            f" Across the resume, over the {len(done)} runs: the last five episodes before it return "
            f"{np.mean(around[0]):.0f} on average, the first five after it {np.mean(around[1]):.0f}."
        )
    for repeat in files[1:]:  # the stock runs made again, the same flags and seeds: what the count is by chance
        if repeat.get("flags") != results.get("flags"):
            raise ValueError("official_dreamer: a repeat file must have the first file's flags")
        for key, halves in repeat["runs"].items():
            stock = done.get(key)
            if not halves or stock is None:
                continue
            again = joined(halves)
            scope = "both halves" if len(halves) == 2 else "its first half"
            notes += [
                "",
                f"The {key.split('/')[0]} run of seed {key.split('/')[1]} made again (the same flags, seed and "
                f"pinning; {scope}, {len(again)} episodes): its first {leading_equal(again, stock)} episodes are "
                "the first run's.",
            ]
    return lines + notes


@table("member_spread")
def member_spread(files):
    """Ensembles on the demo: members' spread against the aggregate's error (correlation across states)."""
    lines = [
        "| head | reward scale | rel. RMSE | rel. member spread | Pearson | Spearman |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for run in files[0]["runs"]:
        if run["config"]["ensemble"] == 1:
            continue
        for s in run["scales"]:
            lines.append(
                f"| {run['config']['head']} (K = {run['config']['ensemble']}) | {s['reward_scale']:g} | "
                f"{100 * s['relative_rmse']:.2f}% | {100 * s['relative_member_spread']:.2f}% | "
                f"{s['member_spread_error_pearson']:+.2f} | {s['member_spread_error_spearman']:+.2f} |"
            )
    return lines


FORMAT_LABELS = {
    "keras": "Keras forward",
    "tf_saved_model": "SavedModel (TensorFlow)",
    "onnx": "ONNX (onnxruntime)",
    "litert": "LiteRT (interpreter)",
}


@table("export_latency")
def export_latency(files):
    """Inference latency per export format and batch, and its ratio to the Keras forward pass."""
    records = files[0]
    batches = sorted({r["batch"] for r in records})
    keys = list(dict.fromkeys((r["backend"], r["format"]) for r in records))
    lines = [
        "| exported from | runs as | " + " | ".join(f"batch {b}: ms | / Keras" for b in batches) + " |",
        "|---|---|" + "---:|---:|" * len(batches),
    ]
    for backend, fmt in keys:
        cells = []
        for batch in batches:
            r = next((r for r in records if (r["backend"], r["format"], r["batch"]) == (backend, fmt, batch)), None)
            cells.append("– | –" if r is None else f"{r['ms']:.3f} | {r['vs_keras']:.2f}")
        lines.append(f"| {backend} | {FORMAT_LABELS.get(fmt, fmt)} | " + " | ".join(cells) + " |")
    return lines


ENGINES = {
    "jax": "keras.distribution.DataParallel (virtual CPU devices)",
    "torch": "DistributedDataParallel (gloo processes)",
    "tensorflow": "MirroredStrategy (logical CPUs)",
}


@table("scaling")
def scaling(files):
    """Data-parallel throughput per backend and device count (steps/s and samples/s)."""
    records = files[0]
    devices = sorted({r["devices"] for r in records})
    lines = [
        "| backend | engine | " + " | ".join(f"{d} device{'s' * (d > 1)}" for d in devices) + " |",
        "|---|---|" + "---:|" * len(devices),
    ]
    for backend in list(dict.fromkeys(r["backend"] for r in records)):
        cells = []
        for d in devices:
            r = next((r for r in records if r["backend"] == backend and r["devices"] == d), None)
            cells.append(
                "–" if r is None else f"{r['steps_per_s']:.2f} steps/s ({r['samples_per_s'] / 1e3:.1f}k samples/s)"
            )
        lines.append(f"| {backend} | {ENGINES.get(backend, '')} | " + " | ".join(cells) + " |")
    return lines


@table("bin_scheme_bias")
def bin_scheme_bias(files):
    """Relative decode bias of the 2023 and 2024 bin schemes for spread-out returns."""
    lines = [
        "| mean return | spread (std / mean) | uniform_symlog decode bias | symexp decode bias |",
        "|---:|---:|---:|---:|",
    ]
    for r in files[0]["rows"]:
        lines.append(
            f"| {r['mean']:g} | {r['spread']:g} | {100 * r['bias_uniform_symlog']:+.2f}% | "
            f"{100 * r['bias_symexp']:+.3f}% |"
        )
    return lines


def _defined_in(module: str, name: str, depth: int = 0) -> str:
    """The full path of what `module.name` is (a function, class, constant or submodule), following
    `from ... import name` re-exports (read from the source, nothing imported)."""
    import ast

    parts = module.split(".")
    path = ROOT.joinpath(*parts).with_suffix(".py")
    if not path.is_file():
        path = ROOT.joinpath(*parts, "__init__.py")
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return f"{module}.{name}"
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return f"{module}.{name}"
        if isinstance(node, ast.ImportFrom) and node.module and depth < 5:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    try:
                        return _defined_in(node.module, alias.name, depth + 1)
                    except ValueError:
                        sub = ROOT.joinpath(*node.module.split("."), alias.name)
                        if sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file():
                            return f"{node.module}.{alias.name}"  # a submodule
                        raise
    raise ValueError(f"{name}: not found in {module}")


@table("public_names", files=False)
def public_names(files, package="multicritic"):
    """Every name of a package's `__all__`, linked to where the API reference documents it."""
    import ast

    init = ROOT.joinpath(*package.split("."), "__init__.py")
    names = next(
        ast.literal_eval(n.value)
        for n in ast.parse(init.read_text()).body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets)
    )
    lines = ["| name | is |", "|---|---|"]
    for name in names:
        target = _defined_in(package, name)
        lines.append(f"| [`{package}.{name}`][{target}] | `{target}` |")
    return lines


# The DreamerV3 critics people run, as their code ships (read from each codebase; not from this package):
# `(column, the `multicritic.interop.HOSTS` adapters that load and export its critics)`.
CODEBASES = (
    ("RLlib", ("rllib", "rllib_torch")),
    ("sheeprl", ("sheeprl",)),
    ("TorchRL", ("torchrl",)),
    ("NM512", ("nm512",)),
    ("official (2024)", ("dreamerv3",)),
)
# Each row: the codebases' cells, in CODEBASES' order; multicritic's cell is `comparison`'s.
CODEBASE_ROWS = {
    "frameworks": (
        "TensorFlow (ray ≤ 2.48) or PyTorch (≥ 2.49)",
        "PyTorch",
        "PyTorch",
        "PyTorch",
        "JAX",
    ),
    "bin schemes": ("2023", "2023", "2024", "2023", "2024"),
    "slow-critic options: rate, period, regulariser weight and form, targets": (
        "fixed",
        "rate, period",
        "rate, weight",
        "rate, period",
        "rate, period, weight, targets",
    ),
    "value heads": ("two-hot", "two-hot", "two-hot, MSE", "two-hot", "two-hot"),
    "trunks": ("MLP",) * 5,
    "critic ensembles, reward streams": ("no",) * 5,
    "one checkpoint for every framework": ("–",) * 5,
    "loads / exports the others' critics": ("–",) * 5,
    "export for serving (SavedModel, ONNX, LiteRT)": ("no",) * 5,
}
# How the comparison names a registered part; a part not listed here shows as its name.
PART_LABELS = {"two_hot": "two-hot", "hl_gauss": "HL-Gauss", "mse": "MSE", "quantile": "quantile", "mlp": "MLP"}
NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


def part_labels(registry) -> str:
    """The registered parts of a registry (`multicritic.heads.HEADS`, `...trunks.TRUNKS`) as the comparison
    names them."""
    return ", ".join(PART_LABELS.get(name, name.replace("_", "-")) for name in registry)


@table("comparison", files=False)
def comparison(files):
    """multicritic against the DreamerV3 critics people run: its heads and trunks from the registries, the
    codebases it loads and exports from `multicritic.interop.HOSTS`."""
    from multicritic.heads import HEADS
    from multicritic.interop import HOSTS
    from multicritic.trunks import TRUNKS

    covered = [name for name, adapters in CODEBASES if all(a in HOSTS for a in adapters)]
    ours = {
        "frameworks": "TensorFlow, PyTorch, JAX",
        "bin schemes": "2023 and 2024",
        "slow-critic options: rate, period, regulariser weight and form, targets": "all",
        "value heads": part_labels(HEADS),
        "trunks": part_labels(TRUNKS),
        "critic ensembles, reward streams": "yes",
        "one checkpoint for every framework": "yes",
        "loads / exports the others' critics": (
            f"all {NUMBERS.get(len(covered), len(covered))}" if len(covered) == len(CODEBASES) else ", ".join(covered)
        ),
        "export for serving (SavedModel, ONNX, LiteRT)": "yes",
    }
    lines = [
        "| | multicritic | " + " | ".join(name for name, _ in CODEBASES) + " |",
        "|---|---|" + "---|" * len(CODEBASES),
    ]
    for row, cells in CODEBASE_ROWS.items():
        lines.append(f"| {row} | {ours[row]} | " + " | ".join(cells) + " |")
    return lines


@table("hosts", files=False)
def hosts(files):
    """The registered hosts (`multicritic.interop.HOSTS`): each adapter's codebase, options and interface."""
    from multicritic.interop import HOSTS

    lines = [
        "| host | codebase | `input_layout` | `norm` | `use_bias` | `bin_scheme` | builds a critic | "
        "PyTorch modules | named layout |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in HOSTS:
        a = HOSTS[name]
        o = a.options
        yes = {True: "yes", False: "no"}
        lines.append(
            f"| `{name}` | {a.title} | `{o['input_layout']}` | `{o['norm']}` | {yes[o['use_bias']]} | "
            f"`{o['bin_scheme']}` | {yes[a.build is not None]} | {yes[a.modules is not None]} | "
            f"{yes[a.key is not None]} |"
        )
    return lines


# ---------------------------------------------------------------- pages


def render(spec: str) -> str:
    """The Markdown between the markers for a marker's `spec` (`name file... key=value...`)."""
    name, *args = spec.split()
    if name not in RENDERERS:
        raise ValueError(f"table: got {name!r}, expected one of {sorted(RENDERERS)}")
    names = [a for a in args if "=" not in a]
    options = dict(a.split("=", 1) for a in args if "=" in a)
    if bool(names) != RENDERERS[name].needs_files:
        raise ValueError(
            f"table {name}: got files {names}, expected "
            + ("result files" if RENDERERS[name].needs_files else "none (it reads the source)")
        )
    files = []
    for file_name in names:
        path = RESULTS / file_name
        if not path.is_file():
            raise ValueError(f"table {name}: got {file_name!r}, expected a file in {RESULTS.relative_to(ROOT)}")
        files.append(json.loads(path.read_text()))
    part = options.pop("part", None)
    if part is not None:  # one part of a merged file (`{part: records}`, as benchmarks/gpu/run.sh writes)
        if not all(isinstance(f, dict) and part in f for f in files):
            raise ValueError(f"table {name}: got part={part!r}, expected a part of each file")
        files = [f[part] for f in files]
    lines = RENDERERS[name](files, **options)
    source = ", ".join(f"`benchmarks/results/{n}`" for n in names) or "the source"
    return "\n".join([*lines, "", f"<small>Generated from {source} by `benchmarks/render_tables.py`.</small>", ""])


def pages(root: pathlib.Path = ROOT) -> List[pathlib.Path]:
    found = []
    for pattern in PAGES:
        found += sorted(p for p in root.glob(pattern) if p.is_file())
    return found


def rendered(text: str) -> str:
    """`text` with every generated table rendered again from its file."""
    return MARKER.sub(lambda m: f"<!-- table: {m['spec']} -->\n{render(m['spec'])}<!-- /table -->", text)


def stale(root: pathlib.Path = ROOT) -> List[str]:
    """`page: spec` of every generated table whose text differs from its file's rendering."""
    out = []
    for page in pages(root):
        for m in MARKER.finditer(page.read_text()):
            if m["body"] != render(m["spec"]):
                out.append(f"{page.relative_to(root)}: {m['spec']}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only list the tables that differ (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        out = stale()
        for line in out:
            print(f"stale: {line}")
        return 1 if out else 0
    for page in pages():
        text = page.read_text()
        new = rendered(text)
        if new != text:
            page.write_text(new)
            print(f"rendered {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
