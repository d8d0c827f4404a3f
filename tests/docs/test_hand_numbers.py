"""The pages that report measurements type none by hand: every measured number on them sits in a block that
`benchmarks/render_tables.py` writes from a result file, so that a remeasured file cannot leave a stale sentence
behind (what was measured once and is in no file belongs in a commit message or the changelog)."""

import re

import pytest

from benchmarks import render_tables

PAGES = (
    "README.md",
    "docs/performance.md",
    "docs/real-agents.md",
    "docs/critic-comparison.md",
    "docs/per-task-returns.md",
)

# A measured-looking number: digits with a unit of time, a speed-up or a share (1.2x, 10%, 63.6 ms, 5 s, 40 µs,
# 146.3 MiB, 210 GFLOP/s), or a bare ratio with two or three decimals (0.97, 1.085): how the pages quote results.
# A version (0.14.1, 3.10) is neither: the ratio form is 0.xx or 1.xx with nothing after it.
MEASURED = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:[x×%]|\s*(?:ms|µs|us|s|MiB|GiB|GFLOP/s|GFLOP))(?![\w/])"
    r"|(?<![\w.])[01]\.\d{2,3}(?![\w.])"
)

# The numbers that are not measurements, each where it stands (its words around it, whitespace collapsed). Keep
# this short: a number that summarises a result file belongs in a generated block instead.
ALLOWED = {
    "docs/performance.md": (
        # The targets: definitions, which `benchmarks/ours/targets.py` checks.
        "(0.85 at batch 8) and 0.95 of a compiled native step at 4096",
        "TensorFlow and JAX at least 0.95 of their native steps",
        "at most 1.05 of a native vectorised ensemble",
        # A step's matmul work at XS, from the model's sizes (`gflop_per_step`), not timed.
        "0.64 / 10.2 / 38.2 GFLOP of matmuls",
        # The bound `tests/benchmarks/test_smoke.py` holds the launches to.
        "fails above 1.10x",
    ),
    "docs/real-agents.md": (
        # Definitions: the final return, and what a seed that learned is (`plot_curves.learned`).
        "the episodes ending in the last 10% of the steps",
        "beats their first 10%'s by more than 10%",
        # The hyperparameters: 1e-3 against 2.5e-4.
        "learning rate is 4x the actor's",
        # Arithmetic of the symlog decode (symlog 4 against 18), not a run.
        "a 2x error at scale 1 and a 1000x one at scale 1e6",
    ),
}


def _blank(match: re.Match) -> str:
    """The match with every character but newlines as a space: masked text keeps its lines' numbers."""
    return re.sub(r"[^\n]", " ", match.group(0))


def hand_text(text: str) -> str:
    """A page's text as its author typed it: generated blocks, HTML comments, fenced and indented code and inline
    code spans (commands, flags) blanked out, line breaks kept."""
    text = render_tables.MARKER.sub(_blank, text)
    text = re.sub(r"<!--.*?-->", _blank, text, flags=re.S)
    text = re.sub(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+).*?^(?P=indent)(?P=fence)[ \t]*$", _blank, text,
                  flags=re.M | re.S)  # fmt: skip
    lines = text.split("\n")
    for i, line in enumerate(lines):  # an indented code block: 4 spaces after a blank line, or after such a line
        if line.startswith("    ") and i and (not lines[i - 1].strip() or lines[i - 1].startswith("    ")):
            lines[i] = " " * len(line)
    return re.sub(r"`[^`\n]*`", _blank, "\n".join(lines))


def hand_numbers(page: str, text: str):
    """`(line, number, line's text)` of every measured-looking number typed by hand on a page, the allowed ones
    left out; and the allowed phrases not found on it."""
    typed = hand_text(text)
    flat = re.sub(r"\s+", " ", typed)
    unused = [phrase for phrase in ALLOWED.get(page, ()) if phrase not in flat]
    # Blank the allowed phrases where they stand: a phrase may span lines, so match it with any whitespace.
    for phrase in ALLOWED.get(page, ()):
        pattern = r"\s+".join(re.escape(word) for word in phrase.split())
        typed = re.sub(pattern, _blank, typed)
    found = []
    for number, line in enumerate(typed.split("\n"), 1):
        for m in MEASURED.finditer(line):
            found.append((number, m.group(0), text.split("\n")[number - 1].strip()))
    return found, unused


@pytest.mark.parametrize("page", PAGES)
def test_a_page_types_no_measured_number_by_hand(page):
    found, unused = hand_numbers(page, (render_tables.ROOT / page).read_text())
    assert not found, (
        f"{page} quotes measured numbers by hand; generate the sentence from its result file with a renderer of "
        "benchmarks/render_tables.py, or remove the number (measurement history belongs in the changelog): "
        + "; ".join(f"line {n}: {number!r} in {line!r}" for n, number, line in found)
    )
    assert not unused, f"{page}: allowed phrases no longer on the page, drop them from ALLOWED: {unused}"


def test_the_check_finds_a_typed_number_and_leaves_generated_and_code_alone():
    page = "\n".join(
        [
            "The step took 63.6 ms in one process and 75.0 ms in another,",
            "a ratio of 0.85, 1.2x the target, 5% slower, 7 s to compile, 40 µs a call, 146.3 MiB.",
            "Versions 0.14.1 and 3.10, 8,000 steps, 3 seeds, batch 4096, (B 16 x T 64), 16x16, 1e-3: not measured.",
            "<!-- table: sweep results_sweep.json -->",
            "| XS | 64 | 2.92 ms | 0.81 |",
            "<!-- /table -->",
            "```bash",
            "python train_step.py --block-seconds 2.0 --ratio 0.95",
            "```",
            "",
            "    taskset -c 0 python ppo_cost.py  # 1.25 s",
            "",
            "Run `python x.py --tolerance 0.05` and read it.",
        ]
    )
    found, _ = hand_numbers("other.md", page)
    assert [number for _, number, _ in found] == [
        "63.6 ms",
        "75.0 ms",
        "0.85",
        "1.2x",
        "5%",
        "7 s",
        "40 µs",
        "146.3 MiB",
    ]
    assert {line for line, _, _ in found} == {1, 2}


def test_an_allowed_phrase_is_allowed_only_where_it_stands():
    found, unused = hand_numbers(
        "docs/real-agents.md",
        "A run's final return: the episodes ending in the last\n10% of the steps. Another 10% elsewhere.",
    )
    assert [number for _, number, _ in found] == ["10%"]
    assert "the episodes ending in the last 10% of the steps" not in unused
