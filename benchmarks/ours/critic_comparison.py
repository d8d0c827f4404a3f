"""The critic comparison (docs/critic-comparison.md): value heads x trunks on the demo's MRP and in PPO.

`demo`: `multicritic demo` (its defaults: size mini, 1500 steps, reward scales 1, 1e3 and 1e6) for every
registered head x trunk pair, plus the adaptive head started from a deliberately wrong support
(`WRONG_SUPPORT`, symlog [-1, 1]: values within +-1.72, where the exact values reach millions at scale 1e6)
and two_hot on uniform symlog bins (the bins hl_gauss and adaptive must use), each with every trunk,
over seeds 0, 1 and 2 (a seed draws the MDP, the critic's initial weights and the rollouts). Per run and
scale it records the final relative RMSE, the first evaluated step whose relative RMSE is at most
`--target` (5%; the demo evaluates every 100 steps; None: not reached), the seconds per step (the first
scale's include compiling the step), and for the adaptive head the support it ended with. The seeds are the
outer loop (a partial grid has every combination of the first seed first); runs already in the JSON are
skipped, and the JSON is written after each run, so the grid resumes where it stopped.

`ppo`: `benchmarks/agents/ppo_scales.py` (the Keras agent on JAX) for the combinations in `PPO_GROUPS`, one
invocation per seed and group, all into one JSON, whose `plan` lists every run of the grid and the
invocations (`ppo_scales.py` keeps it).

`plot`: the demo's final errors as one heat map per reward scale, and PPO's learning curves
(`benchmarks/agents/plot_curves.py comparison`), into docs/images/.

    KERAS_BACKEND=jax python benchmarks/ours/critic_comparison.py demo
    python benchmarks/ours/critic_comparison.py ppo --workers 1
    python benchmarks/ours/critic_comparison.py plot
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
RESULTS = os.path.join(ROOT, "benchmarks", "results")
DEMO_JSON = os.path.join(RESULTS, "results_critic_comparison_demo.json")
PPO_JSON = os.path.join(RESULTS, "results_critic_comparison_ppo.json")
DEMO_PNG = os.path.join(ROOT, "docs", "images", "critic_comparison_demo.png")
PPO_PNG = os.path.join(ROOT, "docs", "images", "critic_comparison_ppo.png")

# The adaptive head's deliberately wrong start: a symlog support of [-1, 1] (real values within +-1.72). The
# demo's exact values reach 3.8 to 6.3 in magnitude at reward scale 1 for seeds 0 to 2 (symlog 1.6 to 2.0), and
# millions at 1e6 (symlog 15 to 16); PPO's discounted returns reach about 100 on CartPole and -100 on Acrobot at
# scale 1 (symlog 4.6). Too narrow at every scale, far too narrow at 1e6. The critic's default is [-20, 20].
WRONG_SUPPORT = (-1.0, 1.0)
WRONG_HEAD = f"adaptive:lower_bound={WRONG_SUPPORT[0]!r},upper_bound={WRONG_SUPPORT[1]!r}"

# PPO's combinations, as (heads, trunks) products: the reference (two_hot, mlp) with every trunk, HL-Gauss on
# XQC (the newer papers' head and trunk together), the MSE head and the adaptive head (right and wrong start) on
# the MLP (docs/critic-comparison.md says why each).
PPO_GROUPS = (
    (("two_hot",), ("mlp", "simba_v2", "xqc", "residual")),
    (("hl_gauss",), ("xqc",)),
    (("mse", "adaptive", WRONG_HEAD), ("mlp",)),
)


def _relative(path: str) -> str:
    """A path as the command line should record it: relative to the repository where it lies inside it."""
    full = os.path.abspath(path)
    return os.path.relpath(full, ROOT) if full.startswith(ROOT + os.sep) else path


def _write(data: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------- the demo grid


def demo_key(head: str, trunk: str, support, bins: str, seed: int) -> str:
    return f"{head}/{trunk}/{'default' if support is None else '{:g},{:g}'.format(*support)}/{bins}/{seed}"


SETS = ("pairs", "wrong", "control")


def demo_grid(heads, trunks, seeds, sets=SETS) -> list:
    """`[(head, trunk, initial support or None for the critic's default, bins, seed)]` in run order, seed by
    seed: `pairs`, each head with every trunk (the demo's bins for the head); `wrong`, the adaptive head from
    `WRONG_SUPPORT` with every trunk; `control`, two_hot on uniform symlog bins with every trunk (the bins
    hl_gauss and adaptive must use: a head told from its bins)."""
    from multicritic.demo.config import default_bin_scheme

    combos = [(h, t, None, default_bin_scheme(h)) for h in heads for t in trunks] if "pairs" in sets else []
    if "wrong" in sets and "adaptive" in heads:
        combos += [("adaptive", t, WRONG_SUPPORT, default_bin_scheme("adaptive")) for t in trunks]
    if "control" in sets and "two_hot" in heads:
        combos += [("two_hot", t, None, "uniform_symlog") for t in trunks]
    return [(h, t, s, b, seed) for seed in seeds for h, t, s, b in combos]


def steps_to(curve, target: float):
    """The first evaluated step whose relative RMSE is at most `target`, or None."""
    return next((int(step) for step, error in curve if error <= target), None)


@contextlib.contextmanager
def demo_hooks(support, supports: list):
    """While open, the demo builds its critics with the initial `support` (symlog `(low, high)`; None: the
    critic's default) and appends to `supports` the adaptive head's support after each scale's training (None
    for another head). The demo's settings have no support option, so this wraps the two names of
    `multicritic.demo.run` it calls them through."""
    from multicritic.demo import run as demo
    from multicritic.heads.adaptive import AdaptiveSupportHead

    make, train = demo.CriticNetwork, demo.train_one_scale

    def critic(**options):
        if support is not None:
            options.update(lower_bound=float(support[0]), upper_bound=float(support[1]))
        return make(**options)

    def train_scale(config, mdp, h, z, progress=True, session=None):
        result = train(config, mdp, h, z, progress=progress, session=session)
        layer = None if session is None else session.critic.return_layer
        if isinstance(layer, AdaptiveSupportHead):
            import keras

            supports.append([float(b) for b in keras.ops.convert_to_numpy(layer.support)])
        else:
            supports.append(None)
        return result

    demo.CriticNetwork, demo.train_one_scale = critic, train_scale
    try:
        yield
    finally:
        demo.CriticNetwork, demo.train_one_scale = make, train


def demo_run(head, trunk, support, bins, seed, *, scales, size, steps, target) -> dict:
    """One run of the demo grid, in this process: `{"run": record, "backend", "keras", "environment"}`."""
    import keras

    from multicritic.demo.run import DemoConfig, run_demo, to_json

    config = DemoConfig(
        head=head, trunk=trunk, bin_scheme=bins, seed=seed, size=size, steps=steps, scales=tuple(scales)
    )
    load = os.getloadavg()[0]
    supports = []
    start = time.perf_counter()
    with demo_hooks(support, supports):
        results = run_demo(config, progress=False, log=lambda message: None)
    wall = time.perf_counter() - start
    record = to_json(config, results, include_values=False)
    for item, final_support in zip(record["scales"], supports):
        item["seconds_per_step"] = item["seconds"] / item["steps"]
        item["steps_to_target"] = steps_to(item["curve"], target)
        item["final_support"] = final_support
    run = {
        "head": head,
        "trunk": trunk,
        "support": None if support is None else list(support),
        "bins": bins,
        "seed": seed,
        "config": record["config"],
        "scales": record["scales"],
        "wall_seconds": wall,
        "load_average": load,  # the 1-minute load average when the run started (the machine was shared)
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - wall)),
    }
    return {
        "run": run,
        "backend": keras.backend.backend(),
        "keras": keras.__version__,
        "environment": record["environment"],
    }


def _environ() -> dict:
    """This process's environment with the checkout on `PYTHONPATH`: the child processes import the package
    from it where it is not installed."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}


def run_demo_grid(args, command: str) -> dict:
    """Each run in a process of its own (`demo-run`: a fresh JAX, pinned by the demo, and the package as it is
    when the run starts); a run that fails is reported and left for the next call."""
    plan = demo_grid(args.heads, args.trunks, args.seeds, args.sets)
    data = {"runs": []}
    if os.path.exists(args.json):  # runs already measured stay as they are
        with open(args.json) as f:
            data = json.load(f)
    planned = [(h, t, None if s is None else tuple(s), b, seed) for h, t, s, b, seed in data.get("planned", [])]
    planned += [p for p in plan if p not in planned]
    data.update(
        command=command,
        target=args.target,
        scales=list(args.scales),
        wrong_support=list(WRONG_SUPPORT),
        planned=[[h, t, None if s is None else list(s), b, seed] for h, t, s, b, seed in planned],
        cpus=os.cpu_count(),
    )
    data.setdefault("runs", [])
    done = {demo_key(r["head"], r["trunk"], r["support"], r["bins"], r["seed"]) for r in data["runs"]}
    failed = []
    for head, trunk, support, bins, seed in plan:
        name = demo_key(head, trunk, support, bins, seed)
        if name in done:
            continue
        print(f"== {name}", flush=True)
        with tempfile.TemporaryDirectory() as folder:
            out = os.path.join(folder, "run.json")
            child = [sys.executable, os.path.abspath(__file__), "demo-run", "--out", out, "--head", head]
            child += ["--trunk", trunk, "--bins", bins, "--seed", str(seed), "--size", args.size]
            child += ["--steps", str(args.steps), "--target", str(args.target), "--scales", *map(repr, args.scales)]
            if support is not None:
                child += ["--support", *map(repr, support)]
            result = subprocess.run(child, capture_output=True, text=True, cwd=ROOT, env=_environ())
            if result.returncode:
                failed.append(name)
                print(f"   failed (left for the next call):\n{(result.stdout + result.stderr)[-3000:]}", flush=True)
                continue
            with open(out) as f:
                made = json.load(f)
        data.setdefault("backend", made["backend"])
        data.setdefault("keras", made["keras"])
        data.setdefault("environment", made["environment"])
        data["runs"].append(made["run"])
        _write(data, args.json)
        errors = ", ".join(f"{s['reward_scale']:g}: {100 * s['relative_rmse']:.2f}%" for s in made["run"]["scales"])
        print(f"   {errors}; {made['run']['wall_seconds']:.0f} s", flush=True)
    _write(data, args.json)
    if failed:
        raise SystemExit(f"{len(failed)} run(s) failed, to be run again: {', '.join(failed)}")
    return data


# ---------------------------------------------------------------- the PPO grid


def ppo_groups(heads=None, trunks=None):
    """`PPO_GROUPS`, or the one group `heads` x `trunks` where either is given."""
    if heads or trunks:
        return ((tuple(heads or ("two_hot",)), tuple(trunks or ("mlp",))),)
    return PPO_GROUPS


def run_ppo_grid(args, command: str) -> dict:
    from benchmarks.agents.ppo_scales import key

    script = os.path.join("benchmarks", "agents", "ppo_scales.py")
    groups = ppo_groups(args.heads, args.trunks)
    invocations, planned = [], []
    for seed in args.seeds:
        for heads, trunks in groups:
            invocations.append(
                [
                    script,
                    "--backends",
                    args.backend,
                    "--envs",
                    *args.envs,
                    "--heads",
                    *heads,
                    "--trunks",
                    *trunks,
                    "--scales",
                    *args.scales,
                    "--seeds",
                    str(seed),
                    "--steps",
                    str(args.steps),
                    "--workers",
                    str(args.workers),
                    "--json",
                    _relative(os.path.abspath(args.json)),
                ]
            )
            for env in args.envs:
                for head in heads:
                    for scale in args.scales:
                        planned += [key(args.backend, env, head, float(scale), seed, t) for t in trunks]
    data = {"runs": {}}
    if os.path.exists(args.json):
        with open(args.json) as f:
            data = json.load(f)
    old = data.get("plan", {})
    data["plan"] = {
        "command": command,
        "runs": old.get("runs", []) + [k for k in planned if k not in old.get("runs", [])],
        "invocations": [" ".join(["python", *i]) for i in invocations],
        "cpus": os.cpu_count(),
    }
    data.setdefault("runs", {})
    _write(data, args.json)
    if args.plan_only:
        return data
    failed = []
    for invocation in invocations:  # a failed run fails its invocation after the others of it ran
        print("==", " ".join(["python", *invocation]), flush=True)
        if subprocess.run([sys.executable, *invocation], cwd=ROOT, env=_environ()).returncode:
            failed.append(" ".join(["python", *invocation]))
    if failed:
        raise SystemExit(f"{len(failed)} invocation(s) had a failed run, to be run again: {'; '.join(failed)}")
    with open(args.json) as f:
        return json.load(f)


# ---------------------------------------------------------------- the plots


def plot_demo(data: dict, path: str, runs=None) -> None:
    """One heat map per reward scale: the median over seeds of the final relative RMSE, heads (rows) by trunks
    (columns), of the file's first `runs` runs (all by default); a grey cell has no run yet."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LogNorm

    from benchmarks.render_tables import comparison_demo_cells

    rows, trunks, scales, cells = comparison_demo_cells(data, runs)
    fig, axes = plt.subplots(1, len(scales), figsize=(3.6 * len(scales) + 1.2, 0.45 * len(rows) + 1.6))
    axes = np.atleast_1d(axes)
    norm = LogNorm(vmin=0.005, vmax=1.0)
    for ax, scale in zip(axes, scales):
        grid = np.full((len(rows), len(trunks)), np.nan)
        for i, (head, support, bins) in enumerate(rows):
            for j, trunk in enumerate(trunks):
                runs = cells.get((head, trunk, support, bins), [])
                errors = [r["scales"][scales.index(scale)]["relative_rmse"] for r in runs]
                if errors:
                    grid[i, j] = float(np.median(errors))
                    ax.text(j, i, f"{100 * grid[i, j]:.1f}%", ha="center", va="center", fontsize=7)
        ax.set_facecolor("0.85")
        image = ax.imshow(np.clip(grid, 0.005, 1.0), cmap="viridis_r", norm=norm, aspect="auto")
        ax.set_xticks(range(len(trunks)), trunks, fontsize=8, rotation=30)
        ax.set_yticks(range(len(rows)), [_row_label(*row) for row in rows] if ax is axes[0] else [], fontsize=8)
        ax.set_title(f"reward scale {scale:g}", fontsize=9)
    fig.colorbar(image, ax=list(axes), label="final relative RMSE (median over seeds)", shrink=0.9)
    done = sum(len(runs) for runs in cells.values())
    fig.suptitle(f"multicritic demo: value head x trunk ({done} of {len(data['planned'])} runs)", fontsize=10)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def _row_label(head: str, support, bins: str) -> str:
    from benchmarks.render_tables import bins_label

    label = bins_label(head, bins)
    return f"{head}, {'no buckets' if label != bins else bins}" + (
        "" if support is None else f", start [{support[0]:g}, {support[1]:g}]"
    )


# ---------------------------------------------------------------- command line


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    from multicritic.heads import HEADS
    from multicritic.trunks import TRUNKS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="grid", required=True)
    demo = sub.add_parser("demo", help="the demo's MRP, every head x trunk")
    demo.add_argument("--heads", nargs="+", default=list(HEADS))
    demo.add_argument("--trunks", nargs="+", default=list(TRUNKS))
    demo.add_argument(
        "--sets",
        nargs="+",
        choices=SETS,
        default=list(SETS),
        help="pairs: every head x trunk; wrong: the adaptive head from WRONG_SUPPORT; control: two_hot on "
        "uniform symlog bins (default: all three)",
    )
    demo.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    demo.add_argument("--scales", nargs="+", type=float, default=[1.0, 1e3, 1e6])
    demo.add_argument("--size", default="mini")
    demo.add_argument("--steps", type=int, default=1500)
    demo.add_argument("--target", type=float, default=0.05, help="the relative RMSE of the steps-to column")
    demo.add_argument("--json", default=DEMO_JSON, help="the results (default: benchmarks/results/...demo.json)")
    child = sub.add_parser("demo-run", help="one run of the demo grid (the grid's child process)")
    child.add_argument("--head", required=True)
    child.add_argument("--trunk", required=True)
    child.add_argument("--bins", required=True)
    child.add_argument("--support", nargs=2, type=float, help="the initial symlog support (default: the critic's)")
    child.add_argument("--seed", type=int, required=True)
    child.add_argument("--scales", nargs="+", type=float, required=True)
    child.add_argument("--size", required=True)
    child.add_argument("--steps", type=int, required=True)
    child.add_argument("--target", type=float, required=True)
    child.add_argument("--out", required=True)
    ppo = sub.add_parser("ppo", help="PPO (ppo_scales.py) for the combinations in PPO_GROUPS")
    ppo.add_argument("--backend", default="jax", help="a grid backend of ppo_scales.py (jax: the Keras agent)")
    ppo.add_argument("--envs", nargs="+", default=["CartPole-v1", "Acrobot-v1"])
    ppo.add_argument("--heads", nargs="+", help="with --trunks: one group instead of PPO_GROUPS")
    ppo.add_argument("--trunks", nargs="+")
    ppo.add_argument("--scales", nargs="+", default=["1", "1000000"])
    ppo.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ppo.add_argument("--steps", type=int, default=50_000)
    ppo.add_argument("--workers", type=int, default=1)
    ppo.add_argument("--plan-only", action="store_true", help="only write the plan into the JSON (no run)")
    ppo.add_argument("--json", default=PPO_JSON, help="the results (default: benchmarks/results/...ppo.json)")
    plot = sub.add_parser("plot", help="the demo's heat maps and PPO's curves")
    plot.add_argument("--demo-json", default=DEMO_JSON)
    plot.add_argument("--ppo-json", default=PPO_JSON)
    plot.add_argument("--demo-png", default=DEMO_PNG)
    plot.add_argument("--ppo-png", default=PPO_PNG)
    plot.add_argument("--demo-runs", help="only the demo file's first runs (as the page's tables: runs=N)")
    plot.add_argument("--ppo-runs", help="only the PPO file's first runs")
    args = parser.parse_args(argv)
    # The grid's command: a plan written ahead (`--plan-only`) records the command that will run it.
    command = " ".join(["python benchmarks/ours/critic_comparison.py", *(a for a in argv if a != "--plan-only")])
    if args.grid == "demo":
        return run_demo_grid(args, command)
    if args.grid == "demo-run":
        options = dict(scales=args.scales, size=args.size, steps=args.steps, target=args.target)
        made = demo_run(args.head, args.trunk, args.support, args.bins, args.seed, **options)
        _write(made, args.out)
        return made
    if args.grid == "ppo":
        return run_ppo_grid(args, command)
    from benchmarks.agents.plot_curves import plot_comparison

    for results, png, draw, runs in (
        (args.demo_json, args.demo_png, plot_demo, args.demo_runs),
        (args.ppo_json, args.ppo_png, plot_comparison, args.ppo_runs),
    ):
        if os.path.exists(results):
            with open(results) as f:
                draw(json.load(f), png, runs=runs)
            print(f"wrote {_relative(png)}")
    return None


if __name__ == "__main__":
    main()
