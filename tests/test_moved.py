"""0.1.0's module paths: each still imports the moved module itself, with a warning naming the new path and the
release that removes the old one; nothing of ours imports an old path."""

import ast
import importlib
import pathlib
import sys
import warnings

import pytest

import multicritic
from multicritic import moved
from multicritic.backend import contract

ROOT = pathlib.Path(multicritic.__file__).parent.parent


@pytest.mark.parametrize("old", sorted(moved.MOVED))
def test_an_old_path_gives_the_moved_module_with_a_warning(old):
    sys.modules.pop(old, None)
    with pytest.warns(
        DeprecationWarning,
        match=rf"{old} moved to {moved.MOVED[old]}; .*removed in multicritic "
        rf"{moved.REMOVED_IN}",
    ):
        module = importlib.import_module(old)
    assert module is importlib.import_module(moved.MOVED[old])
    assert module.__name__ == moved.MOVED[old]  # the moved module itself, not a copy under the old name
    assert not (ROOT / (old.replace(".", "/") + ".py")).exists()


def test_names_from_an_old_path_are_the_moved_objects():
    sys.modules.pop("multicritic.critic", None)
    with pytest.warns(DeprecationWarning):
        from multicritic.critic import CriticNetwork
    assert CriticNetwork is multicritic.CriticNetwork
    sys.modules.pop("multicritic.layers.reward_predictor", None)
    with pytest.warns(DeprecationWarning):
        from multicritic.layers.reward_predictor import RewardPredictorLayer
    assert RewardPredictorLayer is multicritic.TwoHotHead


def test_the_public_names_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from multicritic import presets  # noqa: F401  (the package's attribute, as in 0.1.0)
        from multicritic import RewardPredictorLayer  # noqa: F401
        from multicritic.layers import RewardPredictorLayer as again  # noqa: F401


def test_old_backend_switches_reach_the_contract(monkeypatch):
    import multicritic.backend as package

    monkeypatch.setattr(contract, "EAGER", contract.EAGER)  # restored after the test
    with pytest.warns(DeprecationWarning, match="multicritic.backend.contract.EAGER"):
        package.EAGER = not contract.EAGER
    assert "EAGER" not in vars(package)  # written through, not shadowed on the package
    with pytest.warns(DeprecationWarning):
        assert package.EAGER is contract.EAGER
    with pytest.warns(DeprecationWarning):
        assert package.current() is contract.current()
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        package.nothing


def old_imports(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        yield from (f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n in moved.MOVED)


def test_nothing_of_ours_imports_an_old_path():
    found = [
        hit
        for folder in ("multicritic", "tests", "benchmarks", "examples")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "__pycache__" not in path.parts and path.name != "test_moved.py"
        for hit in old_imports(path)
    ]
    assert not found, found
