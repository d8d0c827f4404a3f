"""A griffe extension: a docstring's `Call arguments:` section (keras-hub's layers) renders as a list.

Google-style docstrings have no such section: griffe reads it as an admonition and joins its entries into one
paragraph. Each entry `name: text` (continuation lines indented further) becomes a list item `` `name`: text``.
"""

from __future__ import annotations

import re

from griffe import Extension

ENTRY = re.compile(r"^(?P<indent>\s+)(?P<name>\*{0,2}\w+):\s*(?P<text>.*)$")


def as_list(text: str) -> str:
    lines, out, inside, indent = text.split("\n"), [], False, None
    for line in lines:
        if line.strip() == "Call arguments:":
            inside, indent = True, None
            out.append(line)
            continue
        if inside:
            match = ENTRY.match(line)
            if line.strip() and indent is None and match:
                indent = match["indent"]
            if not line.strip() or (indent is not None and not line.startswith(indent)):
                inside = False  # the section ends at a blank or less indented line
            elif match and match["indent"] == indent:
                out.append(f"{indent}- `{match['name']}`: {match['text']}")
                continue
            else:
                out[-1] += " " + line.strip()  # a continuation line joins its entry
                continue
        out.append(line)
    return "\n".join(out)


class CallArguments(Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None and "Call arguments:" in obj.docstring.value:
            obj.docstring.value = as_list(obj.docstring.value)
