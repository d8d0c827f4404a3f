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
        "comparison",
        "targets_met",
        "host_training",
        "gpu_train_step",
        # The sentences that quote a result file (tests/docs/test_hand_numbers.py: no number typed by hand).
        "targets_spread",
        "tf_ways",
        "extras_cost_summary",
        "compile_payback",
        "ensemble_summary",
        "forward_views_summary",
        "step_impls",
        "ppo_cost_summary",
        "peers_range",
        "sheeprl_same",
        "sheeprl_variant",
        "official_shared",
        "ppo_learned_counts",
        "critic_transient",
        "critic_transient_bias",
        "ppo_scales_bias",
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


def test_the_comparison_lists_every_registered_head_and_trunk():
    from multicritic.heads import HEADS
    from multicritic.trunks import TRUNKS

    rows = {line.split(" | ")[0][2:]: line for line in render_tables.comparison([]) if line.startswith("| ")}
    assert rows["value heads"].split(" | ")[1] == "two-hot, HL-Gauss, MSE, quantile, adaptive"
    assert rows["trunks"].split(" | ")[1] == "MLP, residual, SimbaV2, XQC"
    assert rows["loads / exports the others' critics"].split(" | ")[1] == "all six"
    assert len(HEADS) == 5 and len(TRUNKS) == 4
    for page in ("README.md", "docs/index.md"):
        assert "<!-- table: comparison -->" in (render_tables.ROOT / page).read_text()
    # A new head is one registration: both pages' tables are then stale until rendered again.
    HEADS.register("beta_mixture", "some_package.heads:BetaMixtureHead")
    try:
        assert "two-hot, HL-Gauss, MSE, quantile, adaptive, beta-mixture" in render_tables.render("comparison")
        assert {"README.md: comparison", "docs/index.md: comparison"} <= set(render_tables.stale())
    finally:
        HEADS.unregister("beta_mixture")


def _target(name, benchmark, backend, batch, ratios, bound, natives=("native",)):
    met = sum(r <= bound if benchmark == "ensemble" else r >= bound for r in ratios)
    return {"target": name, "benchmark": benchmark, "backend": backend, "batch": batch, "natives": list(natives),
            "bound": bound, "ratios": ratios, "rounds_met": met}  # fmt: skip


def test_the_targets_sentence_counts_every_round_of_every_file():
    first = {
        "targets": [
            _target("torch-256", "train_step", "torch", 256, [1.2, 1.1], 1.0),
            _target("torch-4096", "train_step", "torch", 4096, [1.05, 1.01], 1.0),
            _target("torch-compiled-4096", "train_step", "torch", 4096, [0.97, 0.96], 0.95, ("native_compiled",)),
            _target("jax-256", "train_step", "jax", 256, [0.90, 0.96], 0.95),
            _target("tensorflow-ensemble-256", "ensemble", "tensorflow", 256, [1.06, 1.07], 1.05),
        ]
    }
    # A second file reads the borderline ones again: its rounds join the first file's.
    again = {"targets": [_target("jax-256", "train_step", "jax", 256, [0.97], 0.95)]}
    assert render_tables.targets_met([first, again])[2:] == [
        "- **Met in every round:** PyTorch at batch 256 and 4096; "
        "PyTorch against its compiled native step at batch 4096.",
        "- **Met in some rounds:** JAX at batch 256 (2 of 3, 0.900–0.970).",
        "- **Met in none:** the TensorFlow K = 5 ensemble at batch 256 (0 of 2, 1.060–1.070).",
    ]
    assert render_tables.targets_met([first, again])[0].startswith("Over all 11 rounds of the 5 targets")


def test_the_performance_page_and_readme_say_which_targets_are_met_from_the_files():
    spec = "<!-- table: targets_met results_targets.json results_targets_borderline.json -->"
    for page in ("README.md", "docs/performance.md"):
        assert spec in (render_tables.ROOT / page).read_text()
    text = render_tables.render(spec[len("<!-- table: ") : -len(" -->")])
    # tensorflow-ensemble-256: 1 of 2 rounds in the first file, 0 of 3 in the borderline one.
    assert "the TensorFlow K = 5 ensemble at batch 256 (1 of 5, 1.031–1.091)" in text


def test_a_gpu_table_says_what_it_was_measured_with_and_that_it_is_not_remeasured(monkeypatch):
    machine = ["NVIDIA H200, 143771 MiB, 580.159.04", "torch 2.11.0+cu130 jax 0.11.2 keras 3.15.1 cuda devices 1"]
    monkeypatch.setattr(render_tables, "_pins", lambda: {"torch": "2.13.0", "jax": "0.10.2", "keras": "3.15.1"})
    assert render_tables._provenance(machine, "5170e82") == (
        "Measured once, on one NVIDIA H200 (143771 MiB, driver 580.159.04), with torch 2.11.0+cu130, jax 0.11.2, "
        "keras 3.15.1, and recorded in commit 5170e82; not remeasured since, so later changes to the step are not "
        "in these numbers. The test-suite pins other versions: torch 2.13.0, jax 0.10.2 (`backends_matrix.yaml`)."
    )
    with pytest.raises(ValueError, match="commit: got 'HEAD'"):
        render_tables._provenance(machine, "HEAD")


def test_the_pins_are_read_from_the_backends_matrix():
    pins = render_tables._pins()
    text = (render_tables.ROOT / "backends_matrix.yaml").read_text()
    assert set(pins) == {"torch", "jax", "keras"}
    assert all(f"{name}=={version}" in text for name, version in pins.items())


