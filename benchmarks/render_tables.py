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
returning the table's Markdown lines), then run the script. A sentence that quotes a result file is a block
too: its renderer returns the paragraph, numbers and verdicts computed from the file (README.md,
docs/performance.md and docs/real-agents.md type no measured number by hand: `tests/docs/test_hand_numbers.py`).

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


def _peer_ours_ms(r, ours):
    """Our ms in a peers record: `ours="compiled"`, the compiled step (PyTorch: `jit_compile=True`, a record's
    `multicritic_jit_ms`; JAX always jitted); `"eager"`, PyTorch's eager step (None for JAX)."""
    if ours not in ("compiled", "eager"):
        raise ValueError(f"ours: got {ours!r}, expected 'compiled' or 'eager'")
    if r["backend"] != "torch":
        return r["multicritic_ms"] if ours == "compiled" else None
    return r.get("multicritic_jit_ms") if ours == "compiled" else r["multicritic_ms"]


@table("peers")
def peers(files, ours="compiled"):
    """Each peer's shipped critic update against ours: peer time / ours (> 1: ours is faster) and both times.

    `ours=compiled`: our compiled step (PyTorch: `jit_compile=True`, a record's `multicritic_jit_ms`; JAX:
    always jitted); `ours=eager`: PyTorch's eager step (`jit_compile=False`, what `"auto"` runs on a CPU), JAX's
    rows left out."""

    def ours_ms(r):
        return _peer_ours_ms(r, ours)

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
    the ratios and imports in one sentence; `form=import`: the import's weight on the shortest run."""
    records = [r for f in files for r in f]
    if form == "sentence":
        imports = [r["keras_import_s"] for r in records]
        ratios = "; ".join(f"{r['host']}: {r['swap_over_stock']:.2f}x its own time" for r in records)
        return [
            f"{ratios}; importing Keras and multicritic adds {min(imports):.1f}–{max(imports):.1f} s once a process."
        ]
    if form == "import":  # the import against the shortest run: what a fixed cost a process weighs on
        r = min(records, key=lambda r: r["stock_s"])
        with_import = (r["swap_s"] + r["keras_import_s"]) / r["stock_s"]
        return [
            f"With the import, the shortest run above ({r['host'].split()[0]}'s, {r['stock_s']:.1f} s stock) takes "
            f"{with_import:.2f}x the host's own run: the import is a fixed cost per process, which weighs on a run "
            "of seconds, not on a real one."
        ]
    if form != "table":
        raise ValueError(f"form: got {form!r}, expected 'table', 'sentence' or 'import'")
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


# ---------------------------------------------------------------- sentences
# What the pages say about a result file, written from it: a renderer below returns a paragraph (or a short
# list) whose numbers and verdicts ("within the target", "the faster way") are computed, so that a remeasured
# file changes the sentence with the table. `tests/docs/test_hand_numbers.py` fails on a measured-looking
# number the pages type by hand outside these blocks.


def _list(values, fmt="{:.2f}") -> str:
    """`a, b and c` of numbers."""
    return _and([fmt.format(v) for v in values])


def _steps(n: float) -> str:
    """A step count to two significant figures: 4,400, 970."""
    digits = len(str(int(abs(n)))) if n >= 1 else 1
    return f"{round(n, -max(0, digits - 2)):,.0f}"


def _scale(x: float) -> str:
    """A reward scale or a learning rate as the pages write it: 1, 1e3, 1e6, 2.5e-4."""
    if x == int(x) and abs(x) < 1000:
        return f"{x:g}"
    mantissa, exponent = f"{x:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def _train_records(data):
    """The records of a train-step file: its list, or every `train_step*` part of a merged GPU file."""
    if isinstance(data, dict):
        return [r for part, records in data.items() if part.startswith("train_step") for r in records]
    return data


@table("targets_spread")
def targets_spread(files):
    """How far a target's ratio moved between its rounds (each a fresh process), over every target of the files:
    the median move and the largest, as a share of the target's median ratio."""
    moves = []
    for data in files:
        for t in data["targets"]:
            if len(t["ratios"]) > 1:
                moves.append(((max(t["ratios"]) - min(t["ratios"])) / float(np.median(t["ratios"])), t))
    typical = float(np.median([move for move, _ in moves]))
    top, t = max(moves, key=lambda mt: mt[0])
    near = {m[1]["target"] for m in moves if abs(float(np.median(m[1]["ratios"])) / m[1]["bound"] - 1) < typical}
    return [
        f"Between the rounds of one target, each a fresh process, its ratio moved by {100 * typical:.0f}% of its "
        f"median in the median target and by up to {100 * top:.0f}% ({t['target']}: {min(t['ratios']):.3f} to "
        f"{max(t['ratios']):.3f}); {len(near)} of the {len({m[1]['target'] for m in moves})} targets have a median "
        "nearer their bound than that median move."
    ]


@table("tf_ways")
def tf_ways(files):
    """TensorFlow's plain graph against XLA in a train-step file: per batch, the native plain graph's time over the
    native XLA step's and our plain graph's over our XLA step's, and at which batches the plain graph is faster."""
    rows, _ = _pairs(files[0])
    steps = sorted((batch, impls) for (backend, _, batch), impls in rows.items() if backend == "tensorflow")
    batches = [batch for batch, _ in steps]

    def over(graph, xla):
        return [impls[graph]["step_ms"] / impls[xla]["step_ms"] for _, impls in steps]

    def faster(ratios):
        at = [str(b) for b, r in zip(batches, ratios) if r < 1]
        return f"at batch {_and(at)}" if at else "at no batch"

    native, ours = over("native", "native_xla"), over("multicritic_graph", "multicritic")
    return [
        f"The plain graph's time over the XLA step's in this run, at batch {_and(map(str, batches))}: the native "
        f"step's {_list(native)}, ours {_list(ours)}. The plain graph is the faster way {faster(native)} for the "
        f"native step and {faster(ours)} for ours."
    ]


