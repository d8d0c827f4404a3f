"""benchmarks/peers/peers.py (and peers_official.py) run at a tiny size, so that they cannot rot; no timing is asserted.

The peers' own packages (sheeprl, ray[rllib], torchrl; see tests/interop) are needed: without them, or on a
Keras backend other than PyTorch, the smoke test skips, except with MULTICRITIC_REQUIRE_UPSTREAM=1 (the
`interop` session), where a missing package is a failure.
"""

import importlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import BACKEND

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks.peers import peers, peers_official  # noqa: E402  (stdlib only at import)

OFFICIAL_PYTHON = os.environ.get("MULTICRITIC_OFFICIAL_PYTHON", "/tmp/official_work/venv/bin/python")


def _require_peers():
    if BACKEND != "torch":
        pytest.skip("the peers' critics are PyTorch modules (KERAS_BACKEND=torch)")
    for peer, module in peers.PEER_MODULES.items():
        try:
            importlib.import_module(module)
        except ImportError as err:
            if os.environ.get("MULTICRITIC_REQUIRE_UPSTREAM") == "1":
                raise
            pytest.skip(f"{module} not installed ({err})")


def _run(cmd, env=None):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.interop
def test_peers_benchmark_runs(tmp_path):
    _require_peers()
    out = tmp_path / "peers.json"
    result = _run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "peers", "peers.py"),
            "--size",
            "nano",
            "--batch",
            "8",
            "--repeats",
            "2",
            "--block-seconds",
            "0.01",
            "--threads",
            "1",
            "--json",
            str(out),
        ],
        env=dict(os.environ, KERAS_BACKEND="torch"),
    )
    records = json.loads(out.read_text())
    assert sorted((r["peer"], r["batch"]) for r in records) == [
        ("rllib", 8),
        ("sheeprl", 8),
        ("sheeprl_compiled", 8),
        ("torchrl", 8),
    ]
    for r in records:
        assert r["size"] == "nano" and r["backend"] == "torch" and "skipped" not in r
        assert r["peer_ms"] > 0 and r["multicritic_ms"] > 0
        assert r["ratio"] == pytest.approx(r["peer_ms"] / r["multicritic_ms"])
        # The compiled step ("auto" from its 1000th call) is timed too, unless --no-jit.
        assert r["multicritic_jit_ms"] > 0 and r["ratio_jit"] == pytest.approx(r["peer_ms"] / r["multicritic_jit_ms"])
        assert len(r["peer_samples"]) == len(r["multicritic_samples"]) == 2
        t, b = r["layout"]
        assert b * (t - (r["peer"] != "torchrl")) == 8  # sheeprl and RLlib carry the horizon's last row
    assert "| multicritic ms |" in result.stdout and "ratio (peer/ours jit)" in result.stdout


@pytest.mark.interop
def test_host_training_benchmark_runs(tmp_path):
    _require_peers()
    out = tmp_path / "host.json"
    result = _run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "peers", "host_training.py"),
            "--steps",
            "32",
            "--repeats",
            "1",
            "--json",
            str(out),
        ],
        env=dict(os.environ, KERAS_BACKEND="torch"),
    )
    (record,) = json.loads(out.read_text())
    assert record["steps"] == 32 and len(record["stock_s_all"]) == len(record["swap_s_all"]) == 1
    assert record["stock_s"] > 0 and record["swap_s"] > 0 and record["keras_import_s"] > 0
    assert record["swap_over_stock"] == pytest.approx(record["swap_s"] / record["stock_s"])
    assert "swap / stock" in result.stdout


@pytest.mark.interop
def test_host_training_benchmark_runs_rllib(tmp_path):
    _require_peers()
    out = tmp_path / "host.json"
    _run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "peers", "host_training.py"),
            "--host",
            "rllib",
            "--iterations",
            "3",
            "--repeats",
            "1",
            "--json",
            str(out),
        ],
        env=dict(os.environ, KERAS_BACKEND="torch"),
    )
    (record,) = json.loads(out.read_text())
    assert record["host"].startswith("RLlib") and record["iterations"] == 3
    assert record["stock_s"] > 0 and record["swap_s"] > 0 and record["keras_import_s"] > 0


@pytest.mark.interop
def test_official_benchmark_runs(tmp_path):
    """The official JAX code in its own environment (tests/data/interop/official/
    generate_official_critic_goldens.py says how to build it); paired with multicritic's JAX step when this
    Python has JAX."""
    if not os.path.isfile(OFFICIAL_PYTHON) or not os.path.isdir(
        os.environ.get("OFFICIAL_SRC", "/tmp/official_work/src")
    ):
        pytest.skip(f"no official DreamerV3 environment ({OFFICIAL_PYTHON}; MULTICRITIC_OFFICIAL_PYTHON sets it)")
    pair = importlib.util.find_spec("jax") is not None
    out = tmp_path / "official.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run(
        [
            OFFICIAL_PYTHON,
            os.path.join(ROOT, "benchmarks", "peers", "peers_official.py"),
            "--size",
            "nano",
            "--batch",
            "8",
            "--repeats",
            "2",
            "--block-seconds",
            "0.01",
            "--json",
            str(out),
        ]
        + (["--pair-python", sys.executable] if pair else []),
        env=env,
    )
    (record,) = json.loads(out.read_text())
    assert record["peer"] == "official" and record["batch"] == 8 and record["peer_ms"] > 0
    if pair:
        assert record["multicritic_ms"] > 0 and record["ratio"] > 0


def test_official_sizes_are_multicritics():
    from multicritic.model.sizes import _KEYS, _MODEL_DIMS

    assert peers_official.MODEL_DIMS == _MODEL_DIMS and peers_official.DIM_KEYS == _KEYS


def test_horizon_split():
    assert peers.horizon_split(15360) == (15, 1024)
    assert peers.horizon_split(4096) == (16, 256)
    assert peers.horizon_split(256) == (16, 16)
    assert peers.horizon_split(8) == (8, 1)
    assert peers.horizon_split(7) == (7, 1)
