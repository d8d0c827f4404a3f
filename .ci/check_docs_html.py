"""Checks what a browser shows of the built API reference, beyond what `mkdocs build --strict` checks.

    python .ci/check_docs_html.py [--build] SITE_DIR     (--build: `mkdocs build --strict` into it first)

In every page under SITE_DIR/api: each `Examples` section is followed by a code block (not prose), each
`Returns` section is one description (a table of one row), each `Call arguments` section is a list, and no
object is shown without a docstring (a bare `name = value` attribute). The site's stylesheet wraps the API
reference's signatures at their spaces, breaks no code inside a word (a code block scrolls; a name in a table
cell stays whole) and the site holds only pages and their assets (not docs/'s build tools). Exits 1 with one
line per problem.
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
    rules = dict(re.findall(r"([^{}]+)\{([^}]*)\}", re.sub(r"/\*.*?\*/", "", css, flags=re.S)))
    rules = {selector.strip(): body for selector, body in rules.items()}
    if "pre-wrap" not in rules.get(".doc-signature code", ""):
        found.append("stylesheets/extra.css: signatures do not wrap (a long one would be cut off)")
    if re.search(r"overflow-wrap:\s*anywhere|word-break:\s*break-all", css):
        found.append("stylesheets/extra.css: code breaks inside words (numbers and names split over lines)")
    if not any(
        "table" in s
        and "code" in s
        and re.search(r"overflow-wrap:\s*normal", body)
        and re.search(r"word-break:\s*normal", body)
        for s, body in rules.items()
    ):
        found.append("stylesheets/extra.css: a name in a table cell can break mid-word (Material's break-word)")
    for tool in ("hooks", "griffe", "requirements.txt"):
        if (site / tool).exists():
            found.append(f"{tool}: docs/'s build tool copied into the site (mkdocs.yml: exclude_docs)")
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
