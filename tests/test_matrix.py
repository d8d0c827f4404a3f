"""Issue 72, item 11: the versions pyproject.toml declares are the versions the test-suite runs on. Each lower bound
is a release a session installs (the `oldest` session's, or a CI pin), and every CI pin lies inside its range."""

import pathlib
import sys

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = pathlib.Path(__file__).resolve().parent.parent
MATRIX = yaml.safe_load((ROOT / "backends_matrix.yaml").read_text())
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The pip name a session installs for a declared one (the CI sessions take TensorFlow's CPU build).
INSTALLED_AS = {"tensorflow": "tensorflow-cpu"}


def _flat(items):
    for item in items:
        yield from (_flat(item) if isinstance(item, list) else [item])


def _pins(requirements) -> dict:
    return {r.name.lower(): str(next(iter(r.specifier)).version) for r in map(Requirement, requirements)}


def declared() -> dict:
    """`{name: Requirement}` of the core dependencies and the backend and plot extras."""
    extras = PROJECT["optional-dependencies"]
    names = PROJECT["dependencies"] + extras["jax"] + extras["torch"] + extras["tensorflow"] + extras["plot"]
    return {Requirement(r).name.lower(): Requirement(r) for r in names}


def ci_pins() -> dict:
    """The pins of the sessions a bare `nox` runs, and `common.packages`."""
    found = _pins(_flat(MATRIX["common"]["packages"]))
    for spec in MATRIX["sessions"].values():
        if spec.get("default", True) and "command" not in spec and "commands" not in spec:
            found.update(_pins(r for r in _flat(spec["packages"]) if "==" in str(r) and str(r)[0] != "-"))
    return found


def lower_bound(requirement: Requirement) -> str:
    [spec] = [s for s in requirement.specifier if s.operator == ">="]
    return spec.version


def test_each_lower_bound_is_a_tested_release():
    oldest = _pins(MATRIX["packages"]["oldest"])
    pins = ci_pins()
    for name, requirement in declared().items():
        tested = oldest.get(name) or pins[INSTALLED_AS.get(name, name)]
        assert Version(tested) == Version(lower_bound(requirement)), (name, str(requirement), tested)


def test_every_ci_pin_lies_inside_its_declared_range():
    pins = ci_pins()
    for name, requirement in declared().items():
        version = pins[INSTALLED_AS.get(name, name)]
        assert requirement.specifier.contains(version), (name, str(requirement), version)


def test_the_oldest_session_is_not_part_of_a_bare_nox_and_pins_what_common_also_pins():
    oldest = MATRIX["sessions"]["oldest"]
    assert oldest["default"] is False and oldest["backend"] == "jax"
    assert {"keras", "numpy", "jax", "jaxlib", "optax", "matplotlib"} == set(_pins(_flat(oldest["packages"])))
    nox = pytest.importorskip("nox")  # the noxfile needs nox (not installed in the sessions themselves)
    sys.path.insert(0, str(ROOT))
    try:
        import noxfile
    finally:
        sys.path.remove(str(ROOT))
    assert "oldest" not in nox.options.sessions and "jax" in nox.options.sessions
    common = list(_flat(MATRIX["common"]["packages"]))
    merged = noxfile._with_own_pins(common, _flat(oldest["packages"]))
    assert "keras==3.10.0" in merged and "keras==3.15.1" not in merged and "h5py==3.14.0" in merged
    assert len({noxfile._name(r) for r in merged}) == len(merged)


def test_the_readme_says_which_versions_are_tested():
    readme = (ROOT / "README.md").read_text()
    pins, oldest = ci_pins(), _pins(MATRIX["packages"]["oldest"])
    for name in ("keras", "jax", "torch", "tensorflow-cpu"):
        assert f"{name.replace('-cpu', '')} {pins[name]}" in readme, name
    for name in ("keras", "numpy", "jax", "optax", "matplotlib"):
        assert f"{name} {oldest[name]}" in readme, name
