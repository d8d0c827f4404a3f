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
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "multicritic":
                    yield resolve(alias.name), node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "multicritic":
                continue
            for alias in node.names:
                yield resolve(f"{base}.{alias.name}"), node.lineno


def graph():
    return {m: {target for target, _ in imports(m) if target != m} for m in MODULES}


def find_cycle(edges):
    """One cycle of `edges` as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
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
