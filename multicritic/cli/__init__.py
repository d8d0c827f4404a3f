"""The `multicritic` command: `demo` (learn exact MDP values across reward scales) and `check`
(backend parity). Bad flags and environments (KERAS_BACKEND, keras.json) are one line on stderr
and exit code 2, never a traceback, and are found before any work and before Keras is imported;
so are `--version` and `--help` (exit code 0) and a bare `multicritic` (the usage on stderr, exit code 2)."""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from typing import List, Optional, Tuple

# No Keras at module level: `preflight` runs from `multicritic/__init__.py` before Keras is imported.
from multicritic.backend import selection
from multicritic.cli.check import BACKENDS, PERTURBATIONS, installed_backends
from multicritic.demo.config import (
    AGGREGATIONS,
    PRESETS,
    BIN_SCHEMES,
    HEADS,
    TRUNKS,
    MAX_ENSEMBLE,
    MAX_SEED,
    MODEL_SIZES,
    DemoConfig,
    check_config,
)

# matplotlib's formats (FigureCanvasBase.get_supported_filetypes) except pgf,
# which needs a LaTeX installation.
PLOT_FORMATS = ("eps", "jpeg", "jpg", "pdf", "png", "ps", "raw", "rgba", "svg", "svgz", "tif", "tiff", "webp")
NO_BACKEND = "no Keras backend is installed (pip install 'multicritic[jax]', '[torch]' or '[tensorflow]')"
_FLAGS = {
    "size": "--size",
    "bin_scheme": "--bin-scheme",
    "steps": "--steps",
    "seed": "--seed",
    "scales": "--scales",
    "head": "--head",
    "trunk": "--trunk",
    "ensemble": "--ensemble",
    "aggregation": "--aggregation",
    "preset": "--preset",
}


class UsageError(Exception):
    pass


class NoCommand(UsageError):
    """A bare `multicritic`: answered with the usage, not one error line."""


class Done(Exception):
    """`--help` or `--version` printed its answer: exit with `code`, no work."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)

    def exit(self, status=0, message=None):
        # argparse's own exit is a SystemExit, which would leave `main` (called in-process) without its return code.
        if message:
            self._print_message(message, sys.stderr)
        raise Done(status)


def version() -> str:
    """`multicritic.__version__`, read from the package's source as setuptools reads it (pyproject.toml's `attr`):
    the package sets it after importing Keras, which `--version` must not wait for."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "__init__.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"no __version__ in {path}")


