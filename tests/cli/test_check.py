"""`multicritic check`: what its table can and cannot catch.

The fast tests run the real worker in-process (on this session's backend)
under several names, through a stand-in for the worker subprocess, so that
two "backends" can be compared in every nox session; the cross-backend test
runs real subprocesses on two installed backends.
"""

import shutil
import subprocess

import pytest

from multicritic.cli import check
from multicritic.cli.check import CONFIGS, FORWARD_KEYS, STEP_KEYS, TOLERANCE, installed_backends, run_check
from multicritic.interop import HOSTS
from tests.demo.fake_env import run_cli

COLUMNS = ("compiled", "host") + FORWARD_KEYS + STEP_KEYS
HOST_CONFIGS = [f"{name}-host" for name in HOSTS]


@pytest.fixture(scope="module")
def worker_outputs(tmp_path_factory):
    """`check.worker`'s .npz per perturbation, here: the configurations run once (they are deterministic), each
    perturbation written from those outputs by the worker."""
    root, cache, computed = tmp_path_factory.mktemp("workers"), {}, {}

    def output(perturb):
        if perturb not in cache:
            if not computed:
                computed.update(check.outputs())
            cache[perturb] = root / f"{perturb}.npz"
            check.worker(str(cache[perturb]), perturb=perturb, computed=computed)
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
    """{(backend, config): (cells by column, status)} from run_check's log lines."""
    header = next(i for i, line in enumerate(lines) if line.startswith("backend:config "))
    assert lines[header].split()[1:-1] == list(COLUMNS)
    rows = {}
    for line in lines[header + 1 :]:
        if line.startswith("tolerance:"):
            break
        tokens = line.split()
        backend, _, config = tokens[0].partition(":")
        rows[backend, config] = (dict(zip(COLUMNS, tokens[1 : 1 + len(COLUMNS)])), " ".join(tokens[1 + len(COLUMNS) :]))
    return rows


def caught(cell):
    return cell.endswith("!")


def value(cell):
    return float(cell.rstrip("!"))


def test_one_backend_checks_only_its_compiled_forward_pass(in_process_workers):
    lines = []
    assert run_check(["only"], log=lines.append) == 0
    assert in_process_workers == [("only", None)]
    rows = table(lines)
    assert list(rows) == [("only", config) for config in CONFIGS]
    for config in CONFIGS:
        cells, status = rows["only", config]
        # The backend's eager forward pass against its compiled one: a real check.
        assert value(cells["compiled"]) <= TOLERANCE["compiled"], (config, cells)
        # A host's export and load give the weights back exactly; the other configurations have no host.
        assert cells["host"] == ("0.00e+00" if config in HOST_CONFIGS else "-"), (config, cells)
        assert [cells[key] for key in FORWARD_KEYS + STEP_KEYS] == ["n/a"] * 8, (config, cells)
        assert status == "ok (one backend: compiled only)"
    assert "forward and train step vs another backend (n/a: needs two)" in lines[0]
    assert lines[-1].startswith("forward and train step: NOT compared across backends (only only ran")


def test_an_unperturbed_pair_agrees_exactly(in_process_workers):
    lines = []
    assert run_check(["first", "second"], log=lines.append) == 0
    rows = table(lines)
    assert set(rows) == {(b, c) for b in ("first", "second") for c in CONFIGS}
    for config in CONFIGS:
        first, first_status = rows["first", config]
        assert [first[key] for key in FORWARD_KEYS + STEP_KEYS] == ["ref"] * 8 and first_status == "ok"
        second, status = rows["second", config]
        assert status == "ok"
        assert value(second["compiled"]) <= TOLERANCE["compiled"]
        # Same backend, same numbers: every cross-backend cell is a real 0.
        assert [value(second[key]) for key in FORWARD_KEYS + STEP_KEYS] == [0.0] * 8, (config, second)
    assert "forward and train step vs the first backend (first)" in lines[0]
    assert not any("NOT compared" in line for line in lines)


