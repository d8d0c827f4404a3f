"""`benchmarks/agents/halves.py`: runs in two halves on one checkpoint, each half's record saved as it ends, and a
stopped driver taken up where it stood (a run whose checkpoint is gone, or whose first half never ended, again
whole)."""

import json
import os

from benchmarks.agents import halves


def _driver(tmp_path, fail_at=None):
    """`(run, calls)`: a driver over fake halves that write a checkpoint file in their logdir (the second half
    reads it); `fail_at`: the `(variant, seed, half)` that raises, as a killed driver stops."""
    calls = []
    path = str(tmp_path / "results.json")

    def logdir(variant, seed):
        return str(tmp_path / f"{variant}-{seed}")

    def half(variant, seed, number, slot):
        calls.append((variant, seed, number, slot))
        folder = logdir(variant, seed)
        if number == 1:
            assert os.path.exists(os.path.join(folder, "ckpt")), "the second half needs the first's checkpoint"
        os.makedirs(folder, exist_ok=True)
        if (variant, seed, number) == fail_at:
            raise RuntimeError("stopped")
        open(os.path.join(folder, "ckpt"), "w").close()
        return {"wall_s": 1.0, "half": number, "slot": slot}

    def run(results=None, runs=(("a", 0), ("b", 0))):
        results = halves.resume(results or {"steps": 10, "runs": {}}, path, ("steps",))
        return halves.run_all(
            results, path, list(runs), logdir, lambda f: os.path.exists(os.path.join(f, "ckpt")), half, [7]
        )

    return run, calls, path


def test_each_run_both_halves_in_order_saved_as_each_ends(tmp_path):
    run, calls, path = _driver(tmp_path)
    results = run()
    assert calls == [("a", 0, 0, 7), ("a", 0, 1, 7), ("b", 0, 0, 7), ("b", 0, 1, 7)]
    assert [h["half"] for h in results["runs"]["a/0"]] == [0, 1]
    with open(path) as f:
        assert json.load(f) == results


def test_a_stopped_driver_goes_on_where_it_stood(tmp_path):
    run, calls, path = _driver(tmp_path, fail_at=("b", 0, 0))
    try:
        run()
    except RuntimeError:
        pass
    with open(path) as f:
        saved = json.load(f)
    assert [h["half"] for h in saved["runs"]["a/0"]] == [0, 1] and not saved["runs"].get("b/0")
    run2, calls2, _ = _driver(tmp_path)
    run2()
    assert calls2 == [("b", 0, 0, 7), ("b", 0, 1, 7)]  # "a" is not run again; "b" whole, its files cleared first


def test_one_half_recorded_runs_the_second_or_again_whole_without_its_checkpoint(tmp_path):
    run, calls, path = _driver(tmp_path, fail_at=("a", 0, 1))
    try:
        run(runs=[("a", 0)])
    except RuntimeError:
        pass
    run2, calls2, _ = _driver(tmp_path)
    run2(runs=[("a", 0)])
    assert calls2 == [("a", 0, 1, 7)]  # the first half's checkpoint is there: only the second runs
    results = halves.resume({"steps": 10, "runs": {}}, path, ("steps",))
    results["runs"]["a/0"] = results["runs"]["a/0"][:1]  # one half recorded ...
    os.remove(tmp_path / "a-0" / "ckpt")  # ... and its checkpoint gone
    halves.save(results, path)
    run4, calls4, _ = _driver(tmp_path)
    run4(runs=[("a", 0)])
    assert calls4 == [("a", 0, 0, 7), ("a", 0, 1, 7)]


def test_a_changed_setting_starts_over(tmp_path):
    run, calls, path = _driver(tmp_path)
    run(runs=[("a", 0)])
    assert halves.resume({"steps": 10, "runs": {}}, path, ("steps",))["runs"]
    assert halves.resume({"steps": 20, "runs": {}}, path, ("steps",))["runs"] == {}
