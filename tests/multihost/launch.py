"""Runs the multi-host examples (examples/multihost/) as separate processes and reads what they wrote.

Every launch has a wall-clock limit: a hang ends the test with the hosts' output instead of blocking CI.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import warnings
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples", "multihost")
KINDS = ("single", "ensemble", "multi")
SCRIPTS = {"jax": "jax_hosts.py", "torch": "torch_hosts.py", "tensorflow": "tensorflow_hosts.py"}
# The small run every test trains: 4 steps of nano critics, a checkpoint every 2.
RUN = ["--steps", "4", "--checkpoint-every", "2", "--batch", "16", "--horizon", "6"]
# A whole launch (imports, engine start, compilations, 4 steps of 3 critics) on 2 busy CPU cores.
LAUNCH_LIMIT_S = 420


def require(*modules):
    """Skips unless every module is importable; fails instead where the multihost session installed them."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        if os.environ.get("MULTICRITIC_REQUIRE_ENGINES") == "1":
            pytest.fail(f"missing {missing}: the multihost session installs every engine")
        pytest.skip(f"needs {missing} (the multihost nox session installs every engine)")


@dataclasses.dataclass
class Launch:
    code: int
    output: str
    exits: Dict[str, tuple]  # tag -> (exit code, unix time)

    def lines(self, pattern):
        return [line for line in self.output.splitlines() if re.search(pattern, line)]

    def report(self) -> str:
        """What a failed assertion shows: each host's first traceback (the host that failed first is often far
        above the tail, which then holds only the others' reactions to it), then the output's tail."""
        parts, lines = [], self.output.splitlines()
        for tag in dict.fromkeys(re.findall(r"^\[([^\]]+)\] ", self.output, re.M)):
            own = [line for line in lines if line.startswith(f"[{tag}] ")]
            at = next((i for i, line in enumerate(own) if "Traceback" in line), None)
            if at is None:
                at = next((i for i, line in enumerate(own) if re.search(r"\w+Error\b", line)), None)
            if at is not None:
                parts.append(f"--- {tag}: first error ---\n" + "\n".join(own[at : at + 60])[-3000:])
        return "\n".join(parts + ["--- the output's tail ---", self.output[-4000:]])


def _env():
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    env.pop("KERAS_BACKEND", None)  # each example picks its own engine's backend
    return env


