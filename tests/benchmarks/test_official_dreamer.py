"""The official DreamerV3's learning-curve driver (`benchmarks/agents/official_dreamer.py`): its bookkeeping, its
table and plot everywhere; the driver itself end to end where the official code is at hand (see
`tests/interop/test_official_agent.py` for the set-up)."""

import json
import os
import pickle
import subprocess
import sys

import pytest

from benchmarks import render_tables
from benchmarks.agents import official_dreamer
from benchmarks.agents.plot_curves import joined, leading_equal

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _half(episodes, restored=None, wall=10.0):
    return {"episodes": episodes, "wall_s": wall, "cpu_s": wall / 2, "restored_step": restored, "swapped": None}


def results(final_save=True):
    """Two seeds of stock and swap, 400 steps: seed 1's swap leaves stock's episodes at its third."""
    first = [[50, 10.0], [150, 20.0], [230, 30.0]]
    stock = {
        seed: [_half(first, wall=20.0), _half([[260, 40.0], [330, 50.0], [400, 60.0]], restored=200)] for seed in (1, 2)
    }
    swap = {1: [_half(first), _half([[260, 40.0], [300, 45.0], [400, 70.0]], restored=200)], 2: stock[2]}
    runs = {f"stock/{s}": v for s, v in stock.items()}
    runs.update({f"swap/{s}": v for s, v in swap.items()})
    runs["swap/3"] = [_half(first)]  # a run still going: left out
    return {"env": official_dreamer.TASK, "steps": 400, "final_save": final_save, "runs": runs}


def test_the_first_half_counts_up_to_the_step_the_second_resumed_from():
    halves = results()["runs"]["stock/1"]
    # The first half's episode ending at 230 lies past the restored step 200: the second half ran those steps again.
    assert joined(halves) == [[50, 10.0], [150, 20.0], [260, 40.0], [330, 50.0], [400, 60.0]]
    assert joined([_half([[5, 1.0]]), _half([[9, 2.0]])]) == [[5, 1.0], [9, 2.0]]  # no restored step recorded
    assert leading_equal(joined(results()["runs"]["swap/1"]), joined(halves)) == 3
    assert leading_equal(joined(halves), joined(halves)) == 5


def test_the_table_gives_returns_at_budgets_and_the_episodes_shared_with_stock():
    lines = render_tables.RENDERERS["official_dreamer"]([results()])
    assert lines[0].startswith("| critic | seeds | return @ 100 | return @ 200 | return @ 300 | return @ 400 |")
    stock, swap = lines[2], lines[3]
    # @ 400: the episodes ending in its last eighth (after 350): 60 for stock; 70 and 60 for the swap's seeds.
    assert stock.startswith("| stock | 2 |") and "| 60 [60, 60] | – | 30 | 15 |" in stock
    assert swap.startswith("| swap | 2 |") and "| 65 [60, 70] | 3 / 5, 5 / 5 | 25 | 12 |" in swap
    assert "resumed from the official checkpoint of the first half (200 steps) at its end" in lines[-1]
    # Before the resume at 200: 10 and 20 in each run; after it stock's 40, 50, 60 (three runs) and 40, 45, 70.
    assert lines[-1].endswith(
        "over the 4 runs: the last five episodes before it return 15 on average, the first five after it 50."
    )
    clock = render_tables.RENDERERS["official_dreamer"]([results(final_save=False)])
    assert "at the official loop's last timed save" in clock[-1]


def test_a_repeat_file_says_how_many_first_episodes_stock_shares_with_itself():
    first = [[50, 10.0], [150, 20.0], [230, 30.0]]
    again = {"flags": None, "runs": {"stock/1": [_half([[50, 10.0], [150, 21.0]])], "stock/9": [_half(first)]}}
    lines = render_tables.RENDERERS["official_dreamer"]([results(), again])
    assert lines[-1] == (
        "The stock run of seed 1 made again (the same flags, seed and pinning; its first half, 2 episodes): its "
        "first 1 episodes are the first run's."
    )
    assert sum("made again" in line for line in lines) == 1  # seed 9 has no first run to compare with
    with pytest.raises(ValueError, match="flags"):
        render_tables.RENDERERS["official_dreamer"]([results(), {**again, "flags": ["--other"]}])


