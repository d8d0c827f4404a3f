"""Checks what a browser shows of the built API reference, beyond what `mkdocs build --strict` checks.

    python .ci/check_docs_html.py [--build] SITE_DIR     (--build: `mkdocs build --strict` into it first)

In every page under SITE_DIR/api: each `Examples` section is followed by a code block (not prose), each
`Returns` section is one description (a table of one row), each `Call arguments` section is a list, and no
object is shown without a docstring (a bare `name = value` attribute). And the site's stylesheet wraps long
code lines, so that no code is cut off. Exits 1 with one line per problem.
"""

from __future__ import annotations

import pathlib
import re
import sys

SECTION = re.compile(r'<span class="doc-section-title">(?P<title>[^<]+):</span></p>(?P<rest>.{0,3000})', re.S)
NEXT_BLOCK = re.compile(r"\s*<(?P<tag>\w+)(?P<attrs>[^>]*)>")


def problems(site: pathlib.Path):
    found = []
    for page in sorted((site / "api").rglob("*.html")):
        html = page.read_text()
        where = page.relative_to(site)
        for m in SECTION.finditer(html):
            title, rest = m["title"], m["rest"]
            block = NEXT_BLOCK.match(rest)
            if title == "Examples" and not (block and "highlight" in block["attrs"]):
                found.append(f"{where}: an Examples section that is not a code block")
            if title == "Returns":
                table = rest[: rest.find("</table>")]
                if table.count('class="doc-section-item"') != 1:
                    found.append(f"{where}: a Returns section split over several rows")
        for details in re.finditer(r'<details class="call-arguments"[^>]*>(.*?)</details>', html, re.S):
            if "<ul>" not in details.group(1):
                found.append(f"{where}: a Call arguments section that is not a list")
        for attr in re.finditer(r'<div class="doc doc-object doc-attribute">(.*?)</div>\s*</div>', html, re.S):
            if 'class="doc doc-contents' not in attr.group(1) or "<p>" not in attr.group(1):
                found.append(f"{where}: an attribute without a docstring")
    css = "".join(p.read_text() for p in site.rglob("extra.css"))
    if "pre-wrap" not in css:
        found.append("stylesheets/extra.css: code blocks do not wrap (long lines would be cut off)")
    return found


def main(argv):
    args = argv[1:]
    build = "--build" in args
    args = [a for a in args if a != "--build"]
    site = pathlib.Path(args[0] if args else "site")
    if build:
        import subprocess

        code = subprocess.call([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)])
        if code:
            return code
    if not (site / "api").is_dir():
        print(f"{site}: no built API reference (run mkdocs build first)")
        return 1
    found = problems(site)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
