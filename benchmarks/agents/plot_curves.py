"""Learning-curve plots (matplotlib PNG) of the real agents' result files, and their summary table.

`sheeprl`: `benchmarks/agents/sheeprl_dreamer.py`'s JSON, one curve per critic (mean over seeds of the
episodes' returns, binned by environment steps, with the seeds' min-max band), the resume marked.
`official`: `benchmarks/agents/official_dreamer.py`'s JSON, the same (the first half's episodes up to the step the
second half restored).
`ppo`: `benchmarks/agents/ppo_scales.py`'s JSON, one panel per head (rows) and task (columns), one curve per
reward scale (returns in the environment's own units), each backend a line style.

    python benchmarks/agents/plot_curves.py sheeprl benchmarks/results/results_sheeprl_dreamer.json \\
        docs/images/agents_sheeprl_dreamer.png
    python benchmarks/agents/plot_curves.py official benchmarks/results/results_official_dreamer.json \\
        docs/images/agents_official_dreamer.png
    python benchmarks/agents/plot_curves.py ppo benchmarks/results/results_ppo_scales.json \\
        docs/images/agents_ppo_scales.png

`comparison`: `benchmarks/ours/critic_comparison.py ppo`'s JSON, one panel per task (rows) and reward scale
(columns), one curve per head x trunk combination (mean over seeds), the planned combinations in the legend.

    python benchmarks/agents/plot_curves.py comparison benchmarks/results/results_critic_comparison_ppo.json \\
        docs/images/critic_comparison_ppo.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import numpy as np


def binned(episodes, steps, bins):
    """Mean return of the episodes ending in each of `bins` equal spans of `[0, steps]` (NaN where none)."""
    edges = np.linspace(0, steps, bins + 1)
    out = np.full(bins, np.nan)
    if not episodes:
        return edges[1:], out
    at, returns = np.array(episodes, dtype=float).T
    index = np.clip(np.searchsorted(edges, at, side="left") - 1, 0, bins - 1)
    for b in range(bins):
        if np.any(index == b):
            out[b] = returns[index == b].mean()
    return edges[1:], out


def mean_curve(runs, bins):
    """`(steps, mean return)` of runs' curves binned alike, the mean over runs (NaN where no run has an
    episode in a bin)."""
    curves = [binned(r["episodes"], r["steps"], bins) for r in runs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return curves[0][0], np.nanmean([c for _, c in curves], 0)


def final_return(episodes, steps, fraction=0.1):
    """A run's final return: the mean return of the episodes ending in the last `fraction` of its steps
    (NaN when none did)."""
    ends = [r for at, r in episodes if at > (1 - fraction) * steps]
    return float(np.mean(ends)) if ends else float("nan")


def run_return(episodes, steps, bins=20):
    """A run's mean return over the whole run: the mean over `bins` equal spans of its steps of the returns
    ending there (an area under the learning curve: how fast it learned, where the final return only says
    where it ended)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(binned(episodes, steps, bins)[1]))


def learned(episodes, steps, fraction=0.1, by=0.1):
    """Whether a run left its start: its final return beats the mean return of the episodes ending in its first
    `fraction` of steps by more than `by` of that return's size. Acrobot's runs that never reach the goal end
    where they began, on the floor of -500, and this tells them from the runs that learned."""
    first = [r for at, r in episodes if at <= fraction * steps]
    if not first:
        return False
    start = float(np.mean(first))
    return bool(final_return(episodes, steps, fraction) > start + by * abs(start))


def ppo_finals(results, summary=final_return):
    """`{(env, head, backend): {scale: [summary per seed]}}` of `ppo_scales.py`'s runs, `summary(episodes,
    steps)` being `final_return` or `run_return`."""
    out = {}
    for run in results["runs"].values():
        key = (run["env"], run["head"], run["backend"])
        out.setdefault(key, {}).setdefault(run["reward_scale"], []).append(summary(run["episodes"], run["steps"]))
    return out


def within_spread(per_scale):
    """Whether each scale's mean final return lies within every other scale's seed range (min to max)."""
    means = {s: np.mean(v) for s, v in per_scale.items()}
    return all(min(per_scale[o]) <= means[s] <= max(per_scale[o]) for s in per_scale for o in per_scale)


