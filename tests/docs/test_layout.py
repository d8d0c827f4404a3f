"""The "Layout" block of docs/contributing.md matches the tree.

Each line of the block is `PATHS  DESCRIPTION` (two or more spaces between): one or more space-separated
paths, `{a,b}` expanding to both. A line indented under a line ending in `/` is relative to that folder.
"""

import itertools
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "contributing.md"


def layout_block(text: str) -> str:
    section = text.split("\n## Layout\n", 1)[1]
    return re.search(r"```\n(.*?)\n```", section, re.S).group(1)


def _expand(token: str):
    m = re.search(r"\{([^}]*)\}", token)
    if not m:
        return [token]
    return list(
        itertools.chain.from_iterable(
            _expand(token[: m.start()] + choice + token[m.end() :]) for choice in m.group(1).split(",")
        )
    )


def listed_paths(block: str):
    """`{relative path: line}` of every path the block names (folders keep their trailing /)."""
    paths, parents = {}, []  # parents: [(indent, folder)]
    for line in block.split("\n"):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        while parents and parents[-1][0] >= indent:
            parents.pop()
        base = parents[-1][1] if parents else ""
        tokens = [p for token in names.split() for p in _expand(token)]
        for token in tokens:
            paths[base + token] = line
        if len(tokens) == 1 and tokens[0].endswith("/"):
            parents.append((indent, base + tokens[0]))
    return paths


def test_every_listed_path_exists():
    missing = [
        f"{p!r} (line: {line.strip()!r})"
        for p, line in listed_paths(layout_block(PAGE.read_text())).items()
        if not (ROOT / p).exists()
    ]
    assert not missing, "the Layout block names paths that are not in the tree: " + "; ".join(missing)


def test_every_module_and_top_level_entry_is_listed():
    listed = set(listed_paths(layout_block(PAGE.read_text())))
    wanted = {str(p.relative_to(ROOT)) for p in (ROOT / "multicritic").rglob("*.py") if "__pycache__" not in p.parts}
    wanted |= {
        str(p.relative_to(ROOT)) + ("/" if p.is_dir() else "")
        for folder in ("benchmarks", "examples")
        for p in (ROOT / folder).iterdir()
        if p.name != "__pycache__"
    }
    wanted |= {
        p.name + "/"
        for p in ROOT.iterdir()
        if p.is_dir() and p.name in {"benchmarks", "docs", "examples", "multicritic", "tests"}
    }
    unlisted = sorted(wanted - listed)
    assert not unlisted, "add these to the Layout block of docs/contributing.md: " + ", ".join(unlisted)


def test_the_parser_reads_nesting_and_braces():
    block = "pkg/\n  a.py b/{x,y}.py   things\n  sub/     a folder\n    c.py   in sub\nroot.txt   top\n"
    assert set(listed_paths(block)) == {
        "pkg/",
        "pkg/a.py",
        "pkg/b/x.py",
        "pkg/b/y.py",
        "pkg/sub/",
        "pkg/sub/c.py",
        "root.txt",
    }
