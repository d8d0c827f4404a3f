"""The demo per value head and ensemble size (tables of the docs, docs/heads-ensembles-streams.md).

Runs `multicritic demo` (its defaults: size mini, 1500 steps, reward scales
1, 1e3, 1e6, seed 0) for every registered head with one member (and the MLP
trunk), every other registered trunk (with the two-hot head), two_hot and
hl_gauss with an ensemble of 5 (aggregation mean), one after the other in
this process, plus two_hot on the uniform_symlog bins (the bins hl_gauss must
use, so the head and the bin scheme can be told apart). Runs already in the
JSON are kept, so a new part's rows are added alone. Writes every run to
benchmarks/results/results_demo_heads.json (after each run, so a partial
grid survives) and prints the two markdown tables: relative RMSE per scale,
and for the ensembles the correlation of member spread with the error.

    KERAS_BACKEND=jax python benchmarks/ours/demo_heads.py
    python benchmarks/ours/demo_heads.py --table    # the tables again, from the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "results_demo_heads.json")

# (head, trunk, ensemble, bin_scheme or None for the demo's default for the head, in the docs table): the
# first rows as first measured, then every other registered head and trunk (a new part gets its row).
FIRST = (
    ("two_hot", "mlp", 1, None, True),
    ("hl_gauss", "mlp", 1, None, True),
    ("mse", "mlp", 1, None, True),
    ("two_hot", "mlp", 5, None, True),
    ("hl_gauss", "mlp", 5, None, True),
    ("two_hot", "mlp", 1, "uniform_symlog", False),  # control: the head vs the bins
)


def grid():
    from multicritic.heads import HEADS
    from multicritic.trunks import TRUNKS

    rows = list(FIRST)
    rows += [(h, "mlp", 1, None, True) for h in HEADS if (h, "mlp", 1, None, True) not in rows]
    rows += [("two_hot", t, 1, None, True) for t in TRUNKS if ("two_hot", t, 1, None, True) not in rows]
    return rows


def _key(config) -> tuple:
    return (config["head"], config.get("trunk", "mlp"), config["ensemble"], config["bin_scheme"])


def run_grid(path: str = OUT) -> dict:
    import keras

    from multicritic.demo.run import DemoConfig, run_demo, summary_table, to_json

    data = {"backend": keras.backend.backend(), "keras": keras.__version__, "runs": []}
    if os.path.exists(path):  # runs already measured stay as they are
        with open(path) as f:
            data = json.load(f)
    done = {_key(run["config"]) for run in data["runs"]}
    for head, trunk, ensemble, bin_scheme, main_table in grid():
        config = DemoConfig(head=head, trunk=trunk, ensemble=ensemble, bin_scheme=bin_scheme, aggregation="mean")
        if _key(vars(config)) in done:
            continue
        print(f"== head {head}, trunk {trunk}, ensemble {ensemble}, {config.bin_scheme} bins", flush=True)
        start = time.perf_counter()
        results = run_demo(config, progress=False)
        run = to_json(config, results, include_values=False)
        run.pop("backend")
        run["wall_seconds"] = time.perf_counter() - start
        run["main_table"] = main_table
        data["runs"].append(run)
        print(summary_table(results), flush=True)
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
    return data


def _label(run: dict) -> str:
    from benchmarks.render_tables import head_label

    return head_label(run)


def tables(data: dict) -> str:
    runs = data["runs"]
    scales = [s["reward_scale"] for s in runs[0]["scales"]]
    lines = [
        "| head | ensemble | bins | " + " | ".join(f"rel. RMSE @ {s:g}" for s in scales) + " | seconds (3 scales) |",
        "|---|---:|---|" + "---:|" * (len(scales) + 1),
    ]
    for run in runs:
        errors = " | ".join(f"{100 * s['relative_rmse']:.2f}%" for s in run["scales"])
        seconds = sum(s["seconds"] for s in run["scales"])
        lines.append(f"| {_label(run)} | {errors} | {seconds:.0f} |")
    lines += [
        "",
        "| head | ensemble | reward scale | rel. RMSE | rel. member spread | Pearson(spread, abs. error) | "
        "Spearman(spread, abs. error) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        if run["config"]["ensemble"] == 1:
            continue
        for s in run["scales"]:
            lines.append(
                f"| {run['config']['head']} | {run['config']['ensemble']} | {s['reward_scale']:g} | "
                f"{100 * s['relative_rmse']:.2f}% | {100 * s['relative_member_spread']:.2f}% | "
                f"{s['member_spread_error_pearson']:+.2f} | {s['member_spread_error_spearman']:+.2f} |"
            )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", action="store_true", help="only print the tables of an existing JSON")
    parser.add_argument("--out", default=OUT, help=f"the JSON (default: {OUT})")
    args = parser.parse_args()
    if args.table:
        with open(args.out) as f:
            data = json.load(f)
    else:
        data = run_grid(args.out)
    print(tables(data))


if __name__ == "__main__":
    main()
