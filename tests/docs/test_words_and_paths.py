"""The pages and the result files speak of the project, not of the machines it was written on.

A reader runs the commands from a clone of the repository: a command names paths relative to it, or placeholders
(`$OFFICIAL`, `$WORK`) for folders of the reader's choice, never a folder of the author's machine. And the pages
do not speak of how the work was resourced ("no GPU was lent").
"""

import json
import re

import pytest

from tests.docs import blocks

ROOT = blocks.ROOT
# The changelog too: the docs site shows it (docs/changelog.md includes it).
PAGES = sorted({p for pattern in (*blocks.PAGES, "CHANGELOG.md") for p in ROOT.glob(pattern) if p.is_file()})
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.json"))

# A folder of someone's machine: an absolute path under a home, a scratch or a temporary directory. The look-behind
# leaves URLs (`https://host/home/...`) and relative paths (`tests/data/`) alone.
MACHINE_PATH = re.compile(r"(?<![\w.~$}/:-])/(?:home|root|work|tmp|Users|mnt|scratch)/")
WORDS = re.compile(r"\blent\b", re.I)


def machine_paths(text: str):
    """The lines of `text` that name an absolute path of someone's machine."""
    return [line.strip() for line in text.splitlines() if MACHINE_PATH.search(line)]


def commands(value):
    """Every `command` field of a loaded result file, at any depth (a string, or a list of arguments joined)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "command":
                yield " ".join(map(str, item)) if isinstance(item, list) else str(item)
            else:
                yield from commands(item)
    elif isinstance(value, list):
        for item in value:
            yield from commands(item)


def test_the_pattern_finds_machine_paths_and_leaves_the_rest():
    assert machine_paths("python x.py --work /work/official/logs\n--json /tmp/out.json\ncd /home/me") == [
        "python x.py --work /work/official/logs",
        "--json /tmp/out.json",
        "cd /home/me",
    ]
    for fine in ("--work $OFFICIAL/logs", "tests/data/golden", "https://example.org/home/x", "~/work/x", "a.b/tmp/"):
        assert machine_paths(fine) == [], fine


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_page_names_a_folder_of_the_authors_machine(page):
    found = machine_paths(page.read_text())
    assert not found, f"{page.relative_to(ROOT)}: use paths relative to the repository or placeholders: {found}"


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_no_result_files_command_names_a_folder_of_the_authors_machine(path):
    found = [c for c in commands(json.loads(path.read_text())) if MACHINE_PATH.search(c)]
    assert not found, f"{path.name}: its command names an absolute path of a machine: {found}"


def test_the_result_files_record_their_commands():
    # The scan above reads something: the agents' result files do record how they were made.
    recorded = {p.name for p in RESULTS if list(commands(json.loads(p.read_text())))}
    assert {"results_official_dreamer.json", "results_sheeprl_dreamer.json", "results_targets.json"} <= recorded


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_page_says_how_the_work_was_resourced(page):
    found = [line.strip() for line in page.read_text().splitlines() if WORDS.search(line)]
    assert not found, f"{page.relative_to(ROOT)}: say what was (not) measured, not what was lent: {found}"


def test_the_word_check_reads_words_not_parts_of_them():
    assert WORDS.search("no GPU was lent to this work")
    assert not WORDS.search("relentless, lentil, Lenten")


def test_pages_are_found():
    names = {str(p.relative_to(ROOT)) for p in PAGES}
    assert {"README.md", "docs/real-agents.md", "docs/performance.md", "docs/frameworks/jax.md"} <= names
