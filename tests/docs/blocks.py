"""The Python code blocks of README.md and docs/**/*.md, with the markers that say how each one runs.

A block runs as written unless HTML comments on the lines right above its fence say otherwise:

    <!-- not-run: needs sheeprl installed -->     never run; the reason is required
    <!-- backend: torch -->                       runs on these Keras backends only (comma-separated)
    <!-- example: recipe-torch -->               a name other tests find the block by
    <!-- continues -->                            runs in the namespace of the page's previous block
    <!-- needs: orbax.checkpoint -->              runs where these modules import (comma-separated), else skipped

Without a `backend` marker a block runs on the backend its code names (an
`os.environ["KERAS_BACKEND"] = "..."` line, or an import of torch, jax / optax or tensorflow), else on every
backend.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Dict, List, Optional, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/**/*.md")
BACKENDS = ("jax", "tensorflow", "torch")
KEYS = ("not-run", "backend", "example", "continues", "needs")

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<lang>[\w+-]*)[^\n]*$")
COMMENT = re.compile(r"^[ \t]*<!--[ \t]*(?P<key>[\w-]+)[ \t]*(?::[ \t]*(?P<value>.*?))?[ \t]*-->[ \t]*$")
ENV = re.compile(r"""os\.environ\[["']KERAS_BACKEND["']\]\s*=\s*["'](\w+)["']""")
IMPORTS = {"torch": "torch", "jax": "jax", "optax": "jax", "tensorflow": "tensorflow"}
IMPORT = re.compile(r"^\s*(?:import|from)\s+(torch|jax|optax|tensorflow)\b", re.M)


@dataclasses.dataclass
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    code: str
    markers: Dict[str, str]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def name(self) -> Optional[str]:
        return self.markers.get("example")

    @property
    def skip(self) -> Optional[str]:
        return self.markers.get("not-run")

    @property
    def needs(self) -> Tuple[str, ...]:
        """The modules the block imports beyond the test sessions' packages (an optional library it shows)."""
        return tuple(m.strip() for m in self.markers.get("needs", "").split(",") if m.strip())

    @property
    def continues(self) -> bool:
        return "continues" in self.markers

    @property
    def backends(self) -> Tuple[str, ...]:
        """The Keras backends the block runs on."""
        if "backend" in self.markers:
            named = tuple(b.strip() for b in self.markers["backend"].split(","))
            bad = [b for b in named if b not in BACKENDS]
            if bad:
                raise ValueError(f"{self.id}: backend marker: got {bad}, expected names from {list(BACKENDS)}")
            return named
        named = set(ENV.findall(self.code)) | {IMPORTS[m] for m in IMPORT.findall(self.code)}
        if len(named) > 1:
            raise ValueError(
                f"{self.id}: the code names backends {sorted(named)}: say which it runs on with <!-- backend: ... -->"
            )
        return tuple(named) or BACKENDS


def _markers(lines: List[str], fence_index: int, where: str) -> Dict[str, str]:
    markers: Dict[str, str] = {}
    i = fence_index - 1
    while i >= 0:
        m = COMMENT.match(lines[i])
        if not m or m["key"] not in KEYS:
            break
        markers[m["key"]] = (m["value"] or "").strip()
        i -= 1
    if "not-run" in markers and not markers["not-run"]:
        raise ValueError(f"{where}: a not-run marker needs its reason: <!-- not-run: why -->")
    return markers


def page_blocks(path: pathlib.Path, root: pathlib.Path = ROOT) -> List[Block]:
    """The Python blocks of one Markdown page, in order."""
    lines = path.read_text().split("\n")
    rel = str(path.relative_to(root))
    out: List[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m["indent"], m["fence"], m["lang"].lower()
        body, j = [], i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and lines[j].strip().strip(fence[0]) == ""):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if lang in ("python", "py"):
            out.append(Block(rel, i + 1, "\n".join(body) + "\n", _markers(lines, i, f"{rel}:{i + 1}")))
        i = j + 1
    return out


def all_blocks(root: pathlib.Path = ROOT) -> List[Block]:
    found: List[Block] = []
    for pattern in PAGES:
        for path in sorted(root.glob(pattern)):
            if path.is_file():
                found += page_blocks(path, root)
    return found


def chains(blocks: List[Block]) -> List[List[Block]]:
    """Blocks grouped into what runs in one namespace: a block and the `continues` blocks after it."""
    out: List[List[Block]] = []
    for block in blocks:
        if block.continues:
            if not out or out[-1][0].page != block.page:
                raise ValueError(f"{block.id}: `continues` needs an earlier block on the same page")
            out[-1].append(block)
        else:
            out.append([block])
    return out


def named(name: str, root: pathlib.Path = ROOT) -> Block:
    """The block marked `<!-- example: name -->` (exactly one)."""
    found = [b for b in all_blocks(root) if b.name == name]
    if len(found) != 1:
        raise LookupError(f"example {name!r}: found {len(found)} blocks marked with it, expected 1")
    return found[0]


def run(code: str, where: str, namespace: Optional[dict] = None) -> dict:
    """Runs `code` as a module would run (its own globals), and returns the namespace."""
    namespace = {"__name__": "__docs_example__"} if namespace is None else namespace
    exec(compile(code, where, "exec"), namespace)  # noqa: S102  (the docs' own examples)
    return namespace
