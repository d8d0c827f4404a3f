import io
import json
import math
import os
import shutil
import sys

import pytest

from multicritic.cli import main
from multicritic.heads import HEADS
from multicritic.cli.check import CONFIGS
from multicritic.demo.run import DemoConfig, run_demo
from tests.conftest import BACKEND
from tests.demo.fake_env import (
    FAKE_KERAS_LINE,
    blocking_site,
    noisy_site,
    run,
    run_cli,
    with_pythonpath,
)

ALL_BACKENDS = ("tensorflow", "torch", "jax")


def one_error_line(result) -> str:
    """The command refused its input: exit code 2 and exactly one line on
    stderr in total (no log line of a backend, no traceback)."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("multicritic: error: "), lines[0]
    assert result.stdout == ""
    return lines[0]


def other_backend() -> str:
    """A backend this session does not run on (installed or not)."""
    return next(b for b in ALL_BACKENDS if b != BACKEND)


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    """PYTHONPATH with a Keras that cannot be imported (exit 99) and a TensorFlow
    that prints absl/oneDNN lines on import, as on some CPUs (as env variables)."""
    return {"PYTHONPATH": with_pythonpath(noisy_site(tmp_path_factory.mktemp("noisy"))), "MULTICRITIC_TEST_BLOCK": ""}


@pytest.fixture(scope="module")
def blocking(tmp_path_factory):
    return with_pythonpath(blocking_site(tmp_path_factory.mktemp("blocking")))


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
    code = main(
        [
            "demo",
            "--size",
            "nano",
            "--steps",
            "30",
            "--scales",
            "1,1e6",
            "--no-progress",
            "--json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert data["backend"] == BACKEND
    assert [s["reward_scale"] for s in data["scales"]] == [1.0, 1e6]
    for s in data["scales"]:
        assert set(s) >= {"reward_scale", "relative_rmse", "steps", "seconds"} and s["steps"] == 30
        # One member: no spread to correlate.
        assert s["member_spread_error_pearson"] is None and s["member_spread_error_spearman"] is None
    assert data["config"]["head"] == "two_hot" and data["config"]["ensemble"] == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ensemble_demo_reports_spread_error_correlations(tmp_path, capsys):
    out = tmp_path / "demo.json"
    code = main(
        [
            "demo",
            "--ensemble",
            "3",
            "--head",
            "hl_gauss",
            "--size",
            "nano",
            "--steps",
            "20",
            "--scales",
            "1e6",
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "uniform_symlog bins, hl_gauss head, ensemble of 3 (mean)" in printed
    assert "spread~error r" in printed and "Spearman" in printed
    data = json.loads(out.read_text())
    config = data["config"]
    assert (config["head"], config["ensemble"], config["aggregation"], config["bin_scheme"]) == (
        "hl_gauss",
        3,
        "mean",
        "uniform_symlog",
    )
    for s in data["scales"]:
        for key in ("member_spread_error_pearson", "member_spread_error_spearman"):
            assert isinstance(s[key], float) and math.isfinite(s[key]) and -1.0 <= s[key] <= 1.0, (key, s[key])
        assert math.isfinite(s["mean_member_spread"]) and s["mean_member_spread"] > 0
        assert math.isfinite(s["relative_member_spread"]) and s["relative_member_spread"] > 0
        assert len(s["member_spreads"]) == len(s["true_values"]) == 48


def test_dreamerv3_2024_preset_learns_every_scale():
    config = DemoConfig(size="micro", steps=500, num_states=16, eval_every=100, preset="dreamerv3-2024")
    results = run_demo(config, progress=False, log=lambda *_: None)
    for r in results:
        assert r.relative_rmse < 0.1, (r.reward_scale, r.relative_rmse)


def test_a_step_that_cannot_be_compiled_falls_back_once(monkeypatch):
    """The demo compiles its step from the first call; where that fails (PyTorch's inductor without a C++
    compiler, say) it warns once and runs every scale as `jit_compile="auto"` does."""
    import warnings

    from multicritic import CriticTrainer

    real = CriticTrainer.train_on_dream
    modes = []

    def refuse_compiled(self, *args, **kwargs):
        modes.append(self.jit_compile)
        if self.jit_compile is True:
            raise RuntimeError("no C++ compiler")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CriticTrainer, "train_on_dream", refuse_compiled)
    config = DemoConfig(size="nano", steps=3, num_states=8, scales=(1.0, 10.0), eval_every=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = run_demo(config, progress=False, log=lambda *_: None)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert [m for m in messages if "could not be compiled (no C++ compiler)" in m] == [messages[0]]
    assert modes == [True] + ["auto"] * 6  # one refused step, then 3 steps per scale
    assert all(math.isfinite(r.relative_rmse) for r in results)


@pytest.mark.parametrize("aggregation", ["members", "min_of_random"])
def test_other_aggregations_run(aggregation):
    config = DemoConfig(
        size="nano", steps=2, num_states=8, scales=(1.0,), eval_every=1, ensemble=2, aggregation=aggregation
    )
    [result] = run_demo(config, progress=False, log=lambda *_: None)
    assert math.isfinite(result.relative_rmse) and len(result.member_spreads) == 8
    assert -1.0 <= result.member_spread_error_spearman <= 1.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["demo", "--size", "huge"], "--size: got 'huge'"),
        (["demo", "--backend", "mxnet"], "--backend: got 'mxnet'"),
        (["demo", "--json", "/nonexistent-dir/x.json"], "--json: cannot write '/nonexistent-dir/x.json'"),
        (["demo", "--bin-scheme", "log"], "--bin-scheme: got 'log'"),
        (
            ["demo", "--head", "softmax"],
            f"--head: got 'softmax', expected one of {list(HEADS)}",
        ),
        (
            ["demo", "--head", "hl_gauss", "--bin-scheme", "symexp"],
            "--bin-scheme: got 'symexp', expected one of ['uniform_symlog'] with --head hl_gauss",
        ),
        (["demo", "--ensemble", "0"], "--ensemble: got 0, expected an integer in [1, 64]"),
        (["demo", "--ensemble", "1000"], "--ensemble: got 1000, expected an integer in [1, 64]"),
        (["demo", "--ensemble", "two"], "argument --ensemble: invalid int value: 'two'"),
        (["demo", "--aggregation", "max"], "--aggregation: got 'max', expected one of"),
        (["demo", "--aggregation", "min_of_random"], "--aggregation: got 'min_of_random' with --ensemble 1"),
        (["demo", "--steps", "0"], "--steps: got 0"),
        (["demo", "--steps", "x"], "argument --steps: invalid int value: 'x'"),
        (["demo", "--seed", "-1"], "--seed: got -1, expected an integer in [0, 4294967295]"),
        (["demo", "--seed", "4294967296"], "--seed: got 4294967296, expected an integer in [0, 4294967295]"),
        (["demo", "--scales", "inf"], "--scales: got inf, expected finite numbers > 0"),
        (["demo", "--scales", "1,nan"], "--scales: got nan, expected finite numbers > 0"),
        (["demo", "--scales", "1,-1e3"], "--scales: got -1000.0, expected finite numbers > 0"),
        (["demo", "--scales", "0"], "--scales: got 0.0, expected finite numbers > 0"),
        (["demo", "--scales", "1,,2"], "--scales: got '1,,2', expected comma-separated numbers"),
        (
            ["demo", "--scales", "1e39"],
            "--scales: got 1e+39, whose exact values reach 3.75e+39, outside the critic's value support +-4.85e+08",
        ),
        (["demo", "--scales", "1,1e9"], "--scales: got 1e+09, whose exact values reach 3.75e+09"),
        (["demo", "--scales", "1e-7"], "--scales: got 1e-07, expected scales >= 1e-06"),
        (["demo", "--plot", "out.xyz"], "--plot: 'out.xyz' has extension '.xyz', expected one of .eps"),
        (["demo", "--plot", "out"], "--plot: 'out' has no extension"),
        (["demo", "--json", "same.png", "--plot", "same.png"], "--json and --plot: both got 'same.png'"),
        (["demo", "--json", "/"], "--json: got '/', expected a file path"),
        (["check", "--backends", "mxnet"], "--backends: got 'mxnet'"),
        (["check", "--backends", ","], "--backends: got ',', expected comma-separated names from"),
        (["check", "--backends", f"{BACKEND},{BACKEND}"], f"which names {BACKEND!r} twice"),
        (["check", "--backends", BACKEND, "--perturb", "mxnet"], "--perturb: got 'mxnet'"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_clear_one_line_errors(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("multicritic: error: ") and message in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert captured.out == ""  # refused before any work: not even the banner
    assert list(tmp_path.iterdir()) == []  # and nothing written


@pytest.mark.parametrize("installed", [["tensorflow"], ["jax", "torch"], []])
def test_keras_backend_is_checked_first_whatever_is_installed(installed, capsys, monkeypatch):
    """`check` with a wrong KERAS_BACKEND names KERAS_BACKEND, not what is (not)
    installed: a CI session with one backend installed met the other error first."""
    import multicritic.cli as cli

    monkeypatch.setattr(cli, "installed_backends", lambda: list(installed))
    monkeypatch.setenv("KERAS_BACKEND", "nonsense")
    with pytest.raises(SystemExit) as exit_:
        cli.preflight(["check"])  # what the command runs before Keras is imported
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("multicritic: error: KERAS_BACKEND: got 'nonsense', expected one of"), err


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["demo", "--seed", "-1"], {}, "--seed: got -1"),
        (["demo", "--seed", "4294967296"], {}, "--seed: got 4294967296"),
        (["demo", "--scales", "inf"], {}, "--scales: got inf"),
        (["demo", "--scales", "1e39"], {}, "--scales: got 1e+39"),
        (["demo", "--plot", "out.xyz"], {}, "--plot: 'out.xyz' has extension '.xyz'"),
        (["demo", "--steps", "0"], {}, "--steps: got 0"),
        (["demo", "--head", "hl_gauss", "--bin-scheme", "symexp"], {}, "--bin-scheme: got 'symexp'"),
        (["demo", "--ensemble", "65"], {}, "--ensemble: got 65"),
        (["demo", "--backend", "mxnet"], {}, "--backend: got 'mxnet'"),
        (["demo"], {"KERAS_BACKEND": "nonsense"}, "KERAS_BACKEND: got 'nonsense', expected one of"),
        (["demo"], {"KERAS_BACKEND": "numpy"}, "KERAS_BACKEND: got 'numpy', expected one of"),
        (["check"], {"KERAS_BACKEND": "nonsense"}, "KERAS_BACKEND: got 'nonsense', expected one of"),
        (["check", "--backends", ","], {}, "--backends: got ',', expected comma-separated names"),
        (["frobnicate"], {}, "invalid choice"),
    ],
)
def test_refused_before_keras_or_tensorflow_is_imported(args, env, message, noisy):
    """Finding 21: on some CPUs TensorFlow prints absl/oneDNN lines at import.
    Here a fake TensorFlow always does, and a fake Keras exits with code 99:
    the error must come first, alone, with exit code 2."""
    env = {"KERAS_BACKEND": "tensorflow", **noisy, **env}
    line = one_error_line(run_cli(*args, env=env, timeout=120))
    assert message in line


def test_console_script_refuses_before_importing_keras(noisy):
    script = shutil.which("multicritic", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("no `multicritic` console script next to this Python")
    env = {"KERAS_BACKEND": "tensorflow", **noisy}
    line = one_error_line(run([script, "demo", "--seed", "-1"], env=env))
    assert line.startswith("multicritic: error: --seed: got -1")
    # The fake Keras really is what Keras resolves to in these subprocesses.
    imported = run_cli("demo", "--steps", "1", env=env)
    assert imported.returncode == 99 and FAKE_KERAS_LINE in imported.stderr


def test_keras_json_backend_is_checked_too(noisy, tmp_path):
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "numpy"}))
    line = one_error_line(run_cli("demo", env={**noisy, "KERAS_HOME": str(tmp_path)}, unset=["KERAS_BACKEND"]))
    assert "the Keras backend from " in line and "keras.json: got 'numpy', expected one of" in line


def test_uninstalled_backend_is_a_one_line_error(blocking):
    """Finding 21 (`.ci/run` on another CPU): the error is the only stderr line,
    whatever the CPU, because nothing is imported before it."""
    missing = other_backend()
    env = {"PYTHONPATH": blocking, "MULTICRITIC_TEST_BLOCK": missing}
    line = one_error_line(run_cli("demo", "--backend", missing, "--steps", "1", env=env))
    assert line.startswith(f"multicritic: error: --backend: {missing!r} is not installed")
    line = one_error_line(run_cli("check", "--backends", f"{BACKEND},{missing}", env=env))
    assert line.startswith(f"multicritic: error: --backends: {missing!r} is not installed")
    # Without --backend, an uninstalled KERAS_BACKEND is refused the same way.
    line = one_error_line(run_cli("demo", "--steps", "1", env=dict(env, KERAS_BACKEND=missing)))
    assert line.startswith(f"multicritic: error: KERAS_BACKEND: {missing!r} is not installed")
    assert "or pass --backend" in line


def test_backend_flag_wins_over_an_uninstalled_keras_backend(blocking, tmp_path):
    """KERAS_BACKEND names a backend that is not installed, --backend one that
    is: the command decides before importing Keras and runs on --backend."""
    missing = other_backend()
    out = tmp_path / "demo.json"
    env = {"PYTHONPATH": blocking, "MULTICRITIC_TEST_BLOCK": missing, "KERAS_BACKEND": missing}
    result = run_cli(
        "demo",
        "--backend",
        BACKEND,
        "--size",
        "nano",
        "--steps",
        "2",
        "--scales",
        "1",
        "--no-progress",
        "--json",
        str(out),
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert f"multicritic demo: backend {BACKEND}," in result.stdout
    assert json.loads(out.read_text())["backend"] == BACKEND


def test_check_with_one_backend_installed_says_so_at_once(blocking, noisy):
    """Issue 72 item 7: with one backend installed, `multicritic check` ran it for most of a minute to report
    that it compared nothing. Said before any work now (one line, exit 2, before Keras is imported: the fake
    Keras on this path exits 99), with what to do."""
    others = [b for b in ALL_BACKENDS if b != BACKEND]
    env = {
        "PYTHONPATH": blocking + os.pathsep + noisy["PYTHONPATH"],
        "MULTICRITIC_TEST_BLOCK": ",".join(others),
        "KERAS_BACKEND": BACKEND,
    }
    line = one_error_line(run_cli("check", env=env, timeout=120))
    assert line.startswith(
        f"multicritic: error: --backends: only {BACKEND!r} is installed, and check compares backends with each "
        "other: install another (pip install "
    ), line
    assert f"'multicritic[{others[0]}]' or 'multicritic[{others[1]}]'" in line
    assert line.endswith(
        f"or pass --backends {BACKEND} to check {BACKEND} alone (its compiled forward pass "
        "against its eager one, and the hosts' checkpoint round trips)"
    ), line


@pytest.mark.cross_backend
def test_check_agrees_across_all_installed_backends():
    from multicritic.cli.check import installed_backends
    from tests.cli.test_check import table

    if len(installed_backends()) < 2:
        pytest.skip("needs two or more backends installed")
    result = run_cli("check")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = table(result.stdout.splitlines())
    assert list(rows) == [(backend, config) for backend in installed_backends() for config in CONFIGS]
    assert all(status == "ok" for _, status in rows.values())
    assert "not compared" not in result.stdout


def test_every_plot_format_offered_is_one_matplotlib_writes():
    pytest.importorskip("matplotlib")
    from matplotlib.backend_bases import FigureCanvasBase

    from multicritic.cli import PLOT_FORMATS

    assert set(PLOT_FORMATS) <= set(FigureCanvasBase.get_supported_filetypes())
    assert {"png", "pdf", "svg"} <= set(PLOT_FORMATS) and "pgf" not in PLOT_FORMATS  # pgf needs LaTeX


@pytest.mark.cross_backend
def test_main_in_process_reruns_the_demo_on_another_backend(tmp_path, capfd):
    from multicritic.cli.check import installed_backends

    others = [b for b in ("jax", "torch", "tensorflow") if b in installed_backends() and b != BACKEND]
    if not others:
        pytest.skip("needs a second backend installed")
    out = tmp_path / "demo.json"
    code = main(
        [
            "demo",
            "--backend",
            others[0],
            "--size",
            "nano",
            "--steps",
            "2",
            "--scales",
            "1",
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    assert code == 0, capfd.readouterr().err
    assert json.loads(out.read_text())["backend"] == others[0]
    assert f"multicritic demo: backend {others[0]}," in capfd.readouterr().out


def test_plot_without_an_importable_matplotlib_is_a_one_line_error(blocking, tmp_path):
    """Finding 18: matplotlib found but not importable (a missing part, a broken install) printed a
    traceback (exit 1) after the whole demo ran. It is imported before any work: one line, exit 2."""
    broken = tmp_path / "broken"
    (broken / "matplotlib").mkdir(parents=True)
    (broken / "matplotlib" / "__init__.py").write_text(
        "raise ImportError('matplotlib is broken: its compiled part is missing')\n"
    )
    out = tmp_path / "out.png"
    args = ("demo", "--size", "nano", "--steps", "1", "--scales", "1", "--no-progress", "--plot", str(out))
    cases = [
        # pyplot (what the plot imports) blocked, matplotlib itself importable.
        {"PYTHONPATH": blocking, "MULTICRITIC_TEST_BLOCK": "matplotlib.pyplot"},
        # A matplotlib that is found but fails on import.
        {"PYTHONPATH": with_pythonpath(broken)},
    ]
    for env in cases:
        line = one_error_line(run_cli(*args, env=dict(env, KERAS_BACKEND=BACKEND), timeout=300))
        assert line.startswith("multicritic: error: --plot: matplotlib cannot be imported ("), line
        assert not out.exists()


def test_the_demo_does_not_import_tensorflow_on_another_backend():
    import subprocess
    import sys

    if BACKEND == "tensorflow":
        pytest.skip("TensorFlow is the backend")
    code = (
        "import sys\nfrom multicritic.demo.run import DemoConfig, run_demo\n"
        "run_demo(DemoConfig(size='nano', steps=2, num_states=8, eval_every=1, scales=(1.0,), ensemble=2), "
        "progress=False)\nprint('tensorflow' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "KERAS_BACKEND": BACKEND},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("progress", [True, False])
def test_the_progress_bar_shows_on_a_terminal_unless_turned_off(progress, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    config = DemoConfig(size="nano", steps=4, num_states=8, scales=(1.0, 10.0), eval_every=2)
    run_demo(config, progress=progress, log=lambda *_: None)
    shown = terminal.getvalue()
    if progress:
        # One bar per scale, redrawn in place, ending at the last step with the last error.
        assert shown.count("4/4") >= 2 and "rel_rmse" in shown and "\r" in shown, shown
    else:
        assert shown == ""


def test_the_progress_bar_is_off_when_stdout_is_not_a_terminal():
    """Issue 72 item 7: piped to a file, each scale's bar was one 4 KB line of control codes. Without a terminal
    the output is the banner, a line per scale and the summary, with or without --no-progress."""
    args = ("demo", "--size", "nano", "--steps", "4", "--scales", "1,10")
    piped, quiet = (run_cli(*args, *extra, env={"KERAS_BACKEND": BACKEND}) for extra in ((), ("--no-progress",)))
    for result in (piped, quiet):
        assert result.returncode == 0, result.stderr[-2000:]
    assert "\r" not in piped.stdout and "\x1b" not in piped.stdout and "\b" not in piped.stdout
    assert "rel_rmse" not in piped.stdout and "━" not in piped.stdout
    lines = piped.stdout.splitlines()
    assert lines[0].startswith(f"multicritic demo: backend {BACKEND}, size nano")
    assert [line.split(":")[0] for line in lines if ": exact values in [" in line] == [
        "reward scale 1",
        "reward scale 10",
    ]
    # The same lines as with --no-progress but for the times each scale took.
    assert len(lines) == len(quiet.stdout.splitlines()) and max(len(line) for line in lines) <= 120
