"""The API reference (docs/api/) renders every public module of the package, so every public name is in it.

mkdocstrings renders each `::: module` it is given from the docstrings (nothing is copied by hand), and
`mkdocs build --strict` (the docs session) fails on a docstring it cannot read; this test makes sure no public
module is left out of the pages as the package grows.
"""

import importlib.util
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api"


def parts_hook():
    """The MkDocs hook that renders the registered parts' modules (docs/hooks/parts.py)."""
    spec = importlib.util.spec_from_file_location("docs_parts_hook", ROOT / "docs" / "hooks" / "parts.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook


def public_modules():
    out = set()
    for path in (ROOT / "multicritic").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "__pycache__" in parts or parts[-1] == "__main__":
            continue
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if not any(p.startswith("_") for p in parts):
            out.add(".".join(parts))
    return out


def rendered_modules():
    """The modules the pages render: their `::: module` lines, and the registered parts' modules that the parts
    hook puts at each page's `<!-- parts: api KIND -->`."""
    hook = parts_hook()
    pages = [hook.on_page_markdown(page.read_text()) for page in API.glob("*.md")]
    return {m for page in pages for m in re.findall(r"^::: ([\w.]+)", page, re.M)}


def test_every_public_module_has_a_place_in_the_api_reference():
    missing = sorted(public_modules() - rendered_modules())
    assert not missing, f"add `::: name` for these to a page of docs/api/: {missing}"


def test_the_api_reference_names_only_modules_that_exist():
    assert rendered_modules() <= public_modules()
    assert {
        "multicritic",
        "multicritic.model.critic",
        "multicritic.interop.sheeprl",
        "multicritic.training.presets",
    } <= public_modules()
