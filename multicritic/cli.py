"""The `multicritic` command: `demo` (learn exact MDP values across reward scales) and `check`
(backend parity). Errors are one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from typing import List, Optional

import keras

from multicritic.bins import BIN_SCHEMES
from multicritic.check import BACKENDS, installed_backends, run_check, worker
from multicritic.sizes import MODEL_SIZES


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="multicritic", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    demo = sub.add_parser("demo", help="learn exact values of a random MDP at reward scales 1, 1e3, 1e6")
    demo.add_argument("--backend", help=f"Keras backend, one of {BACKENDS} (default: KERAS_BACKEND / the installed one)")
    demo.add_argument("--size", default="mini", help=f"model size, one of {MODEL_SIZES} (default: mini)")
    demo.add_argument("--steps", type=int, default=1500, help="train steps per reward scale (default: 1500)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--bin-scheme", default="symexp", help=f"one of {BIN_SCHEMES} (default: symexp, the 2024 scheme)")
    demo.add_argument("--scales", default="1,1e3,1e6", help="comma-separated reward scales (default: 1,1e3,1e6)")
    demo.add_argument("--json", metavar="PATH", help="write machine-readable results here")
    demo.add_argument("--plot", metavar="PATH", help="write a PNG of learned vs exact values and learning curves")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    check = sub.add_parser("check", help="compare the critic and a train step across all installed backends")
    check.add_argument("--backends", help="comma-separated backends (default: every installed one)")
    check.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    check.add_argument("--perturb-worker", action="store_true", help=argparse.SUPPRESS)
    check.add_argument("--perturb", metavar="BACKEND", help=argparse.SUPPRESS)  # tests: prove a mismatch is caught
    return parser


def _check_writable(path: Optional[str], what: str) -> None:
    if path is None:
        return
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as err:
        raise UsageError(f"{what}: cannot write {path!r} ({err.strerror or err})")
    if not existed:
        os.remove(path)


def _require_backend(backend: str, flag: str) -> None:
    """A known and installed Keras backend, else a one-line usage error naming `flag`."""
    if backend not in BACKENDS:
        raise UsageError(f"{flag}: got {backend!r}, expected one of {list(BACKENDS)}")
    if importlib.util.find_spec(backend) is None:
        raise UsageError(f"{flag}: {backend!r} is not installed (installed: {', '.join(installed_backends()) or 'none'})")


def _switch_backend(backend: Optional[str], argv: List[str]) -> None:
    """Re-runs the command on `backend` (the backend is fixed once Keras is imported)."""
    if backend is None or backend == keras.backend.backend():
        return
    _require_backend(backend, "--backend")
    if os.environ.get("MULTICRITIC_SWITCHED"):
        raise UsageError(f"--backend: could not switch Keras to {backend!r}")
    env = dict(os.environ, KERAS_BACKEND=backend, MULTICRITIC_SWITCHED="1")
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "multicritic", *argv], env)


def _demo(args, argv) -> int:
    from multicritic.demo.run import DemoConfig, plot, run_demo, summary_table, to_json

    _switch_backend(args.backend, argv)
    if args.size not in MODEL_SIZES:
        raise UsageError(f"--size: got {args.size!r}, expected one of {list(MODEL_SIZES)}")
    if args.bin_scheme not in BIN_SCHEMES:
        raise UsageError(f"--bin-scheme: got {args.bin_scheme!r}, expected one of {list(BIN_SCHEMES)}")
    if args.steps < 1:
        raise UsageError(f"--steps: got {args.steps}, expected a positive integer")
    try:
        scales = tuple(float(s) for s in args.scales.split(","))
    except ValueError:
        raise UsageError(f"--scales: got {args.scales!r}, expected comma-separated numbers") from None
    if any(not s > 0 for s in scales):
        raise UsageError(f"--scales: got {args.scales!r}, expected positive numbers")
    _check_writable(args.json, "--json")
    _check_writable(args.plot, "--plot")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot: needs matplotlib (pip install 'multicritic[plot]')") from None
    config = DemoConfig(size=args.size, steps=args.steps, seed=args.seed, bin_scheme=args.bin_scheme, scales=scales)
    print(
        f"multicritic demo: backend {keras.backend.backend()}, size {config.size}, {config.bin_scheme} bins, "
        f"{config.num_states}-state random MDP, horizon {config.horizon}, {config.steps} steps per scale"
    )
    results = run_demo(config, progress=not args.no_progress)
    print(summary_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_json(config, results), f, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _check(args) -> int:
    if args.worker:
        worker(args.worker, perturb=args.perturb_worker)
        return 0
    backends = installed_backends()
    if args.backends:
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        for b in backends:
            _require_backend(b, "--backends")
    if not backends:
        raise UsageError("no Keras backend is installed (pip install 'multicritic[jax]', '[torch]' or '[tensorflow]')")
    return run_check(backends, perturb=args.perturb)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
        return _demo(args, argv) if args.command == "demo" else _check(args)
    except UsageError as err:
        print(f"multicritic: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("multicritic: interrupted", file=sys.stderr)
        return 130
