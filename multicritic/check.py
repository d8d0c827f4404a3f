"""`multicritic check`: the same critic and train step on every installed backend, compared.

One critic with fixed weights (distinct fast and EMA copies) and fixed inputs
runs in a subprocess per backend; the parent compares the forward passes with
a plain numpy forward pass and the train steps across backends, against the
first backend that ran. With only one backend there is nothing to compare a
train step with: its step columns read "n/a" and the summary says the train
step was not checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np

from multicritic.backend_default import SUPPORTED as BACKENDS
from multicritic.backend_default import installed

SIZE = "mini"
FORWARD_KEYS = ("value", "logits", "ema_value", "ema_logits")
STEP_KEYS = ("step_total", "step_grad_norm", "step_fast", "step_ema")
# Max |difference| allowed, relative to max(1, |reference|).
TOLERANCE = {"value": 1e-4, "logits": 1e-4, "ema_value": 1e-4, "ema_logits": 1e-4,
             "step_total": 1e-5, "step_grad_norm": 1e-4, "step_fast": 1e-6, "step_ema": 1e-6}


def installed_backends() -> List[str]:
    return [b for b in BACKENDS if installed(b)]


def fixed_weights(critic) -> List[np.ndarray]:
    rng = np.random.default_rng(2024)
    return [rng.normal(scale=0.3, size=tuple(v.shape)).astype(np.float32) for v in critic.weights]


def fixed_batch(gru_units: int, cats: int, classes: int, n: int = 32):
    rng = np.random.default_rng(7)
    h = np.tanh(rng.normal(size=(n, gru_units))).astype(np.float32)
    z = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, size=(n, cats))]
    targets = (rng.normal(size=n) * 10.0 ** rng.integers(0, 7, size=n)).astype(np.float32)
    weights = rng.uniform(0.5, 1.0, size=n).astype(np.float32)
    return h, z, targets, weights


def worker(out_path: str, perturb=None) -> None:
    """Runs in a subprocess on one backend; writes its results to `out_path` (.npz).

    `perturb` (tests: proves a mismatch is caught): "forward" (or True) shifts
    the logits by 1e-3, "step" the weights after the train step by 1e-4.
    """
    import keras

    from multicritic import CriticNetwork, CriticTrainer

    critic = CriticNetwork(model_size=SIZE)
    critic.set_weights(fixed_weights(critic))
    h, z, targets, weights = fixed_batch(critic.gru_units, critic.num_z_categoricals, critic.num_z_classes)
    perturb = "forward" if perturb is True else perturb
    out = {}
    for prefix, use_ema in (("", False), ("ema_", True)):
        value, logits = critic(h, z, use_ema=use_ema)
        out[prefix + "value"] = keras.ops.convert_to_numpy(value)
        out[prefix + "logits"] = keras.ops.convert_to_numpy(logits) + (1e-3 if perturb == "forward" else 0.0)
    metrics = CriticTrainer(critic).train_step(h, z, targets, weights)
    out["step_total"] = keras.ops.convert_to_numpy(metrics["total"])
    out["step_grad_norm"] = keras.ops.convert_to_numpy(metrics["grad_norm"])
    out["step_fast"] = np.concatenate([np.ravel(keras.ops.convert_to_numpy(v.value)) for v in critic.fast_weights])
    out["step_fast"] = out["step_fast"] + (1e-4 if perturb == "step" else 0.0)
    out["step_ema"] = np.concatenate([np.ravel(keras.ops.convert_to_numpy(v.value)) for v in critic.ema_weights])
    np.savez(out_path, backend=np.array(keras.backend.backend()), **out)


def numpy_forward(weights: Sequence[np.ndarray], h, z, use_ema: bool):
    """The critic's forward pass in float64 numpy (RLlib weight order: kernels, LN pairs, head)."""
    half = len(weights) // 2
    w = [np.asarray(a, np.float64) for a in (weights[half:] if use_ema else weights[:half])]
    layers = (len(w) - 2) // 3
    x = np.concatenate([h, z.reshape(len(z), -1)], -1).astype(np.float64)
    for i in range(layers):
        a = x @ w[i]
        a = (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-3)
        y = a * w[layers + 2 * i] + w[layers + 2 * i + 1]
        x = y / (1.0 + np.exp(-y))
    logits = x @ w[-2] + w[-1]
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    buckets = np.linspace(-20.0, 20.0, logits.shape[-1])
    return p @ buckets, logits


def _reference_forward() -> Dict[str, np.ndarray]:
    from multicritic import CriticNetwork

    critic = CriticNetwork(model_size=SIZE)
    weights = fixed_weights(critic)
    h, z, _, _ = fixed_batch(critic.gru_units, critic.num_z_categoricals, critic.num_z_classes)
    out = {}
    for prefix, use_ema in (("", False), ("ema_", True)):
        out[prefix + "value"], out[prefix + "logits"] = numpy_forward(weights, h, z, use_ema)
    return out


def _max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def run_check(backends: Optional[Sequence[str]] = None, perturb: Optional[str] = None, log=print) -> int:
    """Runs every backend, prints the table, returns the exit code (0: all agree).

    `perturb` (tests): "BACKEND" perturbs that backend's logits, "BACKEND:step"
    its train step, to show that the table catches it.
    """
    backends = list(backends or installed_backends())
    target, _, what = (perturb or "").partition(":")
    results: Dict[str, Dict[str, np.ndarray]] = {}
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
            with np.load(path) as data:
                results[backend] = {k: data[k] for k in data.files if k != "backend"}

    reference = _reference_forward()
    # Train steps: compared with the first backend that ran; with fewer than
    # two there is nothing to compare with, and the step columns say so.
    step_backend = next(iter(results), None)
    compare_steps = len(results) >= 2
    columns = FORWARD_KEYS + STEP_KEYS
    header = f"{'backend':<11}" + "".join(f"{c:>15}" for c in columns) + "  status"
    log(
        "max |difference|: forward vs a numpy float64 forward pass; train step vs "
        + (f"the first backend ({step_backend})" if compare_steps else "another backend (n/a: needs two backends)")
    )
    log(header)
    bad = bool(failures)
    for backend in backends:
        if backend in failures:
            log(f"{backend:<11}{'':>{15 * len(columns)}}  FAILED: {failures[backend]}")
            continue
        row, ok = f"{backend:<11}", True
        for key in columns:
            if key in reference:
                ref = reference[key]
            elif not compare_steps:
                row += f"{'n/a':>15}"
                continue
            elif backend == step_backend:
                row += f"{'ref':>15}"
                continue
            else:
                ref = results[step_backend][key]
            diff = _max_diff(results[backend][key], ref)
            within = diff <= TOLERANCE[key] * max(1.0, float(np.max(np.abs(ref))))
            ok &= within
            row += f"{diff:>14.2e}{'' if within else '!'}"
        bad |= not ok
        status = "ok" if ok else "MISMATCH"
        log(row + f"  {status}" + ("" if compare_steps else " (forward only)"))
    log(f"tolerance: max |diff| <= tol * max(1, |reference|), tol = {TOLERANCE}")
    if results and not compare_steps:
        log(
            f"train step: NOT checked (only {step_backend} ran; the step columns compare backends with "
            "each other and need two or more)"
        )
    return 1 if bad or not results else 0
