"""The package's import graph: no cycles (imports inside functions count), and no private name of one module used
by another. An AST walk, like the backend-contract test: nothing is imported to check it."""

import ast
import pathlib

import multicritic

PACKAGE = pathlib.Path(multicritic.__file__).parent
ROOT = PACKAGE.parent


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(name: str) -> str:
    """The module `name` denotes: itself if it is one of ours, else (a name defined in a module) its module."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports(module: str):
    """`(imported module, line)` for every import of one of our modules in `module`, at any depth."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    if path.name == "__init__.py":
        # A package's PEP 562 `__getattr__` imports on first access to a name, once every module has loaded:
        # a lazy re-export, not an import of the package's.
        tree.body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == "__getattr__")]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "multicritic":
                    yield resolve(alias.name), node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            if base.split(".")[0] != "multicritic":
                continue
            for alias in node.names:
                yield resolve(f"{base}.{alias.name}"), node.lineno


def packages_run(module: str):
    """The packages whose `__init__` importing `module` runs first (the root's excepted: it is where every
    import of the package starts)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def graph():
    """`{module: modules it imports}`, an import of `a.b.c` counting as one of the package `a.b` too."""
    edges = {}
    for m in MODULES:
        targets = set()
        for target, _ in imports(m):
            targets.add(target)
            targets.update(p for p in packages_run(target) if p in MODULES and not m.startswith(p + "."))
        edges[m] = targets - {m}
    return edges


def find_cycle(edges):
    """One cycle of `edges` as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target) :] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, " -> ".join(cycle)


def test_an_import_runs_the_packages_above_it():
    assert packages_run("multicritic.training.step") == ["multicritic.training"]
    assert "multicritic.training" in graph()["multicritic.model.critic"]


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def private_definitions(module: str):
    """Private names (`_x`, not dunder) a module defines: functions, classes, methods, attributes assigned on
    `self` or at module level."""
    names = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))}


def test_no_private_name_of_one_module_is_used_by_another():
    defined = {m: private_definitions(m) for m in MODULES}
    violations = []
    for module, path in MODULES.items():
        own = defined[module]
        others = {n: m for m2, names in defined.items() if m2 != module for n in names for m in [m2]}
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            used = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("multicritic"):
                used = [a.name for a in node.names if a.name.startswith("_")]
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                used = [node.attr]
            for name in used:
                if name in others and name not in own:
                    violations.append(f"{module}:{node.lineno} uses {name} of {others[name]}")
    assert not violations, "\n".join(violations)


MAX_CLASS_CODE_LINES = 350


def code_lines(node: ast.ClassDef, lines) -> int:
    """A class's lines of code: docstrings, comments and blank lines not counted."""
    docs = set()
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if isinstance(inner, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docs.update(range(first.lineno, first.end_lineno + 1))
    return sum(
        1
        for n in range(node.lineno, node.end_lineno + 1)
        if n not in docs and lines[n - 1].strip() and not lines[n - 1].strip().startswith("#")
    )


def test_no_class_does_too_many_jobs():
    big = []
    for module, path in MODULES.items():
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and code_lines(node, text.split("\n")) > MAX_CLASS_CODE_LINES:
                big.append(f"{module}.{node.name}: {code_lines(node, text.split(chr(10)))} lines of code")
    assert not big, "\n".join(big)


def test_code_lines_skip_docstrings_comments_and_blanks():
    text = 'class A:\n    """Doc.\n\n    More."""\n\n    # why\n    def f(self):\n        """F."""\n        return 1\n'
    node = ast.parse(text).body[0]
    assert code_lines(node, text.split("\n")) == 3
