"""The official DreamerV3 agent's own train step with multicritic as its critic and slow critic, run live.

The official code (danijar/dreamerv3 at `benchmarks/agents/official_dreamer.COMMIT`) is not on PyPI and CI
reaches PyPI only, so these tests run where a checkout is at hand: they skip unless `MULTICRITIC_OFFICIAL_SRC`
names a git checkout at that commit (its `dreamerv3/` and `embodied/` unchanged) and `MULTICRITIC_OFFICIAL_PYTHON`
(default: this interpreter) runs the official code's environment (jax <= 0.6.2, numpy < 2, ninjax, elements,
Keras). Set them up with

    python benchmarks/agents/official_dreamer.py --setup /work/official
    MULTICRITIC_OFFICIAL_SRC=/work/official/src MULTICRITIC_OFFICIAL_PYTHON=/work/official/venv/bin/python \\
        KERAS_BACKEND=jax pytest -m interop tests/interop/test_official_agent.py

`tests/interop/official_agent.py` (a process of its own, in that environment) builds the official agent on its
dummy task with and without the swap and trains each on the same batches and seeds; these tests check what it
recorded. Measured on the project's 2-core machine (jax 0.4.33): the initial parameters 318 / 318 bit-equal,
every metric of 5 steps under `jax.debug True` bit-equal (190 / 190), the parameters after them 298 / 318
bit-equal and within 6.6e-7 of their largest entry (the value head's gradient is summed in another order by the
critic's graph than by the stock head's), the checkpoints loaded across bit for bit.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.agents import official_dreamer

pytestmark = pytest.mark.interop
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_ENV = "MULTICRITIC_OFFICIAL_PYTHON"
# The official environment's packages this test needs, and the newest JAX the official code starts on.
PROBE = (
    "import elements, jax, keras, ninjax, numpy, ruamel.yaml; "
    "v = tuple(int(p) for p in jax.__version__.split('.')[:3]); "
    "assert v <= (0, 6, 2), 'jax ' + jax.__version__ + ' (the official code needs jax <= 0.6.2)'"
)
# Under the official debug compile the swapped step is the stock step bit for bit; its parameters, whose
# gradients the critic's graph sums in another order, stay within this fraction of each array's largest entry
# after the steps (measured: 6.6e-7).
PARAMS_RTOL = 1e-5


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    problem = official_dreamer.source_problem(os.environ.get(official_dreamer.SOURCE_ENV))
    if problem:
        pytest.skip(problem)
    python = os.environ.get(PYTHON_ENV, sys.executable)
    probe = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=300)
    if probe.returncode:
        pytest.skip(f"{python} does not run the official code's environment: {probe.stderr.strip()[-300:]}")
    out = tmp_path_factory.mktemp("official") / "official_agent.json"
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    run = subprocess.run(
        [python, "-m", "tests.interop.official_agent", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(out.read_text())


def _metrics(record, name):
    return record["train"][name]["metrics"]


def test_the_official_code_ran_at_the_pinned_commit(live):
    assert live["versions"]["commit"] == official_dreamer.COMMIT
    for mode in ("debug", "optimised"):
        # Both value heads were multicritic's, and the rest of the agent the official code's.
        assert live[mode]["served"]["swap"] == {"val": "CriticHead", "slowval": "CriticHead"}
        assert live[mode]["value_keys"][:3] == [
            "slowval/head/logits/bias",
            "slowval/head/logits/kernel",
            "slowval/mlp/linear0/bias",
        ]


def test_the_swapped_agent_starts_from_the_stock_agents_parameters_bit_for_bit(live):
    """`initializer="host"`: the official initialisers draw the value heads from the same `nj.seed()` stream, so
    every module created after them draws what it draws in the stock agent too."""
    for mode, names in (("debug", ("swap", "swap-critic")), ("optimised", ("swap",))):
        for name in names:
            initial = live[mode]["initial"][name]
            assert initial["equal"] == initial["total"] == 318, (mode, name, initial["worst"])


def test_under_the_official_debug_compile_the_swapped_train_step_is_the_stock_one(live):
    record = live["debug"]
    stock, swap = _metrics(record, "stock"), _metrics(record, "swap")
    assert len(stock) == len(swap) == record["steps"] == 5
    for step, (want, got) in enumerate(zip(stock, swap)):
        assert sorted(want) == sorted(got)
        assert {k: v for k, v in got.items() if v != want[k]} == {}, step  # every metric, bit for bit
    # Real numbers: the value losses are the critic's, and the agent trained.
    assert [round(m["loss/value"], 4) for m in stock[:3]] == [1.1391, 1.0538, 1.169]
    assert all(m["loss/repval"] > 0 for m in stock) and stock[0]["opt/loss"] != stock[-1]["opt/loss"]
    after = record["after"]["swap"]
    assert after["total"] == 318 and after["equal"] >= 290, after["worst"]
    assert max(after["worst"].values()) <= PARAMS_RTOL, after["worst"]
    # The step ran under the official jax_transfer_guard='disallow': no implicit host round trip in it.
    assert record["train"]["swap"]["transfer_guard"] == "disallow"


def test_with_optimised_xla_one_step_from_the_same_state_agrees_to_rounding(live):
    """XLA fuses the critic's graph and the stock head's differently: the same state gives the same value losses
    to float32 rounding (measured: equal), the total loss to 1e-6; metrics that read the head's mean over the
    dummy config's 255 bins of up to 4.9e8 differ by a rounding of the softmax (the stock head's own mean of a
    uniform distribution reads -0.164 there, not 0)."""
    record = live["optimised"]
    want, got = _metrics(record, "stock")[0], _metrics(record, "swap")[0]
    for key in ("loss/value", "loss/repval", "opt/loss"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)
    assert record["train"]["swap"]["transfer_guard"] == "disallow"


def test_the_critics_own_distribution_differs_by_its_bins_rounding_only(live):
    """`distribution="critic"`: multicritic's two-hot over its own symexp buckets (23 of 255 bit-equal to the
    official bins, the rest within 1.2e-6): the same loss at the first step, then differences of float32
    rounding in the returns (absolute 1e-9 where the stock agent's values are 1e-8)."""
    record = live["debug"]
    stock, mine = _metrics(record, "stock"), _metrics(record, "swap-critic")
    np.testing.assert_allclose(mine[0]["loss/value"], stock[0]["loss/value"], rtol=1e-6)
    for step, (want, got) in enumerate(zip(stock, mine)):
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-6, err_msg=f"step {step}: {key}")


def test_the_agents_own_checkpoints_load_across_the_swap(live):
    """`agent.save()` / `agent.load()`: a stock checkpoint loads into the swapped agent and a swapped one into the
    stock agent, bit for bit; multicritic's importer reads the swapped agent's value heads and exports them
    back unchanged."""
    checkpoints = live["debug"]["checkpoints"]
    assert checkpoints["same_keys"] and checkpoints["same_shapes"]
    for what in ("swap_loads_stock", "stock_loads_swap"):
        assert checkpoints[what]["equal"] == checkpoints[what]["total"] == 318, what
    assert checkpoints["multicritic_reads_swap"]["equal"] == checkpoints["multicritic_reads_swap"]["total"] == 16
