"""`multicritic.backend.selection`: which Keras backend `import multicritic` leaves or picks.

In-process tests fake which backends are installed (`importlib.util.find_spec`)
and whether Keras is imported; two subprocess tests import multicritic for real
with a keras.json in a temporary KERAS_HOME.
"""

import importlib.util
import json
import os
import sys

import pytest

from multicritic.backend import selection
from multicritic.cli.check import installed_backends
from tests.conftest import BACKEND
from tests.demo.fake_env import blocking_site, run, with_pythonpath


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """Sets up a fake world: `fake(configured=..., installed=..., keras_imported=...)`."""

    def setup(configured=None, installed=(), keras_imported=False, keras_backend=None, config_text=None):
        monkeypatch.setenv("KERAS_HOME", str(tmp_path))
        monkeypatch.setattr(sys, "argv", ["not-the-multicritic-command"])
        if keras_backend is None:
            monkeypatch.delenv("KERAS_BACKEND", raising=False)
        else:
            monkeypatch.setenv("KERAS_BACKEND", keras_backend)
        if config_text is not None:
            (tmp_path / "keras.json").write_text(config_text)
        elif configured is not None:
            (tmp_path / "keras.json").write_text(json.dumps({"backend": configured, "floatx": "float32"}))
        if not keras_imported:
            monkeypatch.delitem(sys.modules, "keras", raising=False)
        real_find_spec = importlib.util.find_spec

        def find_spec(name, package=None):
            if name in ("tensorflow", "torch", "jax", "numpy", "nonexistent_backend"):
                return real_find_spec("json") if name in installed else None
            return real_find_spec(name, package)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)

    return setup


def chosen():
    return os.environ.get("KERAS_BACKEND")


def test_keras_backend_set_is_left_alone(fake):
    fake(configured="tensorflow", installed=("jax", "torch", "keras"), keras_backend="torch")
    selection.select()
    assert chosen() == "torch"


def test_keras_backend_set_to_a_missing_framework_is_one_line(fake):
    fake(configured="tensorflow", installed=("jax", "keras"), keras_backend="torch")
    with pytest.raises(
        ModuleNotFoundError,
        match=r"^KERAS_BACKEND='torch', but torch is not installed: pip install "
        r"'multicritic\[torch\]'",
    ):
        selection.select()


def test_nothing_changes_once_keras_is_imported(fake):
    fake(configured="tensorflow", installed=("jax",), keras_imported=True)
    assert "keras" in sys.modules
    selection.select()
    assert chosen() is None


@pytest.mark.parametrize("configured", ["tensorflow", "torch", "jax", "numpy"])
def test_installed_configured_backend_is_left_alone(fake, configured):
    fake(configured=configured, installed=("tensorflow", "torch", "jax", "numpy"))
    selection.select()
    assert chosen() is None


@pytest.mark.parametrize(
    "configured, installed, expected",
    [
        ("tensorflow", ("torch",), "torch"),
        ("tensorflow", ("torch", "jax"), "jax"),
        ("jax", ("tensorflow", "torch"), "torch"),
        ("torch", ("tensorflow",), "tensorflow"),
        ("nonexistent_backend", ("tensorflow", "jax"), "jax"),
        (None, ("torch",), "torch"),  # no keras.json: Keras's default, tensorflow
        ("tensorflow", (), None),  # nothing installed: Keras will say so
    ],
)
def test_missing_configured_backend_picks_the_first_installed(fake, configured, installed, expected):
    fake(configured=configured, installed=installed)
    selection.select()
    assert chosen() == expected


@pytest.mark.parametrize("text", ["[1, 2]", "{not json", '{"backend": 3}', "{}"])
def test_unreadable_keras_json_counts_as_keras_default(fake, text):
    fake(config_text=text, installed=("torch",))
    selection.select()
    assert chosen() == "torch"  # tensorflow, Keras's default, is missing


def test_default_backend_says_where_the_choice_comes_from(fake, tmp_path):
    fake(configured="tensorflow", installed=("torch",))
    backend, where = selection.default_backend()
    assert backend == "torch"
    assert where == (
        f"the first installed of jax, torch, tensorflow ({tmp_path / 'keras.json'}: 'tensorflow' is not installed)"
    )
    fake(configured="torch", installed=("torch",))
    assert selection.default_backend() == ("torch", str(tmp_path / "keras.json"))


