"""The package as a user gets it: built, checked, installed from the wheel and used from outside the checkout.

1. `python -m build` writes the sdist, then the wheel built from it, into a temporary folder; `twine check
   --strict` reads both.
2. The wheel holds the whole package (every module of `multicritic/`, `py.typed`) and nothing else, and its
   version is `multicritic.__version__` (the one source).
3. `pip install` of the wheel (not the checkout) into this interpreter's environment, which must not have
   multicritic installed already (the `package` nox session's fresh virtualenv).
4. From a temporary folder, with the checkout off `sys.path`: the import resolves to the installed copy,
   `multicritic demo` runs (short), and a smoke test trains, saves and reloads a critic.

    python .ci/check_package.py --backend jax
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent

SMOKE = r"""
import os, pathlib, sys, warnings
import keras
import numpy as np
import multicritic
from multicritic import CriticNetwork, CriticTrainer
from multicritic.training import presets

checkout = pathlib.Path(sys.argv[1]).resolve()
where = pathlib.Path(multicritic.__file__).resolve()
# The installed wheel, not the checkout's source tree (nox's virtualenvs live inside the checkout, so the
# test is the package's folder, not an ancestor).
assert where.parent != checkout / "multicritic" and "site-packages" in where.parts, (
    f"imported from the checkout: {where}")
import importlib.metadata
assert importlib.metadata.version("multicritic") == multicritic.__version__, (
    importlib.metadata.version("multicritic"), multicritic.__version__)

critic = CriticNetwork(model_size="nano")
trainer = CriticTrainer(critic)
rng = np.random.default_rng(0)
h = rng.normal(size=(16, 8, critic.gru_units)).astype("float32")
z = rng.random((16, 8, critic.num_z_categoricals, critic.num_z_classes)).astype("float32")
metrics = trainer.train_on_dream(h, z, rng.normal(size=(16, 8)).astype("float32"), np.ones((16, 8), "float32"))
assert np.isfinite(float(metrics["total"])) and float(metrics["step_skipped"]) == 0
critic.save_weights("smoke.weights.h5")
again = CriticNetwork(model_size="nano")
again.load_weights("smoke.weights.h5")
for a, b in zip(critic.weights, again.weights):
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    presets.build("rllib-2023", size="nano")
assert any(issubclass(w.category, DeprecationWarning) and "model_size" in str(w.message) for w in caught)
print("smoke test passed:", where.parent, multicritic.__version__)
"""


def run(cmd, **kwargs):
    print("+", " ".join("<script>" if "\n" in str(c) else str(c) for c in cmd), flush=True)
    return subprocess.run(cmd, check=True, **kwargs)


def source_version() -> str:
    tree = ast.parse((ROOT / "multicritic" / "__init__.py").read_text())
    return next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in n.targets)
    )


def check_wheel(wheel: str, version: str) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "multicritic").rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(modules - names)
    assert not missing, f"the wheel lacks {missing}"
    assert "multicritic/py.typed" in names, "the wheel lacks multicritic/py.typed"
    foreign = sorted(n for n in names if not n.startswith(("multicritic/", f"multicritic-{version}.dist-info/")))
    assert not foreign, f"the wheel holds files outside the package: {foreign}"
    assert os.path.basename(wheel).startswith(f"multicritic-{version}-"), (wheel, version)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "jax"))
    args = parser.parse_args(argv)
    python = sys.executable
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["KERAS_BACKEND"] = args.backend
    probe = subprocess.run(
        [python, "-I", "-c", "import multicritic"], capture_output=True, cwd=tempfile.gettempdir(), env=env
    )
    if probe.returncode == 0:
        sys.exit("multicritic is already importable here: run this in a fresh virtualenv (nox -s package)")
    version = source_version()
    with tempfile.TemporaryDirectory() as tmp:
        dist = os.path.join(tmp, "dist")
        # The sdist, then the wheel built from it (so the sdist is complete, and no build/ is left in the checkout).
        run([python, "-m", "build", "--outdir", dist, str(ROOT)], env=env)
        built = sorted(glob.glob(os.path.join(dist, "*")))
        run([python, "-m", "twine", "check", "--strict", *built], env=env)
        wheel = next(p for p in built if p.endswith(".whl"))
        check_wheel(wheel, version)
        run([python, "-m", "pip", "install", "--no-cache-dir", wheel], env=env)
        work = os.path.join(tmp, "work")
        os.mkdir(work)
        demo = os.path.join(os.path.dirname(python), "multicritic")
        run(
            [
                demo,
                "demo",
                "--backend",
                args.backend,
                "--size",
                "nano",
                "--steps",
                "20",
                "--scales",
                "1,1e3",
                "--no-progress",
                "--json",
                "demo.json",
            ],
            cwd=work,
            env=env,
        )
        result = json.loads(pathlib.Path(work, "demo.json").read_text())
        assert result["backend"] == args.backend and len(result["scales"]) == 2, result
        run([python, "-I", "-c", SMOKE, str(ROOT)], cwd=work, env=env)
    print(f"package check passed: multicritic {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