def test_the_gpu_sentence_compares_with_each_frameworks_fastest_native_step():
    def step(backend, impl, ms):
        return {"backend": backend, "impl": impl, "size": "XS", "batch": 256, "step_ms": ms}

    merged = {
        "machine": ["GPU, 1 MiB, 1"],
        "train_step_jax": [step("jax", "multicritic", 2.0), step("jax", "native", 1.0)],
        "train_step_torch": [step("torch", "multicritic", 1.6), step("torch", "native_compiled", 3.2)],
    }
    assert render_tables.gpu_summary([merged]) == [
        "Native time / ours (above 1: ours is faster): JAX 0.50 against its own fastest native step (the fastest "
        "of any framework); PyTorch 2.00 against its own fastest native step, 0.62 against the fastest of any "
        "framework: JAX and PyTorch are slower than the fastest native step at every batch."
    ]


def test_the_host_training_sentence_and_table():
    records = [
        {"host": "sheeprl", "steps": 8, "repeats": 3, "stock_s": 2.0, "swap_s": 2.2, "swap_over_stock": 1.1,
         "keras_import_s": 1.04},
        {"host": "RLlib", "iterations": 5, "repeats": 5, "stock_s": 4.0, "swap_s": 4.0, "swap_over_stock": 1.0,
         "keras_import_s": 1.62},
    ]  # fmt: skip
    assert render_tables.host_training([records[:1], records[1:]], form="sentence") == [
        "sheeprl: 1.10x its own time; RLlib: 1.00x its own time; importing Keras and multicritic adds 1.0–1.6 s "
        "once a process."
    ]
    assert render_tables.host_training([records])[2:] == [
        "| sheeprl | 8 steps | 3 | 2.00 | 2.20 | 1.10 | 1.0 |",
        "| RLlib | build + 5 × `algo.train()` | 5 | 4.00 | 4.00 | 1.00 | 1.6 |",
    ]
    with pytest.raises(ValueError, match="form: got 'list'"):
        render_tables.host_training([records], form="list")


def _copy_results(tmp_path):
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    for path in render_tables.RESULTS.glob("*.json"):
        (results / path.name).write_text(path.read_text())
    return results


def test_a_changed_result_changes_the_sentence_that_quotes_it(tmp_path, monkeypatch):
    # TensorFlow's Keras program made slower on CartPole: the verdict under the Cost table turns with the table.
    results = _copy_results(tmp_path)
    data = json.loads((results / "results_ppo_cost.json").read_text())
    for run in data["runs"].values():
        if run["backend"] == "tensorflow" and run["agent"] == "keras" and run["env"] == "CartPole-v1":
            run["seconds"] *= 1.5
    (results / "results_ppo_cost.json").write_text(json.dumps(data))
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "performance.md"
    page.write_text((render_tables.ROOT / "docs" / "performance.md").read_text())
    before = render_tables.render("ppo_cost_summary results_ppo_cost.json")
    assert before.startswith("Every backend's Keras program is within the 1.2x target on both tasks")
    monkeypatch.setattr(render_tables, "RESULTS", results)
    assert "docs/performance.md: ppo_cost_summary results_ppo_cost.json" in render_tables.stale(tmp_path)
    assert render_tables.render("ppo_cost_summary results_ppo_cost.json").startswith(
        "Above the 1.2x target: TensorFlow on CartPole-v1 (1.77)"
    )


def test_the_ensemble_sentence_reads_the_target_with_three_decimals():
    def step(impl, batch, ms):
        return {"backend": "tensorflow", "impl": impl, "size": "XS", "batch": batch, "step_ms": ms}

    records = [
        step("ensemble", 256, 10.51),
        step("native", 256, 10.2),
        step("native_xla", 256, 10.0),
        step("ensemble", 4096, 100.0),
        step("native", 4096, 99.0),
        step("native_xla", 4096, 101.0),
    ]
    # 10.51 / 10.0 shows as 1.05 in a table, and is above a 1.05 target.
    assert render_tables.ensemble_summary([records], target="1.05") == [
        "Ours / the fastest native ensemble, against the 1.05x target: TensorFlow 1.051 at batch 256 and 1.010 at "
        "batch 4096 (against the faster of its native plain graph and XLA: XLA at 256 and the plain graph at 4096): "
        "within it at 4096 only."
    ]


def test_the_compile_payback_is_the_first_call_over_the_time_saved():
    def step(impl, batch, ms, first):
        return {"backend": "torch", "impl": impl, "batch": batch, "step_ms": ms, "first_call_s": first}

    records = [step("multicritic", 8, 1.0, 9.0), step("multicritic_eager", 8, 4.0, 0.0)]
    records += [step("multicritic", 4096, 40.0, 6.0), step("multicritic_eager", 4096, 39.0, 0.1)]
    assert render_tables.compile_payback([records]) == [
        "At batch 8 and 4096 the compiled step took 1.00 and 40.00 ms against the eager step's 4.00 and 39.00 ms; "
        "its first call (tracing and compilation) took 9.0 and 6.0 s, so a compilation paid for itself after about "
        "3,000 and never steps."
    ]


def test_fisher_exact_is_scipys():
    stats = pytest.importorskip("scipy.stats")
    for table in ([[26, 4], [23, 7]], [[18, 0], [56, 16]], [[3, 3], [3, 3]], [[0, 5], [5, 0]]):
        (a, b), (c, d) = table
        assert render_tables._fisher_exact(a, b, c, d) == pytest.approx(stats.fisher_exact(table)[1], rel=1e-9)
