import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from multicritic.cli import main
from multicritic.demo.run import DemoConfig, run_demo
from tests.conftest import BACKEND


def run_cli(*args, env=None, timeout=600):
    env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "multicritic", *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_tiny_demo_learns_every_scale():
    config = DemoConfig(size="micro", steps=500, num_states=16, eval_every=100, learning_rate=3e-3)
    results = run_demo(config, progress=False, log=lambda *_: None)
    assert [r.reward_scale for r in results] == [1.0, 1e3, 1e6]
    for r in results:
        assert r.relative_rmse < 0.1, (r.reward_scale, r.relative_rmse)
        assert r.curve[-1][0] == 500 and r.curve[0][1] > r.relative_rmse


def test_demo_command_writes_json_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "demo.json", tmp_path / "demo.png"
    code = main(["demo", "--size", "nano", "--steps", "30", "--scales", "1,1e6", "--no-progress",
                 "--json", str(out), "--plot", str(png)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["backend"] == BACKEND
    assert [s["reward_scale"] for s in data["scales"]] == [1.0, 1e6]
    for s in data["scales"]:
        assert set(s) >= {"reward_scale", "relative_rmse", "steps", "seconds"} and s["steps"] == 30
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["demo", "--size", "huge"], "--size: got 'huge'"),
        (["demo", "--backend", "mxnet"], "--backend: got 'mxnet'"),
        (["demo", "--json", "/nonexistent-dir/x.json"], "--json: cannot write '/nonexistent-dir/x.json'"),
        (["demo", "--bin-scheme", "log"], "--bin-scheme: got 'log'"),
        (["demo", "--steps", "0"], "--steps: got 0"),
        (["check", "--backends", "mxnet"], "--backends: got 'mxnet'"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_clear_one_line_errors(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("multicritic: error: ") and message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_uninstalled_backend_is_a_one_line_error():
    missing = [b for b in ("tensorflow", "torch", "jax") if __import__("importlib").util.find_spec(b) is None]
    if not missing:
        pytest.skip("every backend is installed here")
    result = run_cli("demo", "--backend", missing[0], "--steps", "1")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"multicritic: error: --backend: {missing[0]!r} is not installed")


def test_check_passes_and_detects_a_perturbed_backend():
    ok = run_cli("check", "--backends", BACKEND)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert BACKEND in ok.stdout and "ok" in ok.stdout
    bad = run_cli("check", "--backends", BACKEND, "--perturb", BACKEND)
    assert bad.returncode == 1
    assert "MISMATCH" in bad.stdout


@pytest.mark.cross_backend
def test_check_agrees_across_all_installed_backends():
    from multicritic.check import installed_backends

    if len(installed_backends()) < 2:
        pytest.skip("needs two or more backends installed")
    result = run_cli("check")
    assert result.returncode == 0, result.stdout + result.stderr
    for backend in installed_backends():
        assert f"{backend:<11}" in result.stdout
