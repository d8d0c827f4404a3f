"""The README is a front page: short, and every link in it leads somewhere in the tree."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_a_front_page():
    assert len(README.splitlines()) <= 250
    for section in (
        "## Set-up: two commands",
        "## One example per framework",
        "## Against the DreamerV3 codebases",
        "## Headline numbers",
        "## Documentation",
    ):
        assert section in README


def test_every_relative_link_resolves():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    relative = [link for link in links if "://" not in link]
    assert relative, "the README links into the docs"
    missing = [link for link in relative if not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"