def test_a_perturbed_train_step_is_caught_only_in_the_step_columns(in_process_workers):
    lines = []
    assert run_check(["first", "second"], perturb="second:step", log=lines.append) == 1
    assert in_process_workers == [("first", None), ("second", "step")]
    rows = table(lines)
    for config in CONFIGS:
        assert rows["first", config][1] == "ok"
        second, status = rows["second", config]
        assert status == "MISMATCH", config
        # The weights after the step moved by 1e-4 (tolerance 1e-6): caught
        # there, and nowhere else (same backend, same numbers).
        assert caught(second["step_fast"]) and value(second["step_fast"]) == pytest.approx(1e-4, rel=1e-3)
        for key in ("compiled",) + FORWARD_KEYS + ("step_total", "step_grad_norm", "step_ema"):
            assert not caught(second[key]), (config, key, second[key])


def test_a_perturbed_forward_pass_is_caught_only_in_the_forward_columns(in_process_workers):
    lines = []
    assert run_check(["first", "second"], perturb="second:forward", log=lines.append) == 1
    assert in_process_workers == [("first", None), ("second", "forward")]
    rows = table(lines)
    for config in CONFIGS:
        second, status = rows["second", config]
        assert status == "MISMATCH", config
        # Logits (eager and compiled alike) shifted by 1e-3 (tolerance 1e-4).
        for key in ("logits", "ema_logits"):
            assert caught(second[key]) and value(second[key]) == pytest.approx(1e-3, rel=1e-2), (config, key)
        for key in ("compiled", "value", "ema_value") + STEP_KEYS:
            assert not caught(second[key]), (config, key, second[key])


def test_every_host_is_checked_and_a_broken_round_trip_is_caught_in_the_host_column(in_process_workers):
    assert HOST_CONFIGS and set(HOST_CONFIGS) <= set(CONFIGS)
    lines = []
    assert run_check(["first", "second"], perturb="second:host", log=lines.append) == 1
    rows = table(lines)
    for config in CONFIGS:
        cells, status = rows["second", config]
        if config in HOST_CONFIGS:
            assert status == "MISMATCH" and caught(cells["host"]), (config, cells)
            assert value(cells["host"]) == pytest.approx(1e-6, rel=1e-2)
        else:
            assert status == "ok" and cells["host"] == "-", (config, cells)
        assert not any(caught(cells[key]) for key in ("compiled",) + FORWARD_KEYS + STEP_KEYS), (config, cells)


@pytest.mark.parametrize("names", [["only"], ["first", "only"]])
def test_a_perturbed_compiled_path_is_caught_in_the_compiled_column(in_process_workers, names):
    lines = []
    assert run_check(names, perturb="only:compiled", log=lines.append) == 1
    rows = table(lines)
    compare = len(names) > 1
    for config in CONFIGS:
        cells, status = rows["only", config]
        assert status == "MISMATCH" + ("" if compare else " (one backend: compiled only)"), config
        assert caught(cells["compiled"]) and value(cells["compiled"]) == pytest.approx(1e-3, rel=1e-2)
        # The eager forward pass and the step are the unperturbed ones.
        if compare:
            assert not any(caught(cells[key]) for key in FORWARD_KEYS + STEP_KEYS), (config, cells)
        else:
            assert [cells[key] for key in FORWARD_KEYS + STEP_KEYS] == ["n/a"] * 8, (config, cells)
        if compare:
            assert rows["first", config][1] == "ok"


@pytest.mark.cross_backend
def test_a_perturbed_train_step_is_caught_across_real_backends():
    fastest_first = [b for b in ("jax", "torch", "tensorflow") if b in installed_backends()]
    if len(fastest_first) < 2:
        pytest.skip("needs two or more backends installed")
    first, second = fastest_first[:2]
    result = run_cli(
        "check", "--backends", f"{first},{second}", "--perturb", f"{second}:step", env={"TF_CPP_MIN_LOG_LEVEL": "3"}
    )
    assert result.returncode == 1, result.stdout + result.stderr
    rows = table(result.stdout.splitlines())
    assert set(rows) == {(b, c) for b in (first, second) for c in CONFIGS}
    for config in CONFIGS:
        assert rows[first, config][1] == "ok" and rows[second, config][1] == "MISMATCH", config
        cells = rows[second, config][0]
        assert caught(cells["step_fast"])
        assert not any(caught(cells[key]) for key in ("compiled",) + FORWARD_KEYS), (config, cells)
