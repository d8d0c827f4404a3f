"""`multicritic check`: what its table can and cannot catch.

The fast tests run the real worker in-process (on this session's backend)
under several names, through a stand-in for the worker subprocess, so that
two "backends" can be compared in every nox session; the cross-backend test
runs real subprocesses on two installed backends.
"""

import shutil
import subprocess

import pytest

from multicritic import check
from multicritic.check import FORWARD_KEYS, STEP_KEYS, TOLERANCE, installed_backends, run_check
from tests.demo.fake_env import run_cli

COLUMNS = FORWARD_KEYS + STEP_KEYS


@pytest.fixture(scope="module")
def worker_outputs(tmp_path_factory):
    """`check.worker`'s .npz per perturbation, each run once, here (it is deterministic)."""
    root, cache = tmp_path_factory.mktemp("workers"), {}

    def output(perturb):
        if perturb not in cache:
            cache[perturb] = root / f"{perturb}.npz"
            check.worker(str(cache[perturb]), perturb=perturb)
        return cache[perturb]

    return output


@pytest.fixture
def in_process_workers(monkeypatch, worker_outputs):
    """Replaces the worker subprocess with `check.worker` run here."""
    calls = []

    def fake_run(cmd, env=None, **kwargs):
        assert cmd[1:5] == ["-m", "multicritic", "check", "--worker"]
        perturb = cmd[cmd.index("--perturb-worker") + 1] if "--perturb-worker" in cmd else None
        calls.append((env["KERAS_BACKEND"], perturb))
        shutil.copyfile(worker_outputs(perturb), cmd[5])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(check.subprocess, "run", fake_run)
    return calls


def table(lines):
    """{backend: (cells by column, status)} from run_check's log lines."""
    header = next(i for i, line in enumerate(lines) if line.startswith("backend "))
    assert lines[header].split()[1:-1] == list(COLUMNS)
    rows = {}
    for line in lines[header + 1 :]:
        if line.startswith("tolerance:"):
            break
        tokens = line.split()
        rows[tokens[0]] = (dict(zip(COLUMNS, tokens[1 : 1 + len(COLUMNS)])), " ".join(tokens[1 + len(COLUMNS) :]))
    return rows


def test_one_backend_reports_the_train_step_as_not_checked(in_process_workers):
    lines = []
    assert run_check(["only"], log=lines.append) == 0
    assert in_process_workers == [("only", None)]
    cells, status = table(lines)["only"]
    for key in FORWARD_KEYS:
        assert float(cells[key]) <= TOLERANCE[key]  # against the numpy forward pass: a real check
    assert [cells[key] for key in STEP_KEYS] == ["n/a"] * len(STEP_KEYS)
    assert status == "ok (forward only)"
    assert "train step vs another backend (n/a: needs two backends)" in lines[0]
    assert lines[-1].startswith("train step: NOT checked (only only ran")


def test_a_perturbed_train_step_is_caught(in_process_workers):
    lines = []
    assert run_check(["first", "second"], perturb="second:step", log=lines.append) == 1
    assert in_process_workers == [("first", None), ("second", "step")]
    rows = table(lines)
    first, first_status = rows["first"]
    assert [first[key] for key in STEP_KEYS] == ["ref"] * len(STEP_KEYS) and first_status == "ok"
    second, second_status = rows["second"]
    assert second_status == "MISMATCH"
    # The weights after the step moved by 1e-4 (tolerance 1e-6): caught there,
    # and nowhere else (same backend, same numbers).
    assert second["step_fast"].endswith("!") and float(second["step_fast"][:-1]) == pytest.approx(1e-4, rel=1e-3)
    for key in FORWARD_KEYS + ("step_total", "step_grad_norm", "step_ema"):
        assert not second[key].endswith("!"), (key, second[key])
    assert "train step vs the first backend (first)" in lines[0]
    assert not any("NOT checked" in line for line in lines)


def test_an_unperturbed_pair_agrees_exactly(in_process_workers):
    lines = []
    assert run_check(["first", "second"], log=lines.append) == 0
    second, status = table(lines)["second"]
    assert status == "ok"
    assert [float(second[key]) for key in STEP_KEYS] == [0.0] * len(STEP_KEYS)


def test_a_perturbed_forward_pass_is_caught_on_one_backend(in_process_workers):
    lines = []
    assert run_check(["only"], perturb="only", log=lines.append) == 1
    cells, status = table(lines)["only"]
    assert status == "MISMATCH (forward only)"
    assert cells["logits"].endswith("!") and cells["ema_logits"].endswith("!")
    assert not cells["value"].endswith("!")


@pytest.mark.cross_backend
def test_a_perturbed_train_step_is_caught_across_real_backends():
    fastest_first = [b for b in ("jax", "torch", "tensorflow") if b in installed_backends()]
    if len(fastest_first) < 2:
        pytest.skip("needs two or more backends installed")
    first, second = fastest_first[:2]
    result = run_cli("check", "--backends", f"{first},{second}", "--perturb", f"{second}:step", env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 1, result.stdout + result.stderr
    rows = table(result.stdout.splitlines())
    assert rows[first][1] == "ok" and rows[second][1] == "MISMATCH"
    assert rows[second][0]["step_fast"].endswith("!")
    assert not any(rows[second][0][key].endswith("!") for key in FORWARD_KEYS)