def _size(text: str) -> str:
    """A model size in any case (`xs`, `XS`, `Nano`) as MODEL_SIZES spells it; anything else as given (refused
    later, by `check_config`, with the list)."""
    return {s.lower(): s for s in MODEL_SIZES}.get(text.lower(), text)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="multicritic",
        description="The DreamerV3 critic on TensorFlow, PyTorch and JAX: `multicritic demo` learns the exact values "
        "of a random Markov reward process at reward scales 1 to 1e6; `multicritic check` runs the same critics on "
        "every installed Keras backend and compares them.",
        epilog="`multicritic COMMAND --help` lists a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"multicritic {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    demo = sub.add_parser(
        "demo",
        help="learn exact values of a random MDP at reward scales 1, 1e3, 1e6 "
        "(DreamerV3's critic update with demo hyperparameters: lr 3e-3 with cosine decay, gamma 0.9)",
    )
    demo.add_argument(
        "--backend",
        help=f"Keras backend, one of {list(BACKENDS)}; overrides KERAS_BACKEND (default: KERAS_BACKEND, "
        "else keras.json's backend if installed, else the first installed of jax, torch, tensorflow)",
    )
    demo.add_argument(
        "--size", default="mini", type=_size, help=f"model size, one of {list(MODEL_SIZES)}, any case (default: mini)"
    )
    demo.add_argument("--steps", type=int, default=1500, help="train steps per reward scale, >= 1 (default: 1500)")
    demo.add_argument("--seed", type=int, default=0, help=f"random seed in [0, {MAX_SEED}] (default: 0)")
    demo.add_argument(
        "--bin-scheme",
        help=f"one of {list(BIN_SCHEMES)} (default: symexp, the 2024 scheme, where the head supports it; "
        "else the head's first scheme: uniform_symlog for hl_gauss)",
    )
    demo.add_argument(
        "--head",
        default="two_hot",
        help=f"the critic's value head, one of {list(HEADS)} (default: two_hot, the reference)",
    )
    demo.add_argument(
        "--trunk",
        default="mlp",
        help=f"the critic's trunk, one of {list(TRUNKS)} (default: mlp, the reference)",
    )
    demo.add_argument(
        "--ensemble",
        type=int,
        default=1,
        metavar="K",
        help=f"number of critic members, 1 to {MAX_ENSEMBLE} (default: 1); with K > 1 the summary also reports "
        "how well the members' spread predicts the error (Pearson / Spearman correlation across states)",
    )
    demo.add_argument(
        "--aggregation",
        default="mean",
        help=f"how the members' values are reduced for the targets and the scored value, one of {list(AGGREGATIONS)} "
        "(default: mean; members: each learns from its own targets, their mean is scored; min_of_random needs "
        "--ensemble 2 or more)",
    )
    demo.add_argument(
        "--preset",
        help=f"a published recipe, one of {list(PRESETS)}: its critic architecture, optimizer (on the demo's "
        "learning-rate schedule) and slow-critic and loss options (default: none, the demo's own: symexp bins, "
        "Adam, the reference's MLP)",
    )
    demo.add_argument(
        "--scales",
        default="1,1e3,1e6",
        help="comma-separated reward scales (default: 1,1e3,1e6): finite, >= 1e-6, and small enough that every "
        "exact value stays inside the critic's value support +-symexp(20) ~ +-4.85e8 (1e7 passes for almost "
        "every seed; the error names the limit)",
    )
    demo.add_argument("--json", metavar="PATH", help="write machine-readable results here")
    demo.add_argument(
        "--plot",
        metavar="PATH",
        help="write a figure of learned vs exact values and learning curves; the extension picks the format "
        f"(one of {', '.join(PLOT_FORMATS)}); needs matplotlib",
    )
    demo.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (without it: a bar when stdout is a terminal, none when it is piped or redirected)",
    )
    check = sub.add_parser(
        "check",
        help="run the same critics (each head and trunk, an ensemble, each host's options) and one train step on "
        "every installed backend, each in its own process, and compare their forward passes and train steps; each "
        "backend also checks its compiled forward pass against its eager one",
    )
    check.add_argument(
        "--backends",
        help=f"comma-separated backends from {list(BACKENDS)} (default: every installed one, which must be two or "
        "more; name one to check it alone: its compiled forward pass and the hosts' round trips)",
    )
    check.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    check.add_argument("--perturb-worker", nargs="?", const="forward", choices=PERTURBATIONS, help=argparse.SUPPRESS)
    # tests: prove a mismatch is caught; BACKEND[:forward] (its logits), BACKEND:compiled (its compiled
    # forward pass) or BACKEND:step (its train step)
    check.add_argument("--perturb", metavar=f"BACKEND[:{'|:'.join(PERTURBATIONS)}]", help=argparse.SUPPRESS)
    return parser


# ----------------------------------------------------------------------
# Checks: pure Python, no Keras, no work.


def _check_writable(path: Optional[str], what: str) -> None:
    if path is None:
        return
    if path == "" or os.path.isdir(path):
        raise UsageError(f"{what}: got {path!r}, expected a file path")
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as err:
        raise UsageError(f"{what}: cannot write {path!r} ({err.strerror or err})") from None
    if not existed:
        os.remove(path)


