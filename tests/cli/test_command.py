"""The `multicritic` command itself (issue 72 item 7): `--version`, a bare `multicritic`, `--size` in any case."""

import json

import pytest

import multicritic
from multicritic.cli import main, version
from multicritic.demo.config import MODEL_SIZES
from tests.conftest import BACKEND
from tests.demo.fake_env import noisy_site, run_cli, with_pythonpath


@pytest.fixture(scope="module")
def no_keras(tmp_path_factory):
    """Environment variables under which importing Keras exits with code 99 (`tests.demo.fake_env.noisy_site`):
    a command that answers there never imported it."""
    return {"PYTHONPATH": with_pythonpath(noisy_site(tmp_path_factory.mktemp("noisy"))), "KERAS_BACKEND": BACKEND}


def test_version_is_the_packages(capsys):
    assert version() == multicritic.__version__
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"multicritic {multicritic.__version__}\n"


def test_version_answers_without_importing_keras(no_keras):
    result = run_cli("--version", env=no_keras, timeout=120)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"multicritic {multicritic.__version__}\n", "")


def test_a_bare_command_prints_the_usage(capsys):
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: multicritic [-h] [--version] COMMAND ...\n"), err
    # The commands, each with what it does, and where their options are.
    assert "    demo      learn exact values of a random MDP" in err and "    check     run the same critics" in err
    assert err.rstrip().endswith("`multicritic COMMAND --help` lists a command's options.")


def test_a_bare_command_prints_the_usage_without_importing_keras(no_keras):
    result = run_cli(env=no_keras, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("usage: multicritic [-h] [--version] COMMAND ...\n"), result.stderr


def test_help_returns_zero_in_process(capsys):
    assert main(["demo", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: multicritic demo ")
    assert "any case (default: mini)" in out and "none when it is piped or redirected" in " ".join(out.split())


@pytest.mark.parametrize("size", ["xs", "Xs", "NANO", "Mini", "xxs", "xl"])
def test_size_is_read_in_any_case(size):
    from multicritic import cli

    args, config, _ = cli._validate(["demo", "--size", size])
    want = next(s for s in MODEL_SIZES if s.lower() == size.lower())
    assert args.size == want and config.size == want


def test_size_in_another_case_runs_that_size(tmp_path):
    out = tmp_path / "demo.json"
    code = main(["demo", "--size", "NANO", "--steps", "2", "--scales", "1", "--no-progress", "--json", str(out)])
    assert code == 0
    assert json.loads(out.read_text())["config"]["size"] == "nano"


def test_an_unknown_size_still_names_the_sizes(capsys):
    assert main(["demo", "--size", "huge"]) == 2
    err = capsys.readouterr().err
    assert err == f"multicritic: error: --size: got 'huge', expected one of {list(MODEL_SIZES)}\n"
