"""`multicritic check`: the same critics and train steps on every installed backend, compared.

Several critic configurations (`CONFIGS`: each registered head, each other registered trunk, an ensemble,
and each host of `multicritic.interop.HOSTS` with its options), each
with fixed weights (distinct fast and EMA copies) and fixed inputs, run in a
subprocess per backend. Each backend checks itself (the `compiled` column:
the eager forward pass against the compiled one, `predict_function`; the
`host` column: the critic's weights exported in the host's own checkpoint
form and loaded back into a critic of other weights, which must give them
back exactly, before the forward pass and the step run on it); the
parent compares the forward passes and the train steps across backends,
against the first backend that ran (its cells read `ref`). Nothing here
recomputes the critic: with only one backend there is nothing to compare the
forward pass and train step with, so the table has the self-checks alone and
says so (the command refuses to start that way unless `--backends` names the
one backend: see `multicritic.cli`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from multicritic.backend.selection import SUPPORTED as BACKENDS
from multicritic.backend.selection import installed
from multicritic.heads import HEADS
from multicritic.interop import HOSTS
from multicritic.trunks import TRUNKS

SIZE = "mini"
# Critic options per configuration (model_size=SIZE for all).
CONFIGS: Dict[str, Dict] = {
    **{name: {"head": name} for name in HEADS},
    **{f"{name}-trunk": {"trunk": name} for name in list(TRUNKS)[1:]},
    "ensemble": {"ensemble_size": 3},
    **{f"{name}-host": {"host": name} for name in HOSTS},
}
FORWARD_KEYS = ("value", "logits", "ema_value", "ema_logits")
STEP_KEYS = ("step_total", "step_grad_norm", "step_fast", "step_ema")
COMPILED_KEY, HOST_KEY = "compiled", "host"
COLUMNS = (COMPILED_KEY, HOST_KEY) + FORWARD_KEYS + STEP_KEYS
# Max |difference| allowed, relative to max(1, |reference|); a host's round trip copies arrays: exact.
# compiled: as across backends (1e-4); TensorFlow's XLA reorders the RMS norm's reductions (the official code's
# and TorchRL's 2024 options: 4.2e-5 from eager), and a compiled path's fault (1e-3 in the tests) stays caught.
TOLERANCE = {
    "compiled": 1e-4,
    "host": 0.0,
    "value": 1e-4,
    "logits": 1e-4,
    "ema_value": 1e-4,
    "ema_logits": 1e-4,
    "step_total": 1e-5,
    "step_grad_norm": 1e-4,
    "step_fast": 1e-6,
    "step_ema": 1e-6,
}
PERTURBATIONS = ("forward", "step", "compiled", "host")
_SEP = "__"  # npz key: f"{config}{_SEP}{key}"


def installed_backends() -> List[str]:
    return [b for b in BACKENDS if installed(b)]


def fixed_weights(critic) -> List[np.ndarray]:
    """Weights drawn around zero; a batch norm's moving variances kept positive and near one (a variance
    near zero would blow the logits up until a fault of 1e-3 hides under the relative tolerance)."""
    rng = np.random.default_rng(2024)
    out = []
    for v in critic.weights:
        w = rng.normal(scale=0.3, size=tuple(v.shape)).astype(np.float32)
        out.append(np.abs(w) + np.float32(0.5) if v.path.endswith("moving_variance") else w)
    return out


def fixed_batch(gru_units: int, cats: int, classes: int, n: int = 32):
    rng = np.random.default_rng(7)
    h = np.tanh(rng.normal(size=(n, gru_units))).astype(np.float32)
    z = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, size=(n, cats))]
    targets = (rng.normal(size=n) * 10.0 ** rng.integers(0, 7, size=n)).astype(np.float32)
    weights = rng.uniform(0.5, 1.0, size=n).astype(np.float32)
    return h, z, targets, weights


def _run_config(options: Dict) -> Dict[str, np.ndarray]:
    """One configuration's outputs: eager forward (`FORWARD_KEYS`), compiled forward
    (`compiled_` + forward key), one train step (`STEP_KEYS`) and, for a host, its round trip."""
    import keras

    from multicritic.model.critic import CriticNetwork
    from multicritic.training.trainer import CriticTrainer, predict_function

    def numpy(x):
        return np.asarray(keras.ops.convert_to_numpy(x))

    host = HOSTS[options["host"]] if "host" in options else None
    critic = CriticNetwork(model_size=SIZE, **(dict(host.options) if host else options))
    critic.set_weights(fixed_weights(critic))
    h, z, targets, weights = fixed_batch(critic.gru_units, critic.num_z_categoricals, critic.num_z_classes)
    out = {}
    if host:  # the host's round trip: these weights out in its form, into a critic of other weights, back
        state = host.export(critic)
        out["host_weights"] = np.concatenate([np.ravel(w) for w in critic.get_weights()])
        critic.set_weights([w * 0.5 for w in critic.get_weights()])
        host.load(critic, state)
        out["host_loaded"] = np.concatenate([np.ravel(w) for w in critic.get_weights()])
    for prefix, use_ema in (("", False), ("ema_", True)):
        eager = critic(h, z, use_ema=use_ema)
        compiled = predict_function(critic, use_ema=use_ema)(h, z)
        for name, e, c in zip(("value", "logits"), eager, compiled):
            out[prefix + name], out["compiled_" + prefix + name] = numpy(e), numpy(c)
    metrics = CriticTrainer(critic).train_step(h, z, targets, weights)
    out["step_total"] = numpy(metrics["total"])
    out["step_grad_norm"] = numpy(metrics["grad_norm"])
    out["step_fast"] = np.concatenate([np.ravel(numpy(v.value)) for v in critic.fast_weights])
    out["step_ema"] = np.concatenate([np.ravel(numpy(v.value)) for v in critic.ema_weights])
    return out


def outputs() -> Dict[str, Dict[str, np.ndarray]]:
    """Every configuration's outputs on this backend (`{config: {key: array}}`)."""
    return {config: _run_config(options) for config, options in CONFIGS.items()}


