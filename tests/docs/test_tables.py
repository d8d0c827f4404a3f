"""The docs' tables of numbers are what `benchmarks/render_tables.py` renders from `benchmarks/results/`."""

import json

import pytest

from benchmarks import render_tables


def test_every_generated_table_matches_its_result_file():
    stale = render_tables.stale()
    assert not stale, (
        "tables that differ from their result files (run `python benchmarks/render_tables.py`): " + "; ".join(stale)
    )


def test_the_pages_hold_the_tables_they_promise():
    specs = [m["spec"] for page in render_tables.pages() for m in render_tables.MARKER.finditer(page.read_text())]
    used = {spec.split()[0] for spec in specs}
    # The README's headline numbers and the performance page's tables are generated, not typed.
    assert {
        "train_step",
        "train_step_ratios",
        "sweep",
        "step_memory",
        "peers",
        "ensemble",
        "demo_heads",
        "export_latency",
        "scaling",
        "bin_scheme_bias",
        "public_names",
    } <= used
    assert used <= set(render_tables.RENDERERS)
    readme = (render_tables.ROOT / "README.md").read_text()
    assert "<!-- table: train_step_ratios" in readme and "<!-- table: peers" in readme


def test_a_changed_result_shows_as_a_stale_table(tmp_path, monkeypatch):
    # A copy of the tree's results with one timing changed: the page's table no longer matches it.
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    for path in render_tables.RESULTS.glob("*.json"):
        (results / path.name).write_text(path.read_text())
    records = json.loads((results / "results_train_step_latest.json").read_text())
    step = next(r for r in records if r.get("impl") == "multicritic")
    step["step_ms"] *= 2
    (results / "results_train_step_latest.json").write_text(json.dumps(records))
    page = tmp_path / "README.md"
    page.write_text((render_tables.ROOT / "README.md").read_text())
    monkeypatch.setattr(render_tables, "RESULTS", results)
    assert render_tables.stale(tmp_path) == ["README.md: train_step_ratios results_train_step_latest.json"]
    page.write_text(render_tables.rendered(page.read_text()))
    assert render_tables.stale(tmp_path) == []


def test_bad_markers_name_what_is_wrong():
    with pytest.raises(ValueError, match="table: got 'no_such_table'"):
        render_tables.render("no_such_table results_sweep.json")
    with pytest.raises(ValueError, match="got 'missing.json'"):
        render_tables.render("sweep missing.json")
    with pytest.raises(ValueError, match="expected result files"):
        render_tables.render("sweep")


def test_the_peers_table_shows_our_compiled_or_eager_step():
    torch_row = {
        "peer": "sheeprl",
        "backend": "torch",
        "batch": 256,
        "peer_ms": 10.0,
        "multicritic_ms": 12.5,
        "multicritic_jit_ms": 8.0,
    }
    jax_row = {"peer": "official", "backend": "jax", "batch": 256, "peer_ms": 9.0, "multicritic_ms": 6.0}
    skipped = {"peer": "torchrl", "size": "XS", "skipped": "not installed"}
    compiled = render_tables.peers([[jax_row], [torch_row, skipped]])
    assert compiled[2:] == [
        "| official DreamerV3 (JAX) | **1.50** (9.00 / 6.00) |",
        "| sheeprl (PyTorch) | **1.25** (10.00 / 8.00) |",
    ]
    # Eager: PyTorch's first 1000 calls under "auto"; JAX has no eager step to show.
    assert render_tables.peers([[jax_row], [torch_row]], ours="eager")[2:] == [
        "| sheeprl (PyTorch) | 0.80 (10.00 / 12.50) |"
    ]
    with pytest.raises(ValueError, match="ours: got 'fast'"):
        render_tables.peers([[torch_row]], ours="fast")