@table("extras_cost_summary")
def extras_cost_summary(files):
    """`extras_cost`'s rows in words: what leaving out all the extra work saves, against the native plain graph's
    lead over our full XLA step (TensorFlow) or against the native step (JAX)."""
    records = [r for f in files for r in f]
    out = []
    tf = [r for r in records if "native_xla" in r["over_full"]]
    if tf:
        saves = [1 - r["over_full"]["all"] for r in tf]
        lead = [1 - r["over_full"]["native"] for r in tf]
        graph = [1 - r["over_full"]["native"] / r["over_full"]["native_xla"] for r in tf]
        where = _and([f"K = {r['members']}" for r in tf])
        verdict = (
            "the gap is mostly XLA against oneDNN on this CPU, not the extra work"
            if max(saves) < min(lead)
            else "the extra work is as large as the gap in some rows"
        )
        out.append(
            f"On TensorFlow at batch {_and(sorted({str(r['batch']) for r in tf}))} ({where}), leaving all three out "
            f"saves {_list([100 * s for s in saves], '{:.1f}%')} of the step, while the native plain graph takes "
            f"{_list([100 * g for g in lead], '{:.1f}%')} less time than our full XLA step in the same process "
            f"({_list([100 * g for g in graph], '{:.1f}%')} less than the native XLA step): {verdict}."
        )
    for r in records:
        if r in tf:
            continue
        without, native = r["over_full"]["all"], r["over_full"]["native"]
        compared = (
            "as fast as the native step"
            if abs(without - native) <= 0.02
            else "faster than the native step"
            if without < native
            else "slower than the native step"
        )
        out.append(
            f"On {FRAMEWORKS.get(r['backend'], r['backend'])} at batch {r['batch']} the step without all three runs "
            f"{compared} ({without:.3f} and {native:.3f} of the full step's time); the mirrored-pair decode alone "
            f"is {100 * (1 - r['over_full']['pairs']):.1f}% of the step there."
        )
    return [" ".join(out)]


@table("compile_payback")
def compile_payback(files, backend="torch", native=None):
    """When a compiled step pays for its compilation, per batch: the compiled and the eager step's times, the compiled
    step's first call (tracing and compilation), and the steps after which the time saved repays it (`native=IMPL`:
    that native step's first call too). A train-step file, or a merged GPU file (its `train_step*` parts)."""
    by_batch: Dict[int, dict] = {}
    for r in _train_records(files[0]):
        if r.get("backend") == backend and "step_ms" in r:
            by_batch.setdefault(r["batch"], {})[r["impl"]] = r
    rows = [(b, i) for b, i in sorted(by_batch.items()) if {"multicritic", "multicritic_eager"} <= set(i)]
    batches = _and([str(b) for b, _ in rows])
    compiled = [i["multicritic"]["step_ms"] for _, i in rows]
    eager = [i["multicritic_eager"]["step_ms"] for _, i in rows]
    first = [i["multicritic"]["first_call_s"] for _, i in rows]
    payback = ["never" if e <= c else _steps(s * 1e3 / (e - c)) for c, e, s in zip(compiled, eager, first, strict=True)]
    text = (
        f"At batch {batches} the compiled step took {_list(compiled)} ms against the eager step's {_list(eager)} ms; "
        f"its first call (tracing and compilation) took {_list(first, '{:.1f}')} s"
    )
    if native:
        text += f" (the {native} step's first call: {_list([i[native]['first_call_s'] for _, i in rows], '{:.1f}')} s)"
    return [f"{text}, so a compilation paid for itself after about {_and(payback)} steps."]


@table("ensemble_summary")
def ensemble_summary(files, target=None):
    """An `ensemble` file in words: per backend, ours / the fastest native ensemble at each batch (against the
    `target`, where given, with three decimals: a ratio shown as 1.05 may be above 1.05), which native that was
    where there are two, and a Python loop's time over the stacked ensemble's."""
    rows, _ = _pairs(files[0])
    per: Dict[str, list] = {}
    loops = []
    for (backend, _, batch), r in sorted(rows.items()):
        native = fastest_native(r)
        if native is None or "ensemble" not in r:
            continue
        per.setdefault(backend, []).append((batch, r["ensemble"]["step_ms"] / r[native]["step_ms"], native, r))
        if "loop" in r:
            loops.append(r["loop"]["step_ms"] / r["ensemble"]["step_ms"])
    parts = []
    for backend, cells in per.items():
        text = f"{FRAMEWORKS.get(backend, backend)} " + _and([f"{x:.3f} at batch {b}" for b, x, _, _ in cells])
        if any(set(NATIVE_ENSEMBLES) <= set(r) for *_, r in cells):
            names = {"native": "the plain graph", "native_xla": "XLA"}
            chosen = {n for _, _, n, _ in cells}
            which = (
                f"{names[chosen.pop()]} at every batch"
                if len(chosen) == 1
                else _and([f"{names[n]} at {b}" for b, _, n, _ in cells])
            )
            text += f" (against the faster of its native plain graph and XLA: {which})"
        if target is not None:
            met = [str(b) for b, x, _, _ in cells if x <= float(target)]
            text += (
                ": within the target at every batch"
                if len(met) == len(cells)
                else f": within it at {_and(met)} only"
                if met
                else ": above it at every batch"
            )
        parts.append(text)
    head = "Ours / the fastest native ensemble" + (f", against the {target}x target" if target else "")
    lines = [f"{head}: {'; '.join(parts)}."]
    if loops:
        lines[0] += (
            f" A Python loop of single critics takes {min(loops):.2f}–{max(loops):.2f}x the stacked ensemble's time."
        )
    return lines


@table("forward_views_summary")
def forward_views_summary(files):
    """`forward_views` in words: per size and batch, the range of ours / `nn.Module` over the calls, and
    `on_latent`'s at the largest."""
    groups: Dict[tuple, list] = {}
    for r in files[0]:
        groups.setdefault((r["size"], r["batch"]), []).append(r)
    parts = [
        f"at {size} batch {batch} {min(r['ratio'] for r in rs):.2f}–{max(r['ratio'] for r in rs):.2f}x"
        for (size, batch), rs in groups.items()
    ]
    size, batch = list(groups)[-1]
    latent = {r["autograd"]: r["ratio"] for r in groups[(size, batch)] if r["entry"].startswith("on_latent")}
    text = f"Ours over the `nn.Module`'s time per call: {_and(parts)}"
    if latent:
        text += (
            f"; `on_latent` at {size} batch {batch}: {latent[True]:.2f}x with autograd, "
            f"{latent[False]:.2f}x under `no_grad`"
        )
    return [text + "."]


