"""Checkpoints saved on each backend load on each of the others (the `cross-backend` nox session).

Every installed backend, in a subprocess of its own, builds a critic with
non-default options and distinct random fast and EMA weights, saves it with
`critic.save_weights` and `critic.save` (.keras), trains it 3 steps, saves the
trainer with `trainer.save`, then trains 2 more steps. It writes what it saw
(weights, outputs, trainer state, metrics) to an `.npz` of its own through the
public APIs, so nothing here depends on the checkpoint files' internals.

Every installed backend then, again in a subprocess, loads every other
backend's three files through the public APIs (`load_weights`,
`keras.saving.load_model`, `trainer.restore`) and reports:

- weights and restored trainer state: bit-identical to the saver's;
- outputs on the same inputs, and the metrics and weights of the 2 steps
  after the restore: their largest difference to the saver's, asserted here
  against tolerances set from the measured cross-backend gaps.

The same loader processes also check the committed goldens
(tests/data/golden_*, saved on JAX) on every backend, so the golden
checkpoint is loaded and checked in this session too.

Run as a script it is the subprocess body: `python -m
tests.test_cross_backend_checkpoints save DIR` or `... load DIR SAVER_DIR...`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.portable import KINDS, OPTIONS, TRAINER_OPTIONS, golden_batch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
BACKENDS = ("tensorflow", "torch", "jax")
INSTALLED = [b for b in BACKENDS if importlib.util.find_spec(b) is not None]
SEEDS = {"tensorflow": 21, "torch": 22, "jax": 23}
SAVED_STEPS, NEXT_STEPS = 3, (3, 4)  # ema_update_period=2: step 4 updates the EMA from the restored counter
# Every metric a step returns is compared; these must be among them.
METRICS = ("total", "value_nll", "ema_regularizer", "grad_norm", "clipped_fraction", "ema_value_gap")

# Tolerances, from the largest gaps measured over all six saver -> loader
# pairs and the goldens on all three backends (2 CPU cores, x86-64); a gap is
# the largest difference relative to the largest magnitude of the saver's array:
# - logits, fast and EMA: 1.7e-7 (torch -> tensorflow); the docs promise 1e-6;
# - values (symlog space; this critic uses the 2024 scheme, whose decode
#   amplifies the logits' roundings): 6.6e-7 (torch -> tensorflow);
# - the 2 steps after a restore, every metric: 4.6e-6 (grad_norm, torch ->
#   tensorflow); weights, EMA weights and Adam slots (absolute): 8.4e-7.
# Everything the loader reads back (weights, EMA weights, optimizer slots,
# step counter, config) is compared bit for bit.
LOGITS_RTOL = 1e-6
VALUE_RTOL = 5e-6
STEP_RTOL = 2e-5
WEIGHT_ATOL = 5e-6


# ---------------------------------------------------------------------------
# Subprocess bodies (run with KERAS_BACKEND set).


def _np(x):
    import keras

    if hasattr(x, "detach"):
        x = x.detach()
    return np.array(keras.ops.convert_to_numpy(x))


def _outputs(critic, *inputs):
    """[fast value, fast logits, EMA value, EMA logits] on the critic's inputs (`h, z`, or `x`)."""
    return [_np(x) for use_ema in (False, True) for x in critic(*inputs, use_ema=use_ema)]


def _output_gaps(got, want):
    """Largest relative gaps of the values and of the logits (fast and EMA)."""
    gaps = [_rel(g, w) for g, w in zip(got, want)]
    return {"value": max(gaps[0], gaps[2]), "logits": max(gaps[1], gaps[3])}


def _inputs(critic):
    rng = np.random.default_rng(5)
    if critic.input_layout == "features":
        return (rng.normal(size=(9, critic.input_size)).astype(np.float32),)
    h = rng.normal(size=(9, critic.gru_units)).astype(np.float32)
    z = rng.random((9, critic.num_z_categoricals, critic.num_z_classes)).astype(np.float32)
    return h, z


