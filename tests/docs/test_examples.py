"""Every Python block of README.md and docs/**/*.md runs, on the backends it names (see tests/docs/blocks.py).

A block that cannot run here is marked `<!-- not-run: reason -->` right above its fence; a block that shows an
optional library is marked `<!-- needs: module -->` and runs where that module imports (skipped elsewhere); every
other block runs as written, in a fresh temporary directory, with its inputs defined in the block itself (or in
the page's earlier block it `continues`).
"""

import pytest

from tests.conftest import BACKEND
from tests.docs import blocks

CHAINS = blocks.chains(blocks.all_blocks())


def test_the_pages_have_examples_and_every_marker_is_well_formed():
    assert len(CHAINS) >= 20
    for chain in CHAINS:
        for block in chain:
            assert block.backends  # raises on an unknown or ambiguous backend
            if block.skip is not None:
                assert len(block.skip) >= 10, f"{block.id}: say why it is not run"
            assert all(m.replace(".", "").replace("_", "").isalnum() for m in block.needs), block.id


@pytest.mark.parametrize("chain", CHAINS, ids=[chain[0].id for chain in CHAINS])
def test_example_runs(chain, tmp_path, monkeypatch):
    head = chain[0]
    if head.skip is not None:
        pytest.skip(f"not run: {head.skip}")
    wanted = set.intersection(*(set(b.backends) for b in chain))
    if BACKEND not in wanted:
        pytest.skip(f"runs on {sorted(wanted)}")
    for module in (m for block in chain for m in block.needs):
        pytest.importorskip(module, reason=f"the example shows {module}, which this session does not install")
    monkeypatch.chdir(tmp_path)
    namespace = None
    for block in chain:
        if block.skip is None:
            namespace = blocks.run(block.code, block.id, namespace)


def test_a_needs_marker_names_the_modules_a_block_imports(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- needs: orbax.checkpoint, flax -->\n```python\nimport flax\n```\n\n```python\nx = 1\n```\n")
    first, second = blocks.page_blocks(page, tmp_path)
    assert first.needs == ("orbax.checkpoint", "flax") and second.needs == ()
