"""A MkDocs hook: the pages' lists of registered parts, made from the registries when the site is built.

A new head or trunk is one module and its registration line: the Parts page's table (`<!-- parts: table -->`)
and the API reference of the parts' modules (`<!-- parts: api head -->`, `<!-- parts: api trunk -->`) come
from `multicritic.heads.HEADS` and `multicritic.trunks.TRUNKS` here, so no page is edited for it.

The docs are built without Keras (the `docs` session installs no backend): the registries are keras-free, and
`multicritic/__init__.py`, which imports Keras, is not run; a part's own options and their defaults are read
from its constructor's signature in the source (its class's and its bases' `__init__`), with nothing imported.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pathlib
import re
import sys
import types
from typing import Dict, List

ROOT = pathlib.Path(__file__).resolve().parents[2]
TABLE = "<!-- parts: table -->"
API = re.compile(r"<!-- parts: api (head|trunk) -->")


def registries():
    """`[("head", HEADS), ("trunk", TRUNKS)]`, imported without `multicritic/__init__.py` where the package
    cannot be imported (no Keras)."""
    if "multicritic" not in sys.modules:
        try:
            importlib.import_module("multicritic")
        except ImportError:
            package = types.ModuleType("multicritic")
            package.__path__ = [str(ROOT / "multicritic")]
            sys.modules["multicritic"] = package
    from multicritic.heads import HEADS
    from multicritic.trunks import TRUNKS

    return [("head", HEADS), ("trunk", TRUNKS)]


def _file(module: str) -> pathlib.Path:
    """The source file of `module`, found from its top-level package without importing anything (a package's
    `__init__` may import Keras)."""
    top, *rest = module.split(".")
    package = sys.modules.get(top)
    if package is not None and getattr(package, "__path__", None):
        base = pathlib.Path(list(package.__path__)[0])
    else:
        spec = importlib.util.find_spec(top)
        if spec is None or not spec.origin:
            raise ValueError(f"{module}: not found")
        if not spec.submodule_search_locations:
            return pathlib.Path(spec.origin)
        base = pathlib.Path(list(spec.submodule_search_locations)[0])
    path = base.joinpath(*rest)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise ValueError(f"{module}: not found")


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def constructor_defaults(module: str, name: str, depth: int = 0) -> Dict[str, object]:
    """The keyword arguments with defaults of class `module.name`'s constructor and its bases' (read from the
    source: a subclass's default wins), `{argument: default}`."""
    path = _file(module)
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    imports = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                imports[alias.asname or alias.name] = (_absolute(module, node, is_package), alias.name)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if cls is None:
        raise ValueError(f"{name}: no class of that name in {module}")
    defaults: Dict[str, object] = {}
    for base in reversed(cls.bases):
        if depth < 8 and isinstance(base, ast.Name):
            local = any(isinstance(n, ast.ClassDef) and n.name == base.id for n in tree.body)
            where = (module, base.id) if local else imports.get(base.id)
            # Bases of this package or the part's own (Keras's layers take no part options).
            if where is not None and where[0].split(".")[0] in ("multicritic", module.split(".")[0]):
                defaults.update(constructor_defaults(*where, depth + 1))
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is not None:
        args = init.args
        positional = args.posonlyargs + args.args
        pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        for arg, default in pairs:
            try:
                defaults[arg.arg] = ast.literal_eval(default)
            except ValueError:
                defaults[arg.arg] = ast.unparse(default)
    return defaults


def own_defaults(registry, name: str) -> Dict[str, object]:
    """A registered part's own options (neither Keras's, the ensemble's, nor shared) and their defaults."""
    from multicritic.registry import LAYER_KEYS

    module, _, cls = registry.path(name).rpartition(".")
    skip = set(LAYER_KEYS) | set(registry.shared)
    return {k: v for k, v in constructor_defaults(module, cls).items() if k not in skip}


def table() -> List[str]:
    """The Markdown table of the registered parts, with their own options' defaults."""
    lines = ["| kind | name | class | own options (defaults) |", "|---|---|---|---|"]
    for kind, registry in registries():
        for name in registry:
            options = ", ".join(f"`{k}={v!r}`" for k, v in own_defaults(registry, name).items()) or "none"
            lines.append(f"| {kind} | `{name}` | `{registry.path(name)}` | {options} |")
    return lines


def modules(kind: str) -> List[str]:
    """The package's modules that define a registered part of `kind`, in registration order."""
    found = []
    for _, registry in (r for r in registries() if r[0] == kind):
        for module in registry.modules().values():
            if module.split(".")[0] == "multicritic" and module not in found:
                found.append(module)
    return found


def on_page_markdown(markdown: str, page=None, config=None, files=None, **kwargs) -> str:
    if TABLE in markdown:
        markdown = markdown.replace(TABLE, "\n".join([*table(), "", "<small>Made from the registries.</small>"]))
    shown = set(rendered_modules(markdown))
    return API.sub(lambda m: "\n\n".join(f"::: {module}" for module in modules(m[1]) if module not in shown), markdown)


def rendered_modules(markdown: str) -> List[str]:
    """The modules a page renders with `::: module` lines of its own."""
    return [line[4:].strip() for line in markdown.splitlines() if line.startswith("::: ")]