@pytest.mark.parametrize(
    "argv, orig_argv, expected",
    [
        (
            ["-m", "demo", "--steps", "1"],
            ["python", "-m", "multicritic", "demo", "--steps", "1"],
            ["demo", "--steps", "1"],
        ),
        (["-m", "check"], ["python", "-Im", "multicritic", "check"], ["check"]),
        (["-m", "check"], ["python", "-W", "ignore", "-X", "dev", "-mmulticritic", "check"], ["check"]),
        (["-m", "check"], ["python", "-m", "othertool", "check"], None),
        (["-m", "check"], ["python", "-m", "multicritic.cli", "check"], None),
        (["/venv/bin/multicritic", "demo"], ["/venv/bin/python", "/venv/bin/multicritic", "demo"], ["demo"]),
        (["multicritic-script.py", "demo"], ["python", "multicritic-script.py", "demo"], ["demo"]),
        (["/venv/bin/pytest", "-q"], ["/venv/bin/python", "/venv/bin/pytest", "-q"], None),
        (["-c"], ["python", "-c", "import multicritic"], None),
    ],
)
def test_the_multicritic_command_is_recognised(monkeypatch, argv, orig_argv, expected):
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    assert selection.cli_argv() == expected


def import_multicritic(tmp_path, configured, block=()):
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "home" / "keras.json").write_text(json.dumps({"backend": configured}))
    env = {"KERAS_HOME": str(tmp_path / "home"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    if block:
        env.update(PYTHONPATH=with_pythonpath(blocking_site(tmp_path / "site")), MULTICRITIC_TEST_BLOCK=",".join(block))
    code = "import os, multicritic, keras; print(keras.backend.backend(), os.environ.get('KERAS_BACKEND'))"
    result = run([sys.executable, "-c", code], env=env, unset=["KERAS_BACKEND"], timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[-2:]


def test_import_keeps_an_installed_configured_backend(tmp_path):
    assert import_multicritic(tmp_path, BACKEND) == [BACKEND, "None"]


def test_import_picks_an_installed_backend_when_the_configured_one_is_missing(tmp_path):
    """keras.json names a backend that is not installed (really absent, or
    blocked here): `import multicritic` runs Keras on the first installed of
    jax, torch, tensorflow instead of failing."""
    missing = next((b for b in ("tensorflow", "torch", "jax") if b not in installed_backends()), None)
    block = ()
    if missing is None:  # all three installed: make one look absent
        missing = next(b for b in ("tensorflow", "torch", "jax") if b != BACKEND)
        block = (missing,)
    expected = next(b for b in selection.PREFERENCE if b in installed_backends() and b != missing)
    assert import_multicritic(tmp_path, missing, block) == [expected, expected]


def test_a_backend_that_is_not_installed_is_named_in_one_line(monkeypatch):
    monkeypatch.setattr(selection, "installed", lambda name: name in ("keras", "jax"))
    message = selection.missing_backend_message("torch")
    assert message == (
        "KERAS_BACKEND='torch', but torch is not installed: pip install 'multicritic[torch]' (or set "
        "KERAS_BACKEND to an installed one of ['jax'])."
    )
    assert selection.missing_backend_message("jax") is None
    monkeypatch.setattr(selection, "installed", lambda name: False)
    assert "needs Keras 3" in selection.missing_backend_message("jax")
    monkeypatch.delitem(sys.modules, "keras")
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    with pytest.raises(ModuleNotFoundError, match="needs Keras 3"):
        selection.select()


@pytest.mark.parametrize(
    "name, hint",
    [
        ("pytorch", " (did you mean 'torch'?)"),
        ("tf", " (did you mean 'tensorflow'?)"),
        ("jaxx", " (did you mean 'jax'?)"),
        ("mxnet", ""),
    ],
)
def test_issue_62_finding_5_a_keras_backend_keras_does_not_know_is_one_line(fake, name, hint):
    """`KERAS_BACKEND=pytorch` ended in Keras's bare "Unable to import backend" traceback, naming no valid
    backend; it is refused like a missing backend, in one line naming the variable and the valid names."""
    fake(configured="tensorflow", installed=("jax", "torch", "keras"), keras_backend=name)
    with pytest.raises(ValueError) as info:
        selection.select()
    assert str(info.value) == f"KERAS_BACKEND: got {name!r}, expected 'tensorflow', 'torch' or 'jax'{hint}."
    assert chosen() == name  # nothing changed


def test_issue_62_finding_5_import_multicritic_says_it_in_one_line():
    result = run([sys.executable, "-c", "import multicritic"], env={"KERAS_BACKEND": "pytorch"}, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ValueError: KERAS_BACKEND: got 'pytorch', expected 'tensorflow', 'torch' or 'jax' (did you mean 'torch'?)."
    )
    assert "Unable to import backend" not in result.stderr