def _run(cmd, limit_s):
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        # local.py stops its hosts on SIGTERM; whatever is left of this process group then gets SIGKILL.
        proc.send_signal(signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        hang = Launch(None, output, {})
        pytest.fail(f"{' '.join(cmd[1:4])} ... still running after {limit_s} s (a hang):\n{hang.report()}")
    exits = {
        m.group(1): (None if m.group(2) == "None" else int(m.group(2)), float(m.group(3)))
        for m in re.finditer(r"local\.py: (.+?) exited with (-?\d+|None) at ([\d.]+)", output)
    }
    return Launch(proc.returncode, output, exits)


def hosts(engine, *args, limit_s=LAUNCH_LIMIT_S, launcher_args=()) -> Launch:
    """`examples/multihost/local.py ENGINE`: two hosts on this machine."""
    return _run([sys.executable, os.path.join(EXAMPLES, "local.py"), engine, *launcher_args, *args], limit_s)


def one_host(engine, *args, limit_s=LAUNCH_LIMIT_S) -> Launch:
    """The engine's example as one process: one host, no launcher."""
    return _run([sys.executable, os.path.join(EXAMPLES, SCRIPTS[engine]), *args], limit_s)


# What the engines print when the hosts' own connections fail rather than what they run: a port taken by
# another process between being picked here and bound by a launcher, or a launcher's store gone with it.
CONNECTIONS_FAILED = re.compile(r"EADDRINUSE|[Aa]ddress already in use|RendezvousConnectionError|DistNetworkError")


def retried(launch: Callable[[], Launch], written: Sequence[str]) -> Launch:
    """`launch()`, run a second time (once) where the first launch failed on its connections, from scratch: the
    folders `written` (what a launch writes, a resumed run's checkpoints among it) are removed first. The first
    attempt's report becomes a warning."""
    first = launch()
    if first.code == 0 or not CONNECTIONS_FAILED.search(first.output):
        return first
    warnings.warn(f"the hosts' connections failed; launched again. The first attempt:\n{first.report()}")
    for folder in written:
        shutil.rmtree(folder, ignore_errors=True)
    return launch()


def succeeded(launch: Launch) -> Launch:
    assert launch.code == 0, launch.report()
    return launch


def outputs(folder, kind) -> List[dict]:
    """The `--out` files of one critic, one dict per host in host order."""
    paths = sorted(glob.glob(os.path.join(folder, kind, "host*.npz")))
    assert paths, f"no output in {folder}/{kind}"
    out = []
    for path in paths:
        with np.load(path) as data:
            out.append({k: data[k] for k in data.files})
    return out


def copy_checkpoint(src_dir, kind, step, dst_dir, as_step=None):
    """`src_dir/kind/step-NNNNNN.npz` as the checkpoint of `dst_dir/kind` a run resumes from (as step
    `as_step`, default `step`)."""
    os.makedirs(os.path.join(dst_dir, kind), exist_ok=True)
    shutil.copy(
        os.path.join(src_dir, kind, f"step-{step:06d}.npz"),
        os.path.join(dst_dir, kind, f"step-{step if as_step is None else as_step:06d}.npz"),
    )


def state(run) -> Dict[str, np.ndarray]:
    return {k[len("state/") :]: v for k, v in run.items() if k.startswith("state/")}


def metrics(run, step) -> Dict[str, float]:
    prefix = f"metrics/{step}/"
    return {k[len(prefix) :]: float(v) for k, v in run.items() if k.startswith(prefix)}


# Metrics computed from the all-reduced gradients or gathered returns: the same on every host.
GLOBAL_METRICS = (
    "grad_norm",
    "nonfinite_grads",
    "step_skipped",
    "return_low",
    "return_high",
    "return_mean",
    "return_sqmean",
)
# Counts over a host's rows: they add up across hosts. Every other metric is a mean over the host's rows.
SUMMED_METRICS = ("nonfinite_targets", "invalid_inputs")


def global_metrics(runs, step, per_host: bool) -> Dict[str, float]:
    """The global batch's metrics of `step`: as reported (JAX, TensorFlow: already global, the same on every
    host), or combined from each host's (PyTorch DDP, Ray: means over equal shards average, counts add)."""
    seen = [metrics(run, step) for run in runs]
    assert all(set(m) == set(seen[0]) for m in seen), [sorted(m) for m in seen]
    out = {}
    for name in seen[0]:
        values = [m[name] for m in seen]
        base = name.split("/")[-1]
        if not per_host or base in GLOBAL_METRICS:
            assert len(set(values)) == 1, (name, values)  # every host saw the same value
            out[name] = values[0]
        elif base in SUMMED_METRICS:
            out[name] = sum(values)
        else:
            out[name] = sum(values) / len(values)
    return out


def metric_gaps(got: Dict[str, float], want: Dict[str, float]) -> Dict[str, float]:
    """Relative gap of each metric, to max(1, |want|) as the single-host data-parallel tests."""
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    return {k: abs(got[k] - want[k]) / max(1.0, abs(want[k])) for k in want}


def largest_state_gap(a, b) -> float:
    a, b = state(a), state(b)
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)


def same_state(a, b) -> Optional[str]:
    """None if every state array is bit for bit equal, else the first key that differs."""
    a, b = state(a), state(b)
    assert set(a) == set(b)
    for key in sorted(a):
        if a[key].dtype != b[key].dtype or a[key].tobytes() != b[key].tobytes():
            return key
    return None
