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
from multicritic.cli.check import CONFIGS, TOLERANCE, installed_backends, run_check
from multicritic.interop import HOSTS
from tests.demo.fake_env import run_cli

SELF = ["compiled", "host"]
CROSS = ["fast", "ema", "loss", "grad_norm", "weights"]
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


def table(lines, columns=SELF + CROSS):
    """{(backend, config): (cells by column, status)} from run_check's log lines: one block per backend (its name
    alone on a line), its configurations indented under it."""
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    header = next(i for i, line in enumerate(lines) if line.startswith("config "))
    assert lines[header].split() == ["config", *columns, "status"], lines[header]
    rows, backend = {}, None
    for line in lines[header + 1 :]:
        if line.startswith("tolerance "):
            break
        if not line.startswith("  "):
            backend = line
            continue
        tokens = line.split()
        rows[backend, tokens[0]] = (
            dict(zip(columns, tokens[1 : 1 + len(columns)])),
            " ".join(tokens[1 + len(columns) :]),
        )
    return rows


def caught(cell):
    return cell.endswith("!")


def value(cell):
    return float(cell.rstrip("!"))


def test_one_backend_checks_only_its_compiled_forward_pass(in_process_workers):
    lines = []
    assert run_check(["only"], log=lines.append) == 0
    assert in_process_workers == [("only", None)]
    # Nothing to compare with: the table has the backend's own checks alone.
    rows = table(lines, SELF)
    assert list(rows) == [("only", config) for config in CONFIGS]
    for config in CONFIGS:
        cells, status = rows["only", config]
        # The backend's eager forward pass against its compiled one: a real check.
        assert value(cells["compiled"]) <= TOLERANCE["compiled"], (config, cells)
        # A host's export and load give the weights back exactly; the other configurations have no host.
        assert cells["host"] == ("0.00e+00" if config in HOST_CONFIGS else "-"), (config, cells)
        assert status == "ok"
    assert lines[0] == f"multicritic check on only (a process each, in turn): {len(CONFIGS)} critics, a train step each"
    assert lines[-2].split() == ["tolerance", "1e-04", "0e+00"]
    assert lines[-1] == "forward passes and train steps not compared across backends: only only ran"


def test_an_unperturbed_pair_agrees_exactly(in_process_workers):
    lines = []
    assert run_check(["first", "second"], log=lines.append) == 0
    rows = table(lines)
    assert list(rows) == [(b, c) for b in ("first", "second") for c in CONFIGS]
    for config in CONFIGS:
        first, first_status = rows["first", config]
        assert [first[key] for key in CROSS] == ["ref"] * 5 and first_status == "ok"
        second, status = rows["second", config]
        assert status == "ok"
        assert value(second["compiled"]) <= TOLERANCE["compiled"]
        # Same backend, same numbers: every cross-backend cell is a real 0.
        assert [value(second[key]) for key in CROSS] == [0.0] * 5, (config, second)
    assert any(line.startswith("  fast, ema: value and logits") and line.endswith("vs first ('ref')") for line in lines)
    assert lines[-1].split() == ["tolerance", "1e-04", "0e+00", "1e-04", "1e-04", "1e-05", "1e-04", "1e-06"]
    assert not any("not compared" in line for line in lines)


def test_a_failed_backend_is_a_row_of_its_own_and_fails_the_check(in_process_workers, monkeypatch):
    real = check.subprocess.run

    def second_fails(cmd, env=None, **kwargs):
        if env["KERAS_BACKEND"] == "second":
            return subprocess.CompletedProcess(cmd, 1, "", "Traceback ...\nRuntimeError: the worker broke\n")
        return real(cmd, env=env, **kwargs)

    monkeypatch.setattr(check.subprocess, "run", second_fails)
    lines = []
    assert run_check(["first", "second"], log=lines.append) == 1
    assert lines[lines.index("second") + 1] == "  FAILED: RuntimeError: the worker broke"
    # One backend ran: nothing compared, and the table says so.
    assert set(table(lines, SELF)) == {("first", c) for c in CONFIGS} | {("second", "FAILED:")}
    assert lines[-1] == "forward passes and train steps not compared across backends: only first ran"


def test_a_perturbed_train_step_is_caught_only_in_the_step_columns(in_process_workers):
    lines = []
    assert run_check(["first", "second"], perturb="second:step", log=lines.append) == 1
    assert in_process_workers == [("first", None), ("second", "step")]
    rows = table(lines)
    for config in CONFIGS:
        assert rows["first", config][1] == "ok"
        second, status = rows["second", config]
        assert status == "MISMATCH", config
        # The fast weights after the step moved by 1e-4 (tolerance 1e-6): caught
        # there, and nowhere else (same backend, same numbers).
        assert caught(second["weights"]) and value(second["weights"]) == pytest.approx(1e-4, rel=1e-3)
        for key in ["compiled", "fast", "ema", "loss", "grad_norm"]:
            assert not caught(second[key]), (config, key, second[key])


def test_a_perturbed_forward_pass_is_caught_only_in_the_forward_columns(in_process_workers):
    lines = []
    assert run_check(["first", "second"], perturb="second:forward", log=lines.append) == 1
    assert in_process_workers == [("first", None), ("second", "forward")]
    rows = table(lines)
    for config in CONFIGS:
        second, status = rows["second", config]
        assert status == "MISMATCH", config
        # Logits (eager and compiled alike, fast and EMA) shifted by 1e-3 (tolerance 1e-4).
        for key in ("fast", "ema"):
            assert caught(second[key]) and value(second[key]) == pytest.approx(1e-3, rel=1e-2), (config, key)
        for key in ("compiled", "loss", "grad_norm", "weights"):
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
        assert not any(caught(cells[key]) for key in ["compiled"] + CROSS), (config, cells)


@pytest.mark.parametrize("names", [["only"], ["first", "only"]])
def test_a_perturbed_compiled_path_is_caught_in_the_compiled_column(in_process_workers, names):
    lines = []
    assert run_check(names, perturb="only:compiled", log=lines.append) == 1
    compare = len(names) > 1
    rows = table(lines, SELF + CROSS if compare else SELF)
    for config in CONFIGS:
        cells, status = rows["only", config]
        assert status == "MISMATCH", config
        assert caught(cells["compiled"]) and value(cells["compiled"]) == pytest.approx(1e-3, rel=1e-2)
        # The eager forward pass and the step are the unperturbed ones.
        if compare:
            assert not any(caught(cells[key]) for key in CROSS), (config, cells)
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
    assert list(rows) == [(b, c) for b in (first, second) for c in CONFIGS]
    for config in CONFIGS:
        assert rows[first, config][1] == "ok" and rows[second, config][1] == "MISMATCH", config
        cells = rows[second, config][0]
        assert caught(cells["weights"])
        assert not any(caught(cells[key]) for key in ("compiled", "fast", "ema")), (config, cells)