def _scramble(critic, seed):
    """Different weights in a fresh critic, so everything checked must come from the file."""
    rng = np.random.default_rng(seed)
    for v in critic.weights:
        v.assign(rng.normal(scale=0.5, size=tuple(v.shape)).astype(np.float32))


def _rel(got, want):
    """Largest difference relative to the largest magnitude of `want` (0 when both are 0)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = float(np.max(np.abs(got - want)))
    scale = float(np.max(np.abs(want)))
    return 0.0 if diff == 0 else (diff / scale if scale else float("inf"))


def _abs(got, want):
    return float(np.max(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))))


def _config(config):
    return json.loads(json.dumps(config))


def save(out_dir):
    import keras

    backend = keras.backend.backend()
    for kind, options in KINDS.items():
        _save_kind(os.path.join(out_dir, kind), options, backend)
    return {"backend": backend, "saved": out_dir}


def _save_kind(out_dir, options, backend):
    import keras

    from multicritic import CriticNetwork, CriticTrainer

    os.makedirs(out_dir, exist_ok=True)
    keras.utils.set_random_seed(SEEDS[backend])
    critic = CriticNetwork(**options)
    rng = np.random.default_rng(SEEDS[backend])
    for v in critic.weights:  # fast and EMA weights distinct, and distinct per backend
        value = rng.normal(scale=0.2, size=tuple(v.shape)).astype(np.float32)
        # A batch norm's variance (XQC's trunk) positive, as a variance is: near 0 it amplifies each rounding.
        v.assign(np.abs(value) + 1.0 if v.path.endswith("/moving_variance") else value)
    critic.save_weights(os.path.join(out_dir, "critic.weights.h5"))
    critic.save(os.path.join(out_dir, "critic.keras"))
    seen = {"backend": np.array(backend), "config": np.array(json.dumps(critic.get_config()))}
    seen.update({f"weight_{i}": _np(v.value) for i, v in enumerate(critic.weights)})
    seen.update({f"output_{i}": x for i, x in enumerate(_outputs(critic, *_inputs(critic)))})
    trainer = CriticTrainer(critic, learning_rate=1e-3, **TRAINER_OPTIONS)
    for step in range(SAVED_STEPS):
        trainer.train_step(*golden_batch(critic, step))
    trainer.save(os.path.join(out_dir, "trainer"))
    seen.update({f"state_{i}": _np(v.value) for i, v in enumerate(trainer.state_variables)})
    for step in NEXT_STEPS:
        metrics = trainer.train_step(*golden_batch(critic, step))
        seen.update({f"step{step}_{k}": _np(v) for k, v in metrics.items()})
    seen.update({f"final_{i}": _np(v.value) for i, v in enumerate(trainer.state_variables)})
    np.savez(os.path.join(out_dir, "seen.npz"), **seen)


def _load_one(saver_dir):
    reports = {kind: _load_kind(os.path.join(saver_dir, kind), options) for kind, options in KINDS.items()}
    return dict(reports["single"], saver=reports["single"]["saver"], kinds=reports)


def _load_kind(saver_dir, options):
    import keras

    from multicritic import CriticNetwork, CriticTrainer

    seen = dict(np.load(os.path.join(saver_dir, "seen.npz")))
    n_weights = len([k for k in seen if k.startswith("weight_")])
    report = {"saver": str(seen["backend"])}

    critic = CriticNetwork(**options)
    _scramble(critic, 1)
    critic.load_weights(os.path.join(saver_dir, "critic.weights.h5"))
    report["h5_weights_equal"] = len(critic.weights) == n_weights and all(
        np.array_equal(_np(v.value), seen[f"weight_{i}"]) for i, v in enumerate(critic.weights)
    )
    want = [seen[f"output_{i}"] for i in range(4)]
    report["h5_output_rel"] = _output_gaps(_outputs(critic, *_inputs(critic)), want)

    loaded = keras.saving.load_model(os.path.join(saver_dir, "critic.keras"))
    report["keras_is_critic"] = isinstance(loaded, CriticNetwork)
    report["keras_config_equal"] = _config(loaded.get_config()) == _config(json.loads(str(seen["config"])))
    report["keras_weights_equal"] = len(loaded.weights) == n_weights and all(
        np.array_equal(_np(v.value), seen[f"weight_{i}"]) for i, v in enumerate(loaded.weights)
    )
    report["keras_output_rel"] = _output_gaps(_outputs(loaded, *_inputs(loaded)), want)

    critic = CriticNetwork(**options)
    _scramble(critic, 2)
    trainer = CriticTrainer(critic, learning_rate=1e-3, **TRAINER_OPTIONS)
    trainer.restore(os.path.join(saver_dir, "trainer.npz"))
    state = trainer.state_variables
    n_state = len([k for k in seen if k.startswith("state_")])
    report["trainer_state_equal"] = len(state) == n_state and all(
        np.array_equal(_np(v.value), seen[f"state_{i}"]) for i, v in enumerate(state)
    )
    report["trainer_steps"] = int(_np(trainer.steps))
    report["trainer_metric_rel"] = {}
    report["trainer_metric_keys_equal"] = True
    for step in NEXT_STEPS:
        metrics = trainer.train_step(*golden_batch(critic, step))
        saved = {k.split("_", 1)[1] for k in seen if k.startswith(f"step{step}_")}
        report["trainer_metric_keys_equal"] &= set(metrics) == saved
        for k in saved & set(metrics):
            rel = _rel(_np(metrics[k]), seen[f"step{step}_{k}"])
            report["trainer_metric_rel"][k] = max(report["trainer_metric_rel"].get(k, 0.0), rel)
    report["trainer_final_abs"] = max(_abs(_np(v.value), seen[f"final_{i}"]) for i, v in enumerate(state))
    return report


def _goldens():
    """The committed goldens (saved on JAX) on this backend."""
    import keras

    from multicritic import CriticNetwork, CriticTrainer

    golden = dict(np.load(os.path.join(DATA, "golden_outputs.npz")))
    want = [golden["fast_value"], golden["fast_logits"], golden["ema_value"], golden["ema_logits"]]
    report = {"saver": str(golden["backend"])}
    critic = CriticNetwork(**OPTIONS)
    _scramble(critic, 3)
    critic.load_weights(os.path.join(DATA, "golden_critic.weights.h5"))
    report["h5_output_rel"] = _output_gaps(_outputs(critic, golden["h"], golden["z"]), want)
    loaded = keras.saving.load_model(os.path.join(DATA, "golden_critic.keras"))
    report["keras_is_critic"] = isinstance(loaded, CriticNetwork)
    report["keras_output_rel"] = _output_gaps(_outputs(loaded, golden["h"], golden["z"]), want)
    critic = CriticNetwork(**OPTIONS)
    _scramble(critic, 4)
    trainer = CriticTrainer(critic, learning_rate=1e-3, **TRAINER_OPTIONS)
    trainer.restore(os.path.join(DATA, "golden_trainer.npz"))
    report["trainer_steps"] = int(_np(trainer.steps))
    metrics = trainer.train_step(*golden_batch(critic, SAVED_STEPS))
    # Every metric the goldens hold (those the trainer had when they were made).
    report["trainer_metric_rel"] = {
        k: _rel(_np(v), golden[f"next_{k}"]) for k, v in metrics.items() if f"next_{k}" in golden
    }
    report["trainer_final_abs"] = max(
        _abs(_np(v.value), golden[f"next_weight_{i}"]) for i, v in enumerate(critic.weights)
    )
    return report


def load(saver_dirs):
    import keras

    return {"backend": keras.backend.backend(), "loaded": [_load_one(d) for d in saver_dirs], "goldens": _goldens()}


# ---------------------------------------------------------------------------
# The tests (parent process: whichever backend the session runs on).

pytestmark = [
    pytest.mark.cross_backend,
    pytest.mark.skipif(len(INSTALLED) < 2, reason="needs two or more Keras backends installed"),
]


def _run_all(jobs):
    """Runs `(backend, args)` subprocesses side by side; returns their JSON reports."""
    procs = []
    for backend, args in jobs:
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
        env.pop("XLA_FLAGS", None)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.test_cross_backend_checkpoints", *args],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    reports = []
    try:
        for (backend, _), proc in zip(jobs, procs):
            out, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, f"{backend} subprocess failed:\n{err[-3000:]}"
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:  # none left behind after a failure or a timeout
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return reports


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    dirs = {b: str(tmp_path_factory.mktemp(f"saved_on_{b}")) for b in INSTALLED}
    saved = _run_all([(b, ["save", dirs[b]]) for b in INSTALLED])
    assert [r["backend"] for r in saved] == INSTALLED  # each really ran on its backend
    loaded = _run_all([(b, ["load", *(dirs[s] for s in INSTALLED if s != b)]) for b in INSTALLED])
    out = {}
    for r in loaded:
        out[("goldens", r["backend"])] = r["goldens"]
        for one in r["loaded"]:
            out[(one["saver"], r["backend"])] = one
    print("\ncross-backend checkpoint report:", json.dumps({f"{s}->{ld}": v for (s, ld), v in out.items()}, indent=1))
    return out


def _check_outputs(r):
    for kind in ("h5", "keras"):
        gaps = r[f"{kind}_output_rel"]
        assert gaps["logits"] < LOGITS_RTOL and gaps["value"] < VALUE_RTOL, (kind, gaps)


PAIRS = [(s, ld) for s in INSTALLED for ld in INSTALLED if s != ld]


@pytest.mark.parametrize("saver, loader", PAIRS, ids=[f"{s}->{ld}" for s, ld in PAIRS])
@pytest.mark.parametrize("kind", list(KINDS))
def test_critic_files_saved_on_one_backend_load_on_another(reports, saver, loader, kind):
    r = reports[(saver, loader)]["kinds"][kind]
    assert r["saver"] == saver
    assert r["h5_weights_equal"], ".weights.h5: weights differ from the saver's"
    assert r["keras_is_critic"] and r["keras_config_equal"], ".keras: not the saved critic and options"
    assert r["keras_weights_equal"], ".keras: weights differ from the saver's"
    _check_outputs(r)


@pytest.mark.parametrize("saver, loader", PAIRS, ids=[f"{s}->{ld}" for s, ld in PAIRS])
@pytest.mark.parametrize("kind", list(KINDS))
def test_trainer_checkpoint_saved_on_one_backend_resumes_on_another(reports, saver, loader, kind):
    r = reports[(saver, loader)]["kinds"][kind]
    assert r["trainer_state_equal"], "restored state (critic, EMA, optimizer slots, counter) differs from the saver's"
    assert r["trainer_steps"] == SAVED_STEPS
    assert r["trainer_metric_keys_equal"] and set(METRICS) <= set(r["trainer_metric_rel"])
    assert max(r["trainer_metric_rel"].values()) < STEP_RTOL, r["trainer_metric_rel"]
    assert r["trainer_final_abs"] < WEIGHT_ATOL, r


@pytest.mark.parametrize("loader", INSTALLED)
def test_committed_goldens_load_on_every_backend(reports, loader):
    r = reports[("goldens", loader)]
    assert r["saver"] == "jax"
    assert r["keras_is_critic"]
    _check_outputs(r)
    assert r["trainer_steps"] == SAVED_STEPS
    assert {"total", "value_nll", "ema_regularizer", "grad_norm"} <= set(r["trainer_metric_rel"])
    assert max(r["trainer_metric_rel"].values()) < STEP_RTOL, r["trainer_metric_rel"]
    assert r["trainer_final_abs"] < WEIGHT_ATOL, r


if __name__ == "__main__":
    command, out_dir, *rest = sys.argv[1:]
    result = save(out_dir) if command == "save" else load([out_dir, *rest])
    print(json.dumps(result))