@table("step_impls")
def step_impls(files, backend="torch"):
    """Every step of one backend in a train-step file (or a merged GPU file) per batch: its ms, and its first
    call's seconds (tracing and compilation)."""
    by_impl: Dict[str, Dict[int, dict]] = {}
    for r in _train_records(files[0]):
        if r.get("backend") == backend and "step_ms" in r:
            by_impl.setdefault(r["impl"], {})[r["batch"]] = r
    batches = sorted({b for rows in by_impl.values() for b in rows})
    lines = [
        "| step | " + " | ".join(f"batch {b}: ms (first call s)" for b in batches) + " |",
        "|---|" + "---:|" * len(batches),
    ]
    for impl, rows in by_impl.items():
        cells = [f"{rows[b]['step_ms']:.2f} ({rows[b]['first_call_s']:.1f})" if b in rows else "–" for b in batches]
        lines.append(f"| {impl} | " + " | ".join(cells) + " |")
    return lines


@table("ppo_cost_summary")
def ppo_cost_summary(files):
    """`ppo_cost` in words: whether every Keras program is within the file's target on every task (the median over
    seeds of its time over the hand-written loop's), and the closest to it, with its seeds' largest ratio."""
    results = files[0]
    target = results["target"]
    cells = []
    for (env, backend), cell in sorted(_ppo_cost_cells(results).items()):
        ratios = _pair_ratios(cell)
        if ratios:
            cells.append((float(np.median(ratios)), max(ratios), env, backend))
    envs = sorted({env for _, _, env, _ in cells})
    over = [c for c in cells if c[0] > target]
    closest = max(cells)
    where = "both tasks" if len(envs) == 2 else f"all {len(envs)} tasks" if len(envs) > 2 else envs[0]
    verdict = (
        f"Every backend's Keras program is within the {target:g}x target on {where}"
        if not over
        else "Above the {:g}x target: ".format(target)
        + _and([f"{FRAMEWORKS.get(b, b)} on {e} ({m:.2f})" for m, _, e, b in over])
    )
    return [
        f"{verdict} (the Cost table: the median over seeds of the Keras program's time over the hand-written "
        f"loop's); the highest is {FRAMEWORKS.get(closest[3], closest[3])} on {closest[2]}, {closest[0]:.2f}, "
        f"its seeds up to {closest[1]:.2f}."
    ]


@table("peers_range")
def peers_range(files, ours="eager"):
    """The `peers` table's ratios (peer time / ours) as one range over the peers per batch."""
    per: Dict[int, List[float]] = {}
    for r in (r for f in files for r in f if "skipped" not in r):
        mine = _peer_ours_ms(r, ours)
        if mine is not None:
            per.setdefault(r["batch"], []).append(r["peer_ms"] / mine)
    what = (
        'our eager PyTorch step (`jit_compile=False`: what the default `"auto"` runs on a CPU)'
        if ours == "eager"
        else "our compiled step"
    )
    spans = _and([f"{min(v):.2f}–{max(v):.2f} at batch {b}" for b, v in sorted(per.items())])
    return [f"Peer time / ours against {what}: {spans}."]


@table("sheeprl_same")
def sheeprl_same(files, variant="swap"):
    """Whether a swap's runs are the stock runs episode for episode: per seed, how many of the stock run's episodes
    (both halves) the swap's run repeats from its first, with the same step and return."""
    from benchmarks.agents.plot_curves import leading_equal

    runs = files[0]["runs"]
    counts = []
    for key, halves in runs.items():
        name, seed = key.split("/")
        stock = runs.get(f"stock/{seed}")
        if name != variant or stock is None or len(halves) < 2 or len(stock) < 2:
            continue
        mine = [e for half in halves for e in half["episodes"]]
        theirs = [e for half in stock for e in half["episodes"]]
        counts.append((seed, leading_equal(mine, theirs), len(theirs), mine == theirs))
    if all(same for *_, same in counts):
        return [
            f"**Stock and {variant} are the same run.** For each seed, the two variants give the same return for "
            "every episode ("
            + ", ".join(f"{n} episodes for seed {seed}" for seed, n, _, _ in counts)
            + "), on both sides of the resume."
        ]
    return [
        f"**Stock and {variant} part.** Per seed, the {variant} run repeats the stock run's first episodes, then "
        "parts from it: " + ", ".join(f"{n} of {total} for seed {seed}" for seed, n, total, _ in counts) + "."
    ]