def perturbed(out: Dict[str, np.ndarray], perturb: Optional[str]) -> Dict[str, np.ndarray]:
    """One configuration's outputs as a faulty backend would give them (see `worker`); a copy."""
    out = dict(out)
    for prefix in ("", "ema_"):
        if perturb == "forward":  # this backend's forward pass (eager and compiled)
            out[prefix + "logits"] = out[prefix + "logits"] + 1e-3
        if perturb in ("forward", "compiled"):  # its compiled forward pass
            out["compiled_" + prefix + "logits"] = out["compiled_" + prefix + "logits"] + 1e-3
    if perturb == "step":
        out["step_fast"] = out["step_fast"] + 1e-4
    if perturb == "host" and "host_loaded" in out:
        out["host_loaded"] = out["host_loaded"].astype(np.float64) + 1e-6
    return out


def worker(out_path: str, perturb=None, computed=None) -> None:
    """Runs in a subprocess on one backend; writes every configuration's results to `out_path` (.npz).

    `perturb` (tests: proves a mismatch is caught where it should be):
    "forward" (or True) shifts this backend's logits (eager and compiled) by
    1e-3, "compiled" only its compiled logits, "step" the fast weights after
    the train step by 1e-4, "host" the weights a host's round trip gave back
    by 1e-6. `computed`: `outputs()` already run in this process (tests), to
    write each perturbation of the same outputs without running them again.
    """
    import keras

    perturb = "forward" if perturb is True else perturb
    if perturb not in (None,) + PERTURBATIONS:
        raise ValueError(f"perturb: got {perturb!r}, expected one of {list(PERTURBATIONS)}")
    out = {}
    for config, values in (computed if computed is not None else outputs()).items():
        for key, value in perturbed(values, perturb).items():
            out[config + _SEP + key] = value
    np.savez(out_path, backend=np.array(keras.backend.backend()), **out)


def _max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _compare(key: str, value, ref) -> Tuple[float, bool]:
    diff = _max_diff(value, ref)
    return diff, diff <= TOLERANCE[key] * max(1.0, float(np.max(np.abs(np.asarray(ref, np.float64)))))


def _compiled_cell(results: Dict[str, np.ndarray]) -> Tuple[float, bool]:
    """The backend's own eager vs compiled forward (fast and EMA): the largest difference, and whether
    each output is within tolerance of its eager value."""
    cells = [_compare(COMPILED_KEY, results["compiled_" + key], results[key]) for key in FORWARD_KEYS]
    return max(d for d, _ in cells), all(ok for _, ok in cells)


def _host_cell(results: Dict[str, np.ndarray]) -> Optional[Tuple[float, bool]]:
    """A host configuration's round trip (weights loaded back against the weights exported); None for the
    configurations without a host."""
    if "host_loaded" not in results:
        return None
    return _compare(HOST_KEY, results["host_loaded"], results["host_weights"])


def _run_workers(backends: Sequence[str], perturb: Optional[str]):
    target, _, what = (perturb or "").partition(":")
    results: Dict[str, Dict[str, Dict[str, np.ndarray]]] = {}
    failures: Dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            path = os.path.join(tmp, f"{backend}.npz")
            cmd = [sys.executable, "-m", "multicritic", "check", "--worker", path]
            if target == backend:
                cmd += ["--perturb-worker", what or "forward"]
            env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0 or not os.path.exists(path):
                lines = (proc.stderr or proc.stdout).strip().splitlines()
                failures[backend] = lines[-1] if lines else f"exit code {proc.returncode}"
                continue
            per_config: Dict[str, Dict[str, np.ndarray]] = {config: {} for config in CONFIGS}
            with np.load(path) as data:
                for name in data.files:
                    config, sep, key = name.partition(_SEP)
                    if sep:
                        per_config[config][key] = data[name]
            results[backend] = per_config
    return results, failures


