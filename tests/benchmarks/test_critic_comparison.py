"""The critic comparison's drivers (benchmarks/ours/critic_comparison.py) run at a tiny size, one combination
each, and their files render (docs/critic-comparison.md). Pure drivers: they run in the JAX session only (the
PPO grid is the Keras agent on JAX)."""

import json

import pytest

from tests.conftest import BACKEND

CRITIC_COMPARISON = "benchmarks/ours/critic_comparison.py"

pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="the comparison's drivers run on JAX (the JAX session)")


def test_the_demo_driver_records_a_wrong_start_of_the_adaptive_head_and_its_table_renders(tmp_path):
    from benchmarks import render_tables
    from benchmarks.ours import critic_comparison

    out = tmp_path / "demo.json"
    argv = ["demo", "--heads", "adaptive", "--sets", "wrong", "--trunks", "mlp", "--seeds", "0"]
    argv += ["--scales", "1000000", "--size", "nano", "--steps", "20", "--json", str(out)]
    critic_comparison.main(argv)
    data = json.loads(out.read_text())
    assert data["command"].startswith("python benchmarks/ours/critic_comparison.py demo --heads adaptive")
    assert data["planned"] == [["adaptive", "mlp", list(critic_comparison.WRONG_SUPPORT), "uniform_symlog", 0]]
    [run] = data["runs"]
    assert (run["head"], run["trunk"], run["support"], run["bins"], run["seed"]) == (
        "adaptive",
        "mlp",
        [-1.0, 1.0],
        "uniform_symlog",
        0,
    )
    [scale] = run["scales"]
    assert scale["reward_scale"] == 1e6 and scale["steps"] == 20 and 0 < scale["relative_rmse"]
    assert scale["seconds_per_step"] > 0 and scale["curve"][-1][0] == 20
    assert scale["steps_to_target"] is None or scale["steps_to_target"] == 20
    # The wrong start grew at once towards the targets (symlog of values up to about 3e7).
    low, high = scale["final_support"]
    assert low < -1.0 and high > 5.0
    # A second call finds the run done and leaves it as it was.
    critic_comparison.main(argv)
    assert json.loads(out.read_text())["runs"] == data["runs"]

    rmse = render_tables.critic_comparison_demo([data])
    assert (
        rmse[2].startswith("| adaptive | mlp | uniform_symlog | [-1, 1] (wrong) | 1 | ") and "1 of 1 runs" in rmse[-1]
    )
    steps = render_tables.critic_comparison_demo([data], show="steps")
    assert "steps to 5% @ 1e+06" in steps[0] and "ms / step" in steps[0]
    # A snapshot of the file's first runs: none yet.
    assert render_tables.critic_comparison_demo([data], runs="0")[2].startswith(
        "| adaptive | mlp | uniform_symlog | [-1, 1] (wrong) | 0 |"
    )
    verdicts = render_tables.critic_comparison_demo_verdicts([data])
    assert verdicts[0].startswith("Reference: two_hot")  # nothing to compare with: no reference run
    png = tmp_path / "demo.png"
    critic_comparison.plot_demo(data, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_ppo_driver_runs_a_trunk_through_ppo_scales_and_its_table_renders(tmp_path):
    from benchmarks import render_tables
    from benchmarks.agents.plot_curves import plot_comparison
    from benchmarks.ours import critic_comparison

    out = tmp_path / "ppo.json"
    argv = ["ppo", "--heads", "two_hot", "--trunks", "xqc", "--envs", "CartPole-v1", "--scales", "1000000"]
    argv += ["--seeds", "1", "--steps", "512", "--json", str(out)]
    # A plan written ahead records the command that will run it, and no run.
    critic_comparison.main([*argv, "--plan-only"])
    planned = json.loads(out.read_text())
    assert planned["runs"] == {} and planned["plan"]["command"] == " ".join(["python", CRITIC_COMPARISON, *argv])
    assert render_tables.critic_comparison_ppo([planned])[2].startswith("| two_hot | xqc | default | 0 |")
    critic_comparison.main(argv)
    data = json.loads(out.read_text())
    assert data["plan"] == planned["plan"]
    # The plan is kept by ppo_scales.py, which adds the trunk to a run's key where it is not the MLP.
    assert data["plan"]["runs"] == ["jax/CartPole-v1/two_hot/1e+06/1/xqc"]
    assert data["plan"]["invocations"] == [data["command"]] and "--trunks xqc" in data["command"]
    record = data["runs"]["jax/CartPole-v1/two_hot/1e+06/1/xqc"]
    assert record["critic_options"] == {"trunk": "xqc"} and record["steps"] == 512 and record["seconds"] > 0
    assert record["episodes"] and all(1.0 <= r <= 500.0 for _, r in record["episodes"])

    table = render_tables.critic_comparison_ppo([data])
    assert table[0].startswith("| head | trunk | initial support | runs | CartPole-v1 x1e+06 | ms / step |")
    assert table[2].startswith("| two_hot | xqc | default | 1 | ") and "1 of 1 runs" in table[-1]
    assert render_tables.critic_comparison_ppo_verdicts([data])[0].startswith("Reference: two_hot on the MLP")
    png = tmp_path / "ppo.png"
    plot_comparison(data, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_mlp_runs_key_is_the_key_it_always_was():
    from benchmarks.agents.ppo_scales import key

    assert key("jax", "CartPole-v1", "two_hot", 1e6, 3) == "jax/CartPole-v1/two_hot/1e+06/3"
    assert key("jax", "CartPole-v1", "two_hot", 1e6, 3, "mlp") == "jax/CartPole-v1/two_hot/1e+06/3"
    assert key("jax", "CartPole-v1", "two_hot", 1.0, 3, "xqc") == "jax/CartPole-v1/two_hot/1/3/xqc"