def test_the_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    path, png = tmp_path / "official.json", tmp_path / "official.png"
    path.write_text(json.dumps(results()))
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "agents", "plot_curves.py"), "official", str(path)]
    assert subprocess.run([*command, str(png)], capture_output=True, text=True, timeout=300).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_driver_reads_the_official_checkpoint_and_scores(tmp_path):
    folder = tmp_path / "ckpt" / "20260101T000000F000000"
    folder.mkdir(parents=True)
    (tmp_path / "ckpt" / "latest").write_text(folder.name)
    (folder / "step.pkl").write_bytes(pickle.dumps(4280))
    (folder / "agent.pkl").write_bytes(pickle.dumps({"params": {}, "counters": {"updates": 1597, "actions": 4280}}))
    assert official_dreamer._restored_step(str(tmp_path)) == (4280, 1597)
    assert official_dreamer._restored_step(str(tmp_path / "none")) == (None, None)
    scores = tmp_path / "scores.jsonl"
    scores.write_text('{"step": 36, "episode/score": 35.0, "episode/length": 36.0}\n')
    offset = scores.stat().st_size
    with open(scores, "a") as f:
        f.write('{"step": 80, "episode/score": 43.0}\n{"step": 90}\n')
    assert official_dreamer._scores(str(scores), 0) == [[36, 35.0], [80, 43.0]]
    assert official_dreamer._scores(str(scores), offset) == [[80, 43.0]]  # a resumed half's own episodes


def test_the_source_must_be_the_pinned_commit(tmp_path):
    assert "is not set" in official_dreamer.source_problem(None)
    assert "holds no dreamerv3/main.py" in official_dreamer.source_problem(str(tmp_path))
    (tmp_path / "dreamerv3").mkdir()
    (tmp_path / "dreamerv3" / "main.py").write_text("")
    assert official_dreamer.COMMIT in official_dreamer.source_problem(str(tmp_path))  # not a checkout at it


def test_setup_clones_at_the_commit_and_pins_the_environment(tmp_path, capsys):
    official_dreamer.setup(str(tmp_path), dry_run=True)
    out = capsys.readouterr().out
    assert f"git clone --quiet {official_dreamer.REPOSITORY}" in out
    assert f"checkout --quiet {official_dreamer.COMMIT}" in out
    assert "jax==0.4.33" in out and "gym==0.25.2" in out and "keras==3.15.1" in out and "ninjax==3.6.3" in out
    assert not (tmp_path / "src").exists()  # a dry run runs nothing


@pytest.mark.interop
def test_the_driver_runs_each_variant_through_a_resume(tmp_path):
    problem = official_dreamer.source_problem(os.environ.get(official_dreamer.SOURCE_ENV))
    if problem:
        pytest.skip(problem)
    python = os.environ.get("MULTICRITIC_OFFICIAL_PYTHON", sys.executable)
    if subprocess.run([python, "-c", "import elements, gym, ninjax, keras"], capture_output=True).returncode:
        pytest.skip(f"{python} does not run the official code's environment")
    out = tmp_path / "official.json"
    command = [python, os.path.join(ROOT, "benchmarks", "agents", "official_dreamer.py"), "--seeds", "0"]
    command += ["--steps", "400", "--work", str(tmp_path / "work"), "--json", str(out), "--"]
    command += ["--batch_size", "4", "--batch_length", "32", "--run.train_ratio", "128", "--run.save_every", "5"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["versions"]["commit"] == official_dreamer.COMMIT and record["final_save"]
    for variant in official_dreamer.VARIANTS:
        first, resumed = record["runs"][f"{variant}/0"]
        assert (first["swapped"] is None) == (variant == "stock")
        assert variant == "stock" or "val=CriticHead" in first["swapped"]
        # The second half resumed from the official checkpoint the first half ended with.
        assert first["final_save_step"] == resumed["restored_step"] >= 200 and resumed["restored_updates"] > 0
        assert first["episodes"] and resumed["episodes"]
        assert max(s for s, _ in first["episodes"]) <= 210 < min(s for s, _ in resumed["episodes"])
        assert max(s for s, _ in resumed["episodes"]) <= 410 and first["cpu_s"] > 0