# The table's columns: each a group of the keys above (a group's keys share a tolerance), its cell the group's
# largest difference. Self-checks first (each backend against itself), then the comparisons with the reference.
SELF_COLUMNS = {COMPILED_KEY: (COMPILED_KEY,), HOST_KEY: (HOST_KEY,)}
CROSS_COLUMNS = {
    "fast": ("value", "logits"),
    "ema": ("ema_value", "ema_logits"),
    "loss": ("step_total",),
    "grad_norm": ("step_grad_norm",),
    "weights": ("step_fast", "step_ema"),
}
LABEL_WIDTH = max(len("config"), *(len(c) for c in CONFIGS)) + 4  # configs indented under their backend
CELL_WIDTH = 10  # "1.23e-05!" and a space


def _cell(key: str, mine: Dict[str, np.ndarray], ref: Optional[Dict[str, np.ndarray]]) -> Tuple[str, bool]:
    """One column's cell, `CELL_WIDTH` wide (`-`: no host; `ref`: the reference backend; a difference past its
    tolerance ends in `!`), and whether it is within tolerance."""
    if key == COMPILED_KEY:
        diff, within = _compiled_cell(mine)
    elif key == HOST_KEY:
        cell = _host_cell(mine)
        if cell is None:
            return f"{'-':>{CELL_WIDTH - 1}} ", True
        diff, within = cell
    elif ref is None:
        return f"{'ref':>{CELL_WIDTH - 1}} ", True
    else:
        cells = [_compare(k, mine[k], ref[k]) for k in CROSS_COLUMNS[key]]
        diff, within = max(d for d, _ in cells), all(ok for _, ok in cells)
    return f"{diff:>{CELL_WIDTH - 1}.2e}" + (" " if within else "!"), within


def run_check(backends: Optional[Sequence[str]] = None, perturb: Optional[str] = None, log=print) -> int:
    """Runs every backend, prints the table, returns the exit code (0: all agree).

    The table is one block of rows per backend, one row per configuration, within 100 columns: `compiled`
    (eager vs compiled forward pass) and `host` (a host's export and load) check the backend against itself;
    with two backends or more, `fast` and `ema` (value and logits of the fast and the EMA critic), `loss`,
    `grad_norm` and `weights` (fast and EMA, after one train step) compare it with the first backend that ran.

    `perturb` (tests): "BACKEND" or "BACKEND:forward" perturbs that backend's
    logits, "BACKEND:compiled" its compiled forward pass only, "BACKEND:step"
    its train step, "BACKEND:host" the hosts' round trips, to show that the
    table catches each in its own columns.
    """
    backends = list(backends or installed_backends())
    log(
        f"multicritic check on {', '.join(backends)} (a process each, in turn): {len(CONFIGS)} critics, "
        "a train step each"
    )
    results, failures = _run_workers(backends, perturb)
    ref_backend = next(iter(results), None)
    compare = len(results) >= 2
    columns = list(SELF_COLUMNS) + (list(CROSS_COLUMNS) if compare else [])
    log("max |difference|, relative to max(1, |reference|); '!': past its tolerance (the last row)")
    log("  compiled: eager vs compiled forward pass, on the same backend")
    log("  host: a host's checkpoint form, exported and loaded back, vs the weights before ('-': no host)")
    if compare:
        log(f"  fast, ema: value and logits of the fast and the EMA critic, vs {ref_backend} ('ref')")
        log(f"  loss, grad_norm, weights: one train step (weights: fast and EMA after it), vs {ref_backend}")
    log(f"{'config':<{LABEL_WIDTH}}" + "".join(f"{c:>{CELL_WIDTH - 1}} " for c in columns) + " status")
    bad = bool(failures)
    for backend in backends:
        log(backend)
        if backend in failures:
            log(f"  FAILED: {failures[backend]}")
            continue
        for config in CONFIGS:
            mine = results[backend][config]
            ref = None if backend == ref_backend else results[ref_backend][config]
            row, ok = f"  {config:<{LABEL_WIDTH - 2}}", True
            for key in columns:
                text, within = _cell(key, mine, ref)
                ok &= within
                row += text
            bad |= not ok
            log(row + " " + ("ok" if ok else "MISMATCH"))
    # A group's keys share their tolerance (TOLERANCE): the first one's stands for the column.
    keys = {**SELF_COLUMNS, **CROSS_COLUMNS}
    log(f"{'tolerance':<{LABEL_WIDTH}}" + "".join(f"{TOLERANCE[keys[c][0]]:>{CELL_WIDTH - 1}.0e} " for c in columns))
    if results and not compare:
        log(f"forward passes and train steps not compared across backends: only {ref_backend} ran")
    return 1 if bad or not results else 0
