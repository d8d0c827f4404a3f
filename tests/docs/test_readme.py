"""The README is a front page: short, and every link in it leads somewhere in the tree."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def own_lines(text: str):
    """The lines of `text` a person writes: without a generated table's markers and the line naming its source
    (`benchmarks/render_tables.py` writes those, with the table)."""
    machinery = re.compile(r"^(<!-- table: .* -->|<!-- /table -->|<small>Generated from .*</small>)$")
    return [line for line in text.splitlines() if not machinery.match(line)]


def test_the_readme_is_a_front_page():
    assert len(own_lines(README)) <= 250
    for section in (
        "## Set-up: two commands",
        "## One example per framework",
        "## Against the DreamerV3 codebases",
        "## Headline numbers",
        "## Documentation",
    ):
        assert section in README


def test_the_length_leaves_out_only_the_generated_tables_machinery():
    page = (
        "text\n<!-- table: peers results_peers.json -->\n| a |\n\n<small>Generated from x.</small>\n<!-- /table -->\n"
    )
    assert own_lines(page) == ["text", "| a |", ""]


def test_every_relative_link_resolves():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    relative = [link for link in links if "://" not in link]
    assert relative, "the README links into the docs"
    missing = [link for link in relative if not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"