def _check_plot(path: Optional[str]) -> None:
    if path is None:
        return
    ext = os.path.splitext(path)[1][1:].lower()
    if ext not in PLOT_FORMATS:
        got = f"extension {'.' + ext!r}" if ext else "no extension"
        raise UsageError(f"--plot: {path!r} has {got}, expected one of {', '.join('.' + f for f in PLOT_FORMATS)}")
    if not selection.installed("matplotlib"):
        raise UsageError("--plot: needs matplotlib (pip install 'multicritic[plot]')")
    # Installed is not importable (a broken install, a missing dependency): import what `plot` imports now,
    # before any work, with the backend it draws with.
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except Exception as err:  # any failure of a third-party import
        reason = " ".join(f"{type(err).__name__}: {err}".split())
        raise UsageError(f"--plot: matplotlib cannot be imported ({reason}; pip install 'multicritic[plot]')") from None


def _require_backend(backend: str, what: str, hint: str = "") -> None:
    """A known and installed Keras backend, else a one-line usage error naming `what`."""
    if backend not in BACKENDS:
        raise UsageError(f"{what}: got {backend!r}, expected one of {list(BACKENDS)}{hint}")
    if not selection.installed(backend):
        installed = ", ".join(installed_backends()) or "none"
        raise UsageError(f"{what}: {backend!r} is not installed (installed: {installed}){hint}")


def _environment_backend(hint: str = "") -> str:
    """The backend KERAS_BACKEND or keras.json (or the fallback) gives, checked."""
    env = os.environ.get("KERAS_BACKEND")
    if env:
        _require_backend(env, "KERAS_BACKEND", hint)
        return env
    if not installed_backends():
        raise UsageError(NO_BACKEND)
    backend, where = selection.default_backend()
    _require_backend(backend, f"the Keras backend from {where}", hint)
    return backend


def _parse_scales(text: str) -> Tuple[float, ...]:
    try:
        return tuple(float(s) for s in text.split(","))
    except ValueError:
        raise UsageError(f"--scales: got {text!r}, expected comma-separated numbers") from None


def _demo_config(args) -> DemoConfig:
    scales = _parse_scales(args.scales)
    config = DemoConfig(
        size=args.size,
        steps=args.steps,
        seed=args.seed,
        bin_scheme=args.bin_scheme,
        scales=scales,
        head=args.head,
        trunk=args.trunk,
        ensemble=args.ensemble,
        aggregation=args.aggregation,
        preset=args.preset,
    )
    try:
        check_config(config, _FLAGS)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if args.json is not None and args.plot is not None and os.path.abspath(args.json) == os.path.abspath(args.plot):
        raise UsageError(f"--json and --plot: both got {args.json!r}, expected two different files")
    _check_plot(args.plot)
    _check_writable(args.json, "--json")
    _check_writable(args.plot, "--plot")
    return config


def _check_backends(args) -> List[str]:
    if args.backends is None:
        backends = installed_backends()
        if not backends:
            raise UsageError(NO_BACKEND)
        if len(backends) == 1:
            # Said before any work: the check's point is comparing backends, and one backend's run takes a minute.
            only = backends[0]
            others = " or ".join(f"'multicritic[{b}]'" for b in BACKENDS if b != only)
            raise UsageError(
                f"--backends: only {only!r} is installed, and check compares backends with each other: install "
                f"another (pip install {others}), or pass --backends {only} to check {only} alone (its compiled "
                "forward pass against its eager one, and the hosts' checkpoint round trips)"
            )
    else:
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        if not backends:
            raise UsageError(f"--backends: got {args.backends!r}, expected comma-separated names from {list(BACKENDS)}")
        for b in backends:
            _require_backend(b, "--backends")
        for b in backends:
            if backends.count(b) > 1:
                raise UsageError(f"--backends: got {args.backends!r}, which names {b!r} twice")
    if args.perturb is not None:
        target, _, what = args.perturb.partition(":")
        if target not in backends or what not in ("",) + PERTURBATIONS:
            raise UsageError(
                f"--perturb: got {args.perturb!r}, expected BACKEND[:{'|:'.join(PERTURBATIONS)}] with BACKEND in "
                f"{backends}"
            )
    return backends