def ranges_overlap(per_scale):
    """Whether every two scales' seed ranges (min to max) overlap: the looser reading of "within each other's
    spread", which stays meaningful where seeds tie at a task's ceiling (a range of one point)."""
    return all(min(per_scale[a]) <= max(per_scale[b]) for a in per_scale for b in per_scale)


def joined(halves):
    """A run's episodes, both halves joined: the first half's up to the step the second half resumed from
    (`restored_step`, where the driver records one: the official loop redoes the steps after its last save),
    then the second half's."""
    restored = halves[1].get("restored_step") if len(halves) > 1 else None
    first = [e for e in halves[0]["episodes"] if restored is None or e[0] <= restored]
    return first + [e for half in halves[1:] for e in half["episodes"]]


def leading_equal(episodes, reference):
    """How many of a run's first episodes end at the same step with the same return as `reference`'s."""
    count = 0
    for mine, theirs in zip(episodes, reference):
        if list(mine) != list(theirs):
            break
        count += 1
    return count


def sheeprl_curves(results, bins=16):
    """`{variant: (steps, mean over seeds, min, max, seeds)}` from the driver's runs (both halves joined)."""
    steps, per_variant = results["steps"], {}
    for key, halves in results["runs"].items():
        if len(halves) < 2:
            continue  # a run still going: its seed joins the curve when it has both halves
        variant, _ = key.split("/")
        episodes = joined(halves)
        per_variant.setdefault(variant, []).append(binned(episodes, steps, bins)[1])
    edges = binned([], steps, bins)[0]
    with warnings.catch_warnings():  # a span where no seed ended an episode stays NaN (a gap in the curve)
        warnings.simplefilter("ignore", RuntimeWarning)
        return {v: (edges, np.nanmean(c, 0), np.nanmin(c, 0), np.nanmax(c, 0), len(c)) for v, c in per_variant.items()}


# A style per critic: the swaps can give the stock run's returns exactly (sheeprl's), and a line drawn on
# another must still show, so each variant has its own dashes, marker and width, the first drawn widest.
VARIANT_STYLES = (
    {"linestyle": "-", "linewidth": 4.0, "alpha": 0.55},
    {"linestyle": "--", "linewidth": 1.6, "marker": "o", "markersize": 4},
    {"linestyle": "-.", "linewidth": 1.6, "marker": "s", "markersize": 4},
    {"linestyle": ":", "linewidth": 1.6, "marker": "^", "markersize": 4},
)


def plot_sheeprl(results, path, resume="resume (sheeprl's checkpoint)", title="sheeprl DreamerV3"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = sheeprl_curves(results)
    if len(curves) > len(VARIANT_STYLES):
        raise ValueError(f"results: got {len(curves)} critics, expected at most {len(VARIANT_STYLES)} (line styles)")
    fig, ax = plt.subplots(figsize=(7, 4))
    first = None
    for (variant, (x, mean, low, high, seeds)), style in zip(curves.items(), VARIANT_STYLES):
        label = f"{variant} ({seeds} seed{'s' * (seeds > 1)})"
        if first is not None and np.array_equal(mean, curves[first][1], equal_nan=True):
            label += f", the same curve as {first}"
        (line,) = ax.plot(x, mean, label=label, **style)
        ax.fill_between(x, low, high, color=line.get_color(), alpha=0.15)
        first = first or variant
    ax.axvline(results["steps"] / 2, color="gray", linestyle=":", label=resume)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episode return")
    ax.set_title(f"{title} on {results['env']}: its critic and multicritic's")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_official(results, path):
    """The official DreamerV3's curves (`official_dreamer.py`), drawn as sheeprl's."""
    plot_sheeprl(results, path, resume="resume (the official checkpoint)", title="The official DreamerV3 (JAX)")


# A line style per backend of the grid (five agents), dashes as matplotlib takes them.
LINE_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))


