"""The backend contract: backend differences live in `multicritic/backend/` and nowhere else."""

import ast
import inspect
import pathlib

import pytest

import multicritic
from multicritic import backend
from multicritic.backend import Backend, StepProgram

PACKAGE = pathlib.Path(multicritic.__file__).parent
FRAMEWORKS = ("torch", "tensorflow", "jax", "jaxlib", "optax")
# These choose which backend runs (the command line, the default backend),
# which is not how anything is computed.
CHOOSE_A_BACKEND = ("cli.py", "backend_default.py")


def modules_outside_the_contract():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name != "backend" or path.parent.parent != PACKAGE:
            yield path


@pytest.mark.parametrize("path", list(modules_outside_the_contract()), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_framework_code_outside_the_backend_modules(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            names = []
        for name in names:
            assert name.split(".")[0] not in FRAMEWORKS, f"{path.name} imports {name}"
        # No branching on the backend's name (reporting it is fine).
        if isinstance(node, ast.Compare) and path.name not in CHOOSE_A_BACKEND:
            text = ast.unparse(node)
            assert "backend()" not in text, f"{path.name}: {text}"


@pytest.mark.parametrize("name", backend.SUPPORTED)
def test_each_backend_implements_the_contract_without_trainer_internals(name):
    source = (PACKAGE / "backend" / f"{name}.py").read_text()
    assert "trainer." not in source and "critic._" not in source
    tree = ast.parse(source)
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and any(
        getattr(b, "id", None) == "Backend" for b in n.bases)]
    assert len(classes) == 1, "one Backend subclass per backend module"


def test_the_running_backend_is_a_complete_backend():
    current = backend.current()
    assert isinstance(current, Backend) and not inspect.isabstract(type(current))
    assert current.name == multicritic.backend.keras.backend.backend()
    fields = {f.name for f in StepProgram.__dataclass_fields__.values()}
    assert {"trainable", "state", "loss", "scale_loss", "apply", "jit_compile", "private"} <= fields


def test_apply_gradients_is_written_once_for_the_eager_backends():
    # TensorFlow and PyTorch share the base class's optimizer update; JAX's differs (stateless).
    import importlib

    for name in ("tensorflow", "torch"):
        module_source = (PACKAGE / "backend" / f"{name}.py").read_text()
        assert "def apply_gradients" not in module_source
    assert "def apply_gradients" in (PACKAGE / "backend" / "jax.py").read_text()
    assert importlib.import_module("multicritic.backend").Backend.apply_gradients
