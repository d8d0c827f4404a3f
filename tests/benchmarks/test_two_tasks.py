"""`benchmarks/agents/two_tasks.py` (issue 74) runs end to end on a few steps and its table renders."""

import json

import numpy as np


def test_two_tasks_driver_writes_its_results_and_table(tmp_path):
    from benchmarks import render_tables
    from benchmarks.agents import two_tasks

    out = tmp_path / "two_tasks.json"
    argv = ["--size", "nano", "--steps", "2", "--batch", "3", "--eval-every", "1", "--jit-compile", "auto"]
    argv += ["--json", str(out)]
    results = json.loads(json.dumps(two_tasks.main(argv)))
    assert json.loads(out.read_text()) == results
    assert results["command"] == "python benchmarks/agents/two_tasks.py " + " ".join(argv)
    (seed,) = results["seeds"]
    runs = seed["runs"]
    assert sorted(runs) == ["per_task", "shared", "task_0", "task_1"]
    assert [len(runs[r]["scale"]) for r in ("per_task", "shared", "task_0")] == [2, 1, 1]
    # The normaliser does not enter the loss: the same critic learns the same values with either normaliser.
    assert runs["per_task"]["relative_rmse"] == runs["shared"]["relative_rmse"]
    assert [step for step, *_ in runs["task_1"]["curve"]] == [1, 2]
    # Task 1's returns are 1e4 times task 0's: so are its exact values.
    (lo0, hi0), (lo1, hi1) = seed["exact_value_range"]
    assert 1e3 < max(abs(lo1), hi1) / max(abs(lo0), hi0) < 1e5
    lines = render_tables.RENDERERS["two_tasks"]([results])
    assert lines[2].startswith("| 0 | 1 | ") and lines[3].startswith("| 1 | 10000 | ")
    assert np.isfinite([float(c) for c in lines[3].strip("|").split("|")[2:]]).all()