@table("sheeprl_variant")
def sheeprl_variant(files, variant="swap-2024"):
    """A critic of the sheeprl runs against the stock one in words: at each budget whether the seeds' ranges overlap
    (or one is above the other), the means, the critic's reads per half and the CPU time per run."""
    from benchmarks.agents.plot_curves import final_return

    results = files[0]
    steps = results["steps"]
    budgets = [steps // 4, steps // 2, 3 * steps // 4, steps]
    returns: Dict[str, List[List[float]]] = {}
    cpu: Dict[str, List[float]] = {}
    reads = set()
    for key, halves in results["runs"].items():
        name = key.split("/")[0]
        if len(halves) < 2 or name not in ("stock", variant):
            continue
        episodes = [e for half in halves for e in half["episodes"]]
        row = returns.setdefault(name, [[] for _ in budgets])
        for i, budget in enumerate(budgets):
            row[i].append(final_return([e for e in episodes if e[0] <= budget], budget, 0.125))
        cpu.setdefault(name, []).append(sum(h["cpu_s"] for h in halves))
        if name == variant:
            reads.add(tuple(h.get("critic_reads") for h in halves))
    ours, stock = returns[variant], returns["stock"]
    overlap = [i for i in range(len(budgets)) if min(ours[i]) <= max(stock[i]) and min(stock[i]) <= max(ours[i])]
    seeds = len(ours[0])
    text = []
    if overlap:
        text.append(
            f"At {_and([f'{budgets[i]:,}' for i in overlap])} steps its seed ranges overlap the stock critic's "
            f"(means {' / '.join(f'{np.mean(ours[i]):.0f}' for i in overlap)} against "
            f"{' / '.join(f'{np.mean(stock[i]):.0f}' for i in overlap)})."
        )
    for i in (i for i in range(len(budgets)) if i not in overlap):
        side = "above" if min(ours[i]) > max(stock[i]) else "below"
        text.append(
            f"At {budgets[i]:,} steps all {seeds} of its seeds ended {side} all {len(stock[i])} stock seeds: "
            f"{_seeds(ours[i])} against {_seeds(stock[i])}."
        )
    if len(reads) == 1 and None not in next(iter(reads)):
        first, second = next(iter(reads))
        text.append(
            f"sheeprl's `train` read the critic through `sheeprl_distribution` {first:,} times in the first half and "
            f"{second:,} in the second for each seed."
        )
    text.append(
        f"Its CPU time per run was {np.mean(cpu[variant]):,.0f} s, the stock critic's {np.mean(cpu['stock']):,.0f} s; "
        "the times were taken alongside other jobs and are not a timing."
    )
    return [" ".join(text)]


@table("official_shared")
def official_shared(files):
    """How many first episodes each swap shares with the stock run of its seed, read against how many a stock run
    made again shares with the first (the second file): what the swaps share by chance."""
    from benchmarks.agents.plot_curves import joined, leading_equal

    done = {key: joined(halves) for key, halves in files[0]["runs"].items() if len(halves) == 2}
    shared: Dict[str, Dict[str, int]] = {}
    for key, episodes in done.items():
        variant, seed = key.split("/")
        if variant != "stock" and f"stock/{seed}" in done:
            shared.setdefault(seed, {})[variant] = leading_equal(episodes, done[f"stock/{seed}"])
    text = []
    again_seeds = set()
    verdicts = []  # per stock run made again: whether no swap shares more with stock than it does
    for repeat in files[1:]:
        for key, halves in repeat["runs"].items():
            seed = key.split("/")[1]
            if not halves or f"stock/{seed}" not in done or seed not in shared:
                continue
            again_seeds.add(seed)
            again = leading_equal(joined(halves), done[f"stock/{seed}"])

            def compared(n, again=again):
                return "as many" if n == again else "more" if n > again else "fewer"

            swaps = shared[seed]
            text.append(
                f"The stock run of seed {seed} made again, with nothing changed, shares its first {again} episodes "
                "with the first stock run (the sentence under the table); of that seed's swaps, "
                + ", ".join(f"{variant} shares {n} ({compared(n)})" for variant, n in swaps.items())
                + "."
            )
            verdicts.append(all(n <= again for n in swaps.values()))
    others = [seed for seed in shared if seed not in again_seeds]
    same = [seed for seed in others if len(set(shared[seed].values())) == 1]
    if same:
        text.append(
            f"On seed{'s' * (len(same) > 1)} {_and(same)} the swaps part from stock at the same episode "
            f"({', '.join(str(next(iter(shared[s].values()))) for s in same)})."
        )
    for seed in (s for s in others if s not in same):
        text.append(f"On seed {seed}: " + ", ".join(f"{v} {n}" for v, n in shared[seed].items()) + ".")
    if verdicts:
        text.append(
            "What the swaps share with stock is no more than what stock shares with itself."
            if all(verdicts)
            else "A swap shares more with stock than stock shares with itself."
        )
    return [" ".join(text)]


def _fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """The two-sided p of Fisher's exact test on the 2x2 table `[[a, b], [c, d]]`, as `scipy.stats.fisher_exact`
    computes it (the tables at most as likely as the observed one), without scipy."""
    from math import comb

    row, col, n = a + b, a + c, a + b + c + d

    def p(x):
        return comb(col, x) * comb(n - col, row - x) / comb(n, row)

    observed = p(a)
    return min(1.0, sum(p(x) for x in range(max(0, row + col - n), min(row, col) + 1) if p(x) <= observed * (1 + 1e-7)))


@table("ppo_learned_counts")
def ppo_learned_counts(files, env="Acrobot-v1", head="two_hot"):
    """How many seeds learned (`plot_curves.learned`) on one task and head: per reward scale over every agent, with
    Fisher's exact test of the smallest scale against the largest, and per agent over its scales, the agent with the
    most against the others."""
    from benchmarks.agents.plot_curves import learned

    per_scale: Dict[float, List[bool]] = {}
    per_agent: Dict[str, List[bool]] = {}
    for run in files[0]["runs"].values():
        if run["env"] == env and run["head"] == head:
            ok = learned(run["episodes"], run["steps"])
            per_scale.setdefault(run["reward_scale"], []).append(ok)
            per_agent.setdefault(run["backend"], []).append(ok)
    scales = sorted(per_scale)
    low, high = per_scale[scales[0]], per_scale[scales[-1]]
    p_scales = _fisher_exact(sum(low), len(low) - sum(low), sum(high), len(high) - sum(high))
    counts = [f"{sum(per_scale[s])} at {_scale(s)}" for s in scales]
    counts[0] = f"{sum(low)} of {len(low)} seeds learned at scale {_scale(scales[0])}"
    best = max(per_agent, key=lambda a: sum(per_agent[a]) / len(per_agent[a]))
    rest = [ok for agent, oks in per_agent.items() if agent != best for ok in oks]
    mine = per_agent[best]
    p_best = _fisher_exact(sum(mine), len(mine) - sum(mine), sum(rest), len(rest) - sum(rest))
    return [
        f"On {env}, over the {len(per_agent)} agents, {_and(counts)} (Fisher's exact test on these counts, "
        f"{_scale(scales[0])} against {_scale(scales[-1])}: p = {p_scales:.2g}). Per agent, over its scales: "
        + ", ".join(f"{agent} {sum(oks)} of {len(oks)}" for agent, oks in sorted(per_agent.items()))
        + f"; the most, {best}, against the others: {sum(mine)} of {len(mine)} against {sum(rest)} of {len(rest)} "
        f"(p = {p_best:.2g})."
    ]


BUCKETS = {"uniform_symlog": "symlog (2023)", "symexp": "symexp (2024)"}


@table("critic_transient")
def critic_transient(files):
    """`benchmarks/agents/critic_transient.py`: per critic learning rate, buckets and reward scale, the critic's
    symlog error and relative bias at the last update, and the run's final return."""
    from benchmarks.agents.plot_curves import final_return

    results = files[0]
    lines = [
        "| critic learning rate, buckets | scale | symlog error | relative bias | final return |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, run in results["runs"].items():
        lr, scheme = name.split()[0].split(":")
        _, _, error, bias = run["critic"][-1]
        lines.append(
            f"| {lr}, {BUCKETS.get(scheme, scheme)} | {_scale(run['reward_scale'])} | {error:.2f} | {bias:.2f} | "
            f"{final_return(run['episodes'], run['steps']):.0f} |"
        )
    run = next(iter(results["runs"].values()))
    return lines + [
        "",
        f"{run['env']}, seed {run['seed']}, after {run['steps']:,} steps (the last update, step "
        f"{run['critic'][-1][0]:,}); `{results['command']}`.",
    ]


@table("critic_transient_bias")
def critic_transient_bias(files, at="5600,16000"):
    """The first phase in numbers: how far below the returns the slowest critic (the largest scale, the 2023
    buckets, the smallest learning rate) ended, and the relative bias of the symexp critic at each scale at the
    updates nearest the steps `at` and at the end."""
    runs = files[0]["runs"]
    slow = min(
        (name for name in runs if "uniform_symlog" in name),
        key=lambda name: (float(name.split(":")[0]), -runs[name]["reward_scale"]),
    )
    bias = runs[slow]["critic"][-1][3]
    lr, _ = slow.split()[0].split(":")
    text = (
        f"At {lr} with the 2023 buckets the scale-{_scale(runs[slow]['reward_scale'])} critic's values were "
        f"1/{1 / (1 + bias):.0f} of the returns at the last update."
    )
    symexp = [run for name, run in runs.items() if ":symexp" in name]
    if len(symexp) > 1:
        symexp.sort(key=lambda run: run["reward_scale"])
        points = []
        for step in [int(s) for s in at.split(",")]:
            nearest = min(symexp[0]["critic"], key=lambda c: abs(c[0] - step))[0]
            values = [next(c[3] for c in run["critic"] if c[0] == nearest) for run in symexp]
            points.append(f"{' / '.join(f'{v:.2f}' for v in values)} after {nearest:,} steps")
        ends = " / ".join(f"{run['critic'][-1][3]:.2f}" for run in symexp)
        points.append(f"{ends} at the end")
        scales = _and([_scale(run["reward_scale"]) for run in symexp])
        text += f" With symexp buckets the relative bias at scales {scales} was {_and(points)}."
    return [text]


@table("ppo_scales_bias")
def ppo_scales_bias(files):
    """Per task, head and backend of a `ppo_scales.py` file: the final return at each scale (mean [min, max] over
    seeds) and the range of the critics' relative bias at the last update; then the file's command."""
    from benchmarks.agents.plot_curves import final_return

    groups: Dict[tuple, Dict[float, list]] = {}
    for run in files[0]["runs"].values():
        key = (run["env"], run["head"], run["backend"], run["steps"], run["hyperparameters"]["critic_lr"])
        groups.setdefault(key, {}).setdefault(run["reward_scale"], []).append(run)
    out = []
    for (env, head, backend, steps, lr), per_scale in sorted(groups.items()):
        scales = sorted(per_scale)
        finals = [
            f"{_seeds([final_return(r['episodes'], r['steps']) for r in per_scale[s]])} at scale {_scale(s)}"
            for s in scales
        ]
        biases = []
        for s in scales:
            values = sorted((r["critic"][-1][3] for r in per_scale[s]), key=abs)
            biases.append(f"{values[0]:.2f} to {values[-1]:.2f}")
        out.append(
            f"With a critic learning rate of {_scale(lr)} and {steps:,} {env} steps "
            f"({FRAMEWORKS.get(backend, backend)}, {head}, {len(per_scale[scales[0]])} seeds), the final returns "
            f"were {_and(finals)}, and the critics' relative bias at the last update {_and(biases)}."
        )
    return [" ".join(out), "", f"`{files[0]['command']}`"]


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
    ("r2dreamer", ("r2dreamer",)),
    ("official (2024)", ("dreamerv3",)),
)
# Each row: the codebases' cells, in CODEBASES' order; multicritic's cell is `comparison`'s.
CODEBASE_ROWS = {
    "frameworks": (
        "TensorFlow (ray ≤ 2.48) or PyTorch (≥ 2.49)",
        "PyTorch",
        "PyTorch",
        "PyTorch",
        "PyTorch",
        "JAX",
    ),
    "bin schemes": ("2023", "2023", "2024", "2023", "2024", "2024"),
    "slow-critic options: rate, period, regulariser weight and form, targets": (
        "fixed",
        "rate, period",
        "rate, weight",
        "rate, period",
        "rate, period",
        "rate, period, weight, targets",
    ),
    "value heads": ("two-hot", "two-hot", "two-hot, MSE", "two-hot", "two-hot", "two-hot"),
    "trunks": ("MLP",) * 6,
    "critic ensembles, reward streams": ("no",) * 6,
    "one checkpoint for every framework": ("–",) * 6,
    "loads / exports the others' critics": ("–",) * 6,
    "export for serving (SavedModel, ONNX, LiteRT)": ("no",) * 6,
}
# How the comparison names a registered part; a part not listed here shows as its name.
PART_LABELS = {
    "two_hot": "two-hot",
    "hl_gauss": "HL-Gauss",
    "mse": "MSE",
    "quantile": "quantile",
    "mlp": "MLP",
    "simba_v2": "SimbaV2",
    "xqc": "XQC",
}
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


@table("two_tasks")
def two_tasks(files):
    """Issue 74: one critic for two tasks 1e4 apart with a per-task return normaliser, against per-task critics
    (`benchmarks/agents/two_tasks.py`): relative RMSE and normaliser scale S per task, the mean over seeds."""
    data = files[0]
    seeds = data["seeds"]

    def cell(run, key, task, fmt):
        values = []
        for seed in seeds:
            r = seed["runs"][run]
            values.append(r[key][r["tasks"].index(task)] if task in r["tasks"] else r[key][0])
        text = format(float(np.mean(values)), fmt)
        if len(values) > 1:
            text += f" ({format(min(values), fmt)} to {format(max(values), fmt)})"
        return text

    lines = [
        "| task | reward scale | rel. RMSE, one critic | rel. RMSE, its own critic | S, one critic: per-task "
        "normaliser | S, its own critic | S, one critic: one shared normaliser |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for task, scale in enumerate(data["settings"]["scales"]):
        own = f"task_{task}"
        lines.append(
            f"| {task} | {scale:g} | {cell('per_task', 'relative_rmse', task, '.3g')} | "
            f"{cell(own, 'relative_rmse', task, '.3g')} | {cell('per_task', 'scale', task, '.3g')} | "
            f"{cell(own, 'scale', task, '.3g')} | {cell('shared', 'scale', 0, '.3g')} |"
        )
    c = data["settings"]
    same = all(seed["runs"]["per_task"]["relative_rmse"] == seed["runs"]["shared"]["relative_rmse"] for seed in seeds)
    versions = ", ".join(f"{name} {v}" for name, v in data["environment"]["versions"].items() if v)
    lines += [
        "",
        f"{c['size']} critics, {c['bins']} bins, {c['steps']} steps of {c['batch']} dreams per task, seed"
        f"{'s' * (len(seeds) > 1)} {', '.join(str(s['seed']) for s in seeds)}; {data['backend']}, {versions}. "
        + (
            "The one critic with one shared normaliser learned exactly the same values (the normaliser does not "
            "enter the critic's loss)."
            if same
            else "The one critic with one shared normaliser learned other values than with the per-task one."
        ),
    ]
    return lines


@table("slowest_call")
def slowest_call(files):
    """The default trainer's long runs (`benchmarks/ours/slowest_call.py`): per backend and cache state, the
    first call, the slowest later call, the median later call and where each compilation happened."""
    data = files[0]
    lines = [
        "| backend | caches | first call (s) | slowest later call (ms) | at call | median (ms) | p99 (ms) | run (s) "
        "| compilations after a shape's first call |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["records"]:
        later = sum(1 for e in r["compilations"] if e["call"] > 0)
        lines.append(
            f"| {r['backend']} | {r['caches']} | {r['first_call_s']:.2f} | {r['slowest_later_call_s'] * 1e3:.1f} | "
            f"{r['slowest_later_call']} | {r['median_later_ms']:.2f} | {r['p99_later_ms']:.2f} | {r['total_s']:.1f} "
            f"| {later} |"
        )
    r = data["records"][0]
    lines += [
        "",
        f"{r['calls']} calls of `train_step`, size {r['size']}, batch {r['batch']}, `CriticTrainer` defaults.",
    ]
    return lines


# ---------------------------------------------------------------- the critic comparison (docs/critic-comparison.md)


def _snapshot(items, runs=None):
    """The first `runs` items of a grid's results (`runs=all` or none: every one). A page quotes a grid still
    running as of a count of its runs, so that the runs written after it leave the page as it was; the count
    goes up (or becomes `all`) when the page is rendered again."""
    items = list(items)
    return items if runs in (None, "all") else items[: int(runs)]


def _support_key(support):
    return None if support is None else tuple(float(b) for b in support)


def support_label(support) -> str:
    return "default" if support is None else f"[{support[0]:g}, {support[1]:g}] (wrong)"


def _median_range(values, scale=100.0, fmt=".2f", unit="%") -> str:
    """`median [min, max]` of per-seed values (the value alone for one seed), times `scale`."""
    if not values:
        return ""
    v = [scale * x for x in values]
    text = f"{format(float(np.median(v)), fmt)}{unit}"
    return text if len(v) == 1 else f"{text} [{format(min(v), fmt)}, {format(max(v), fmt)}]"


def _cmp(part, reference, center=np.median, least=2):
    """`"better"`, `"worse"` or `"same"`: lower is better; the part's median (`center`) against the reference's
    seed range (below its lowest seed, above its highest, or inside it); None with fewer than `least` seeds on
    either side (one seed's range is a point: any difference would count)."""
    if len(part) < least or len(reference) < least:
        return None
    middle = float(center(part))
    return "better" if middle < min(reference) else "worse" if middle > max(reference) else "same"


def _verdict_text(verdicts: dict, fmt) -> str:
    """`"worse at 1e3 and 1e6 (...), no clear difference at 1"` from `{scale: (verdict, part, reference)}`."""
    words = {"better": "better", "worse": "worse", "same": "no clear difference"}
    parts = []
    for kind in ("better", "worse", "same"):
        at = [(s, p, r) for s, (v, p, r) in verdicts.items() if v == kind]
        if not at:
            continue
        text = f"{words[kind]} at {_and([f'{s:g}' for s, _, _ in at])}"
        if kind != "same":
            text += f" ({_and([f'{fmt(p)} against {fmt(r)}' for _, p, r in at])})"
        parts.append(text)
    return ", ".join(parts)


def bins_label(head: str, bins: str) -> str:
    """A demo run's bins, or "n/a (no buckets)" for a head without buckets (as `head_label`)."""
    from multicritic.heads import HEADS

    layer = HEADS[head]()
    return bins if layer.units == layer.num_buckets else "n/a (no buckets)"


def comparison_demo_cells(data, runs=None):
    """`(rows, trunks, scales, cells)` of `benchmarks/ours/critic_comparison.py demo`'s JSON: the rows `[(head,
    initial support, bins)]` and the trunks in the plan's order, the reward scales, and `{(head, trunk, support,
    bins): [runs]}` of the first `runs` runs."""
    planned = [(h, t, _support_key(s), b) for h, t, s, b, _ in data["planned"]]
    rows = list(dict.fromkeys((h, s, b) for h, _, s, b in planned))
    trunks = list(dict.fromkeys(t for _, t, _, _ in planned))
    cells = {}
    for run in _snapshot(data["runs"], runs):
        cells.setdefault((run["head"], run["trunk"], _support_key(run["support"]), run["bins"]), []).append(run)
    return rows, trunks, list(data["scales"]), cells


def _ms_per_step(runs) -> float:
    """The median over runs of each run's median over its scales of milliseconds per step."""
    return float(np.median([np.median([1e3 * s["seconds_per_step"] for s in r["scales"]]) for r in runs]))


def _demo_footer(data, taken) -> List[str]:
    c = taken[0]["config"] if taken else {}
    loads = [r["load_average"] for r in taken]
    seeds = sorted({p[-1] for p in data["planned"]})
    line = (
        f"{len(taken)} of {len(data['planned'])} runs (seeds {', '.join(map(str, seeds))}). "
        f"{data['backend']}, Keras {data['keras']}, size {c.get('size', '')}, {c.get('steps', '')} steps per scale."
    )
    if loads:
        line += (
            f" The runs shared a busy machine ({data['cpus']} CPUs; 1-minute load average when a run started: "
            f"median {np.median(loads):.1f}, up to {max(loads):.1f}): its cost per step is to be measured again on "
            "a quiet one."
        )
    return ["", line]


@table("critic_comparison_demo")
def critic_comparison_demo(files, show="rmse", runs=None):
    """The demo's MRP per value head x trunk (`benchmarks/ours/critic_comparison.py demo`), of the file's first
    `runs` runs: `show=rmse`, the final relative RMSE per reward scale; `show=steps`, the first evaluated step
    at the file's target relative RMSE per scale and the milliseconds per step; median over the seeds [min,
    max]; a row per planned combination, empty until its first run."""
    data = files[0]
    rows, trunks, scales, cells = comparison_demo_cells(data, runs)
    planned = {(h, t, _support_key(s), b) for h, t, s, b, _ in data["planned"]}
    taken = _snapshot(data["runs"], runs)
    target = f"{100 * data['target']:g}%"
    columns = [f"rel. RMSE @ {s:g}" for s in scales]
    if show == "steps":
        columns = [f"steps to {target} @ {s:g}" for s in scales] + ["ms / step"]
    lines = [
        "| head | trunk | bins | initial support | seeds | " + " | ".join(columns) + " |",
        "|---|---|---|---|---:|" + "---:|" * len(columns),
    ]
    for head, support, bins in rows:
        for trunk in trunks:
            if (head, trunk, support, bins) not in planned:
                continue
            done = cells.get((head, trunk, support, bins), [])
            if show == "steps":
                values = []
                for i in range(len(scales)):
                    at = [r["scales"][i]["steps_to_target"] for r in done]
                    reached = [a for a in at if a is not None]
                    if not at:
                        values.append("")
                        continue
                    median = float(np.median([np.inf if a is None else a for a in at]))
                    text = "not reached" if not np.isfinite(median) else f"{median:.0f}"
                    if 0 < len(reached) < len(at):
                        text += f" ({len(reached)}/{len(at)} reached)"
                    values.append(text)
                values.append(f"{_ms_per_step(done):.1f}" if done else "")
            else:
                values = [_median_range([r["scales"][i]["relative_rmse"] for r in done]) for i in range(len(scales))]
            lines.append(
                f"| {head} | {trunk} | {bins_label(head, bins)} | {support_label(support)} | {len(done)} | "
                + " | ".join(values)
                + " |"
            )
    if show == "rmse":
        note = "Median over the seeds [min, max]."
    else:
        note = (
            f"The demo evaluates every 100 steps; the median counts a run that never reached {target} as last. "
            "ms / step: the median over a run's scales (the first scale's time includes compiling the step), then "
            "over the runs."
        )
    return lines + ["", note] + _demo_footer(data, taken)


@table("critic_comparison_demo_verdicts")
def critic_comparison_demo_verdicts(files, runs=None):
    """Sentences on where a head, a trunk or the adaptive head's wrong start does not help on the demo's MRP,
    against the reference (two_hot on the MLP, symexp bins, the default support) and against two_hot on the
    same bins, from the file's first `runs` runs."""
    data = files[0]
    rows, trunks, scales, cells = comparison_demo_cells(data, runs)
    taken = _snapshot(data["runs"], runs)
    if not taken:
        return ["No run has finished yet."] + _demo_footer(data, taken)

    def errors(combo, i):
        return [r["scales"][i]["relative_rmse"] for r in cells.get(combo, [])]

    def versus(part, reference):
        verdicts = {}
        for i, s in enumerate(scales):
            p, r = errors(part, i), errors(reference, i)
            v = _cmp(p, r)
            if v is not None:
                verdicts[s] = (v, float(np.median(p)), float(np.median(r)))
        return verdicts

    def helps(*verdicts):
        return any(v == "better" for each in verdicts for v, _, _ in each.values())

    pct = lambda x: f"{100 * x:.2f}%"  # noqa: E731
    reference = ("two_hot", "mlp", None, "symexp")
    lines, idle = [], []  # idle: the parts better than what they are compared with at no scale
    control = ("two_hot", "mlp", None, "uniform_symlog")
    same_bins = versus(control, reference)
    if same_bins:
        lines.append(
            f"- **two_hot on uniform symlog bins** against symexp bins (MLP trunk): {_verdict_text(same_bins, pct)}."
        )
    for head, support, bins in rows:
        if head == "two_hot" or support is not None:
            continue
        verdicts = versus((head, "mlp", None, bins), reference)
        if not verdicts:
            continue
        what = f"{bins} bins" if bins_label(head, bins) == bins else "no buckets"
        text = f"- The **{head}** head (MLP trunk, {what}) against the reference: {_verdict_text(verdicts, pct)}"
        against_control = versus((head, "mlp", None, bins), ("two_hot", "mlp", None, bins)) if bins != "symexp" else {}
        if against_control:
            text += f"; against two_hot on the same bins: {_verdict_text(against_control, pct)}"
        lines.append(text + ("." if helps(verdicts, against_control) else "; it does not help on this task."))
        idle += [] if helps(verdicts, against_control) else [f"the {head} head"]
    for trunk in trunks:
        if trunk == "mlp":
            continue
        verdicts = versus(("two_hot", trunk, None, "symexp"), reference)
        if not verdicts:
            continue
        counts = {"better": 0, "worse": 0, "same": 0}
        for head, support, bins in rows:
            for i in range(len(scales)):
                v = _cmp(errors((head, trunk, support, bins), i), errors((head, "mlp", support, bins), i))
                if v is not None:
                    counts[v] += 1
        if not helps(verdicts):
            idle.append(f"the {trunk} trunk")
        lines.append(
            f"- The **{trunk}** trunk (two_hot head) against the MLP: {_verdict_text(verdicts, pct)}"
            + ("" if helps(verdicts) else "; it does not help on this task")
            + f". Over every head, bins and start, against the MLP with the same: better in {counts['better']}, "
            f"worse in {counts['worse']}, no clear difference in {counts['same']} of {sum(counts.values())} "
            "combinations x scales."
        )
    for head, support, bins in rows:
        if support is None:
            continue
        for trunk in trunks:
            verdicts = versus((head, trunk, support, bins), (head, trunk, None, bins))
            if not verdicts:
                continue
            ends = [r["scales"][-1]["final_support"] for r in cells[(head, trunk, support, bins)]]
            low, high = np.median(np.array(ends, dtype=float), axis=0)
            lines.append(
                f"- The **{head}** head on {trunk} started from {support_label(support)} against the default "
                f"start: {_verdict_text(verdicts, pct)}; at scale {scales[-1]:g} its support ended at "
                f"[{low:.1f}, {high:.1f}] (median over seeds)."
            )
    return [
        "Reference: two_hot on the MLP, symexp bins, the default support. Better (worse): the median final "
        "relative RMSE over the seeds lies below (above) every seed of what it is compared with; otherwise no "
        "clear difference; compared where both have two seeds or more.",
        "",
        *lines,
        "",
        f"In short, on this task these do not help (better at no reward scale than what each is compared with): "
        f"{_and(idle)}."
        if idle
        else "In short: every part compared is better somewhere on this task."
        if lines
        else "No part has runs to compare with the reference's yet.",
    ] + _demo_footer(data, taken)


def ppo_head(head: str):
    """`(head name, initial support or None)` of a head given on the agents' command line."""
    import ast

    name, _, options = head.partition(":")
    config = dict(item.split("=", 1) for item in options.split(",")) if options else {}
    if "lower_bound" in config or "upper_bound" in config:
        support = (float(ast.literal_eval(config.get("lower_bound", "-20"))),
                   float(ast.literal_eval(config.get("upper_bound", "20"))))  # fmt: skip
        return name, support
    return name, None


def comparison_ppo_cells(data, runs=None):
    """`(combos, envs, scales, cells)` of `critic_comparison.py ppo`'s JSON: the combinations `[(head, trunk)]`,
    tasks and reward scales in the plan's order, and `{(head, trunk, env, scale): [records]}` of the first
    `runs` runs."""
    combos, envs, scales = {}, {}, {}
    for name in data["plan"]["runs"]:
        _, env, head, scale, _, *trunk = name.split("/")
        combos[(head, trunk[0] if trunk else "mlp")] = envs[env] = scales[float(scale)] = None
    cells = {}
    for _, record in _snapshot(data["runs"].items(), runs):
        trunk = record.get("critic_options", {}).get("trunk", "mlp")
        cells.setdefault((record["head"], trunk, record["env"], record["reward_scale"]), []).append(record)
    return list(combos), list(envs), list(scales), cells


def _ppo_footer(data, runs, taken) -> List[str]:
    line = f"{len(taken)} of {len(data['plan']['runs'])} runs."
    if taken:
        line += (
            f" The Keras agent (`examples/ppo/keras_agent.py`) on {_and(sorted({r['backend'] for r in taken}))}, "
            f"{_and([str(s) for s in sorted({r['steps'] for r in taken})])} environment steps. Final return: the mean "
            "return of the episodes ending in the last 10% of a run's steps, in the task's own units; mean over the "
            "seeds [min, max]. ms / step: a run's seconds over its environment steps (acting, environment, "
            f"updates), the median over the runs; the runs shared a busy machine ({data['plan']['cpus']} CPUs), so "
            "the cost is to be measured again on a quiet one."
        )
    return ["", line]


@table("critic_comparison_ppo")
def critic_comparison_ppo(files, runs=None):
    """PPO's final return per head x trunk combination, task and reward scale (`benchmarks/ours/
    critic_comparison.py ppo`), of the file's first `runs` runs, with the milliseconds per environment step."""
    from benchmarks.agents.plot_curves import final_return

    data = files[0]
    combos, envs, scales, cells = comparison_ppo_cells(data, runs)
    taken = [record for _, record in _snapshot(data["runs"].items(), runs)]
    columns = [f"{env} x{s:g}" for env in envs for s in scales]
    lines = [
        "| head | trunk | initial support | runs | " + " | ".join(columns) + " | ms / step |",
        "|---|---|---|---:|" + "---:|" * (len(columns) + 1),
    ]
    for head, trunk in combos:
        name, support = ppo_head(head)
        values, done = [], []
        for env in envs:
            for s in scales:
                records = cells.get((head, trunk, env, s), [])
                done += records
                values.append(_seeds([final_return(r["episodes"], r["steps"]) for r in records]) if records else "")
        cost = f"{np.median([1e3 * r['seconds'] / r['steps'] for r in done]):.2f}" if done else ""
        lines.append(
            f"| {name} | {trunk} | {support_label(support)} | {len(done)} | " + " | ".join(values) + f" | {cost} |"
        )
    return lines + _ppo_footer(data, runs, taken)


@table("critic_comparison_ppo_verdicts")
def critic_comparison_ppo_verdicts(files, runs=None):
    """Sentences on where a combination does not help PPO, against two_hot on the MLP, per task and reward scale,
    from the file's first `runs` runs."""
    from benchmarks.agents.plot_curves import final_return

    data = files[0]
    combos, envs, scales, cells = comparison_ppo_cells(data, runs)
    taken = [record for _, record in _snapshot(data["runs"].items(), runs)]
    if not taken:
        return ["No run has finished yet."] + _ppo_footer(data, runs, taken)

    def returns(head, trunk, env, s):
        return [final_return(r["episodes"], r["steps"]) for r in cells.get((head, trunk, env, s), [])]

    lines, idle = [], []  # idle: the combinations better than the reference nowhere
    for head, trunk in combos:
        if (head, trunk) == ("two_hot", "mlp"):
            continue
        name, support = ppo_head(head)
        label = f"**{name}** on {trunk}" + ("" if support is None else f" started from {support_label(support)}")
        per_env = []
        helps = False
        for env in envs:
            verdicts = {}
            for s in scales:
                # Higher is better: compare the negated returns.
                p, r = returns(head, trunk, env, s), returns("two_hot", "mlp", env, s)
                v = _cmp([-x for x in p], [-x for x in r], center=np.mean)
                if v is not None:
                    verdicts[s] = (v, float(np.mean(p)), float(np.mean(r)))
            if verdicts:
                helps |= any(v == "better" for v, _, _ in verdicts.values())
                per_env.append(f"on {env}, {_verdict_text(verdicts, lambda x: f'{x:.0f}')}")
        if per_env:
            lines.append(f"- {label}: {'; '.join(per_env)}" + ("." if helps else "; it does not help on these tasks."))
            idle += [] if helps else [label]
    return [
        "Reference: two_hot on the MLP. Better (worse): the mean final return over the seeds lies above (below) "
        "every seed of the reference; otherwise no clear difference (at CartPole's ceiling, ties); compared where "
        "both have two seeds or more.",
        "",
        *lines,
        "",
        f"In short, on these tasks these do not help (better than the reference at no task and reward scale): "
        f"{_and(idle)}."
        if idle
        else "In short: every combination compared is better than the reference somewhere."
        if lines
        else "No combination has runs to compare with the reference's yet.",
    ] + _ppo_footer(data, runs, taken)


@table("critic_comparison_commands")
def critic_comparison_commands(files):
    """The commands that wrote the comparison's files, as a shell block: the demo driver's, the PPO driver's and
    each `ppo_scales.py` invocation it made."""
    lines = ["```bash"]
    for data in files:
        if "plan" in data:
            lines += [data["plan"]["command"], "# which runs, one after the other:", *data["plan"]["invocations"]]
        else:
            lines.append(f"KERAS_BACKEND={data['backend']} {data['command']}")
    return lines + ["```"]


if __name__ == "__main__":
    sys.exit(main())