def _validate(argv: List[str]):
    """Parses and checks everything, without Keras. Returns (args, the demo
    config or the check's backends, the backend this process must run on)."""
    args = _parser().parse_args(argv)
    if args.command is None:
        raise NoCommand()
    if args.command == "demo":
        plan = _demo_config(args)
        if args.backend is not None:
            _require_backend(args.backend, "--backend")
            backend = args.backend
        else:
            backend = _environment_backend("; or pass --backend")
    else:
        # The parent runs no critic (it compares the workers' numbers) but imports
        # Keras: it runs on KERAS_BACKEND where set (checked first, as the first
        # thing the user set), else on the first backend checked.
        named = _environment_backend() if os.environ.get("KERAS_BACKEND") else None
        plan = None if args.worker else _check_backends(args)
        backend = named or (plan[0] if plan else _environment_backend())
    return args, plan, backend


def preflight(argv: List[str]) -> None:
    """Runs before Keras is imported when this process is the `multicritic`
    command: checks the command line and environment, then sets KERAS_BACKEND
    to the backend to run on. A bad one: one line on stderr, exit code 2."""
    try:
        _, _, backend = _validate(argv)
    except UsageError as err:
        _fail(err)
    except Done as done:
        raise SystemExit(done.code) from None
    os.environ["KERAS_BACKEND"] = backend


def _fail(err) -> None:
    raise SystemExit(_report(err))


def _report(err: UsageError) -> int:
    """Prints a usage error (a bare `multicritic`: the usage and the commands) on stderr; returns exit code 2."""
    if isinstance(err, NoCommand):
        _parser().print_help(sys.stderr)
    else:
        print(f"multicritic: error: {err}", file=sys.stderr)
    return 2


# ----------------------------------------------------------------------
# The commands (Keras is imported from here on).


def _rerun_on(backend: str, argv: List[str]) -> Optional[int]:
    """Keras is already imported on another backend (main() called in-process):
    runs the command in a subprocess on `backend` and returns its exit code."""
    import keras

    if backend == keras.backend.backend():
        return None
    if os.environ.get("MULTICRITIC_SWITCHED"):
        raise UsageError(f"--backend: could not switch Keras to {backend!r}")
    env = dict(os.environ, KERAS_BACKEND=backend, MULTICRITIC_SWITCHED="1")
    sys.stdout.flush()
    return subprocess.call([sys.executable, "-m", "multicritic", *argv], env=env)


def _demo(args, config: DemoConfig, argv: List[str]) -> int:
    import json

    import keras

    from multicritic.demo.run import plot, run_demo, summary_table, to_json

    if args.backend is not None:
        code = _rerun_on(args.backend, argv)
        if code is not None:
            return code
    critic = "".join(
        f", {getattr(config, part)} {part}"
        for part, default in (("head", "two_hot"), ("trunk", "mlp"))
        if getattr(config, part) != default
    )
    if config.ensemble > 1:
        critic += f", ensemble of {config.ensemble} ({config.aggregation})"
    print(
        f"multicritic demo: backend {keras.backend.backend()}, size {config.size}, {config.bin_scheme} bins{critic}, "
        f"{config.num_states}-state random MDP, horizon {config.horizon}, {config.steps} steps per scale"
    )
    results = run_demo(config, progress=not args.no_progress)  # (a bar only on a terminal: `run_demo`)
    print(summary_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_json(config, results), f, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _check(args, backends: Optional[List[str]]) -> int:
    from multicritic.cli.check import run_check, worker

    if args.worker:
        worker(args.worker, perturb=args.perturb_worker)
        return 0
    return run_check(backends, perturb=args.perturb)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if "keras" in sys.modules:
            # Keras already runs on some backend: the environment no longer matters.
            args = _parser().parse_args(argv)
            if args.command is None:
                raise NoCommand()
            plan = _demo_config(args) if args.command == "demo" else (None if args.worker else _check_backends(args))
            if args.command == "demo" and args.backend is not None:
                _require_backend(args.backend, "--backend")
        else:
            args, plan, backend = _validate(argv)
            os.environ["KERAS_BACKEND"] = backend
        return _demo(args, plan, argv) if args.command == "demo" else _check(args, plan)
    except UsageError as err:
        return _report(err)
    except Done as done:
        return done.code
    except KeyboardInterrupt:
        print("multicritic: interrupted", file=sys.stderr)
        return 130