def plot_ppo(results, path, bins=20):
    """One panel per head (rows) and task (columns): a figure as narrow as a page's text, each panel wide
    enough to read the curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    runs = results["runs"].values()
    envs = sorted({r["env"] for r in runs})
    heads = sorted({r["head"] for r in runs})
    backends = sorted({r["backend"] for r in runs})
    if len(backends) > len(LINE_STYLES):
        raise ValueError(f"results: got {len(backends)} backends, expected at most {len(LINE_STYLES)} (line styles)")
    styles = dict(zip(backends, LINE_STYLES))
    scales = sorted({r["reward_scale"] for r in runs})
    legend = 0.5  # inches under the panels for the legend
    height = 2.6 * len(heads) + legend
    fig, axes = plt.subplots(len(heads), len(envs), figsize=(3.9 * len(envs), height), squeeze=False)
    for (i, head), (j, env) in ((a, b) for a in enumerate(heads) for b in enumerate(envs)):
        ax = axes[i][j]
        for k, scale in enumerate(scales):
            for backend, style in styles.items():
                chosen = [
                    r
                    for r in runs
                    if (r["env"], r["head"], r["reward_scale"], r["backend"]) == (env, head, scale, backend)
                ]
                if not chosen:
                    continue
                ax.plot(*mean_curve(chosen, bins), linestyle=style, color=f"C{k}", linewidth=1.3)
        ax.set_title(f"{env}, {head}", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda steps, _: f"{steps / 1000:g}k"))
        if i == len(heads) - 1:
            ax.set_xlabel("environment steps", fontsize=8)
        if j == 0:
            ax.set_ylabel("return", fontsize=8)
    # One legend for the figure: colour is the reward scale, line style the backend (the seeds: the tables).
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=f"C{k}", label=f"reward x{s:g}") for k, s in enumerate(scales)]
    handles += [Line2D([], [], color="k", linestyle=styles[b], label=b) for b in backends]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, legend / height, 1, 1))
    fig.savefig(path, dpi=110)


def plot_comparison(results, path, bins=20, runs=None):
    """The critic comparison's PPO curves: a panel per task (rows) and reward scale (columns), a colour and line
    style per head x trunk combination (the mean over its seeds), in the plan's order; of the file's first `runs`
    runs (all by default), as the page's tables quote them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
    from benchmarks.render_tables import ppo_head, support_label, comparison_ppo_cells

    combos, envs, scales, cells = comparison_ppo_cells(results, runs)
    legend = 0.25 * ((len(combos) + 2) // 3) + 0.3  # inches under the panels for the legend
    height = 2.6 * len(envs) + legend
    fig, axes = plt.subplots(len(envs), len(scales), figsize=(3.9 * len(scales), height), squeeze=False)
    styles = [(f"C{k % 10}", LINE_STYLES[k % 4]) for k in range(len(combos))]
    for (i, env), (j, scale) in ((a, b) for a in enumerate(envs) for b in enumerate(scales)):
        ax = axes[i][j]
        for (head, trunk), (color, style) in zip(combos, styles):
            runs = cells.get((head, trunk, env, scale), [])
            if not runs:
                continue
            ax.plot(*mean_curve(runs, bins), color=color, linestyle=style, linewidth=1.3)
        if not any(cells.get((head, trunk, env, scale)) for head, trunk in combos):
            ax.text(0.5, 0.5, "no run yet", transform=ax.transAxes, ha="center", va="center", color="0.5")
            ax.set_xticks([])
            ax.set_yticks([])
        ax.set_title(f"{env}, reward x{scale:g}", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda steps, _: f"{steps / 1000:g}k"))
        if i == len(envs) - 1:
            ax.set_xlabel("environment steps", fontsize=8)
        if j == 0:
            ax.set_ylabel("return", fontsize=8)

    def label(head, trunk):
        name, support = ppo_head(head)
        return f"{name}, {trunk}" + ("" if support is None else f", start {support_label(support)}")

    handles = [
        Line2D([], [], color=color, linestyle=style, label=label(*combo))
        for combo, (color, style) in zip(combos, styles)
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    done = sum(len(records) for records in cells.values())
    fig.suptitle(f"PPO, value head x trunk ({done} of {len(results['plan']['runs'])} runs)", fontsize=10)
    fig.tight_layout(rect=(0, legend / height, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    plots = {"sheeprl": plot_sheeprl, "official": plot_official, "ppo": plot_ppo, "comparison": plot_comparison}
    parser.add_argument("kind", choices=tuple(plots))
    parser.add_argument("results")
    parser.add_argument("png")
    args = parser.parse_args(argv)
    with open(args.results) as f:
        results = json.load(f)
    plots[args.kind](results, args.png)


if __name__ == "__main__":
    main()
