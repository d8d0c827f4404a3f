"""Resume through the swap: sheeprl's own `checkpoint.resume_from` with multicritic as critic and target critic.

sheeprl's DreamerV3 runs through its CLI entry (`tests/interop/sheeprl_resume.py`, a process of its own) with
and without the swap, checkpointing midway and at the end, and resumes from each midway checkpoint with and
without it. sheeprl's own resume is not the uninterrupted run (it restores weights, optimizers, buffer and
counters but not the random generators or the environments: measured, its critic ends up to 0.6 of the
resumed segment's weight change away from the uninterrupted run's, without any swap), so a resumed run is
compared with the run resumed from the same checkpoint without the swap (like with like), and the checkpoints
and restored states exactly.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.interop.test_upstream_live import _require

pytestmark = pytest.mark.interop
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Two implementations of one float32 computation (sheeprl's nn.Linear / LayerNorm, multicritic's Keras ops on
# the same tensors) over a few Adam steps: the example's bound on their weight changes (1e-4 of the largest
# change). Measured on the test machine: 0 (the same kernels in the same order). A wrong optimizer state (a
# moment applied to the wrong elements, a wrong parameter order) moves them by 0.1 to 1.5 of the change.
RTOL = 1e-4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    _require("sheeprl")
    import torch

    out = tmp_path_factory.mktemp("sheeprl") / "runs.pt"
    env = dict(os.environ, KERAS_BACKEND="torch", PYTHONPATH=ROOT)
    run = subprocess.run(
        [sys.executable, "-m", "tests.interop.sheeprl_resume", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return torch.load(out, map_location="cpu", weights_only=False)


def _np(state):
    return {k: np.asarray(v.detach().cpu().numpy()) for k, v in state.items()}


def _assert_states_equal(got, want, what):
    """Same keys in the same order, same shapes, bit-identical values."""
    got, want = _np(got), _np(want)
    assert list(got) == list(want), what
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{what}: {key}")


def _assert_optimizer_equal(got, want, what):
    assert got["param_groups"] == want["param_groups"], what
    assert sorted(got["state"]) == sorted(want["state"]), what
    for index, slots in want["state"].items():
        assert sorted(got["state"][index]) == sorted(slots), what
        for name, value in slots.items():
            np.testing.assert_array_equal(
                got["state"][index][name].numpy(), value.numpy(), err_msg=f"{what}: state[{index}][{name}]"
            )


def _assert_close_runs(got, want, start, what):
    """The end of two runs from one checkpoint `start`: weights to RTOL of the largest change since `start`,
    Adam moments to RTOL of their largest entry, step counts and layout exactly."""
    for part in ("critic", "target_critic"):
        g, w, s = _np(got[part]), _np(want[part]), _np(start[part])
        assert list(g) == list(w), what
        change = max(float(np.abs(w[k] - s[k]).max()) for k in w)
        assert change > 0, f"{what}: {part} did not train"
        for key in w:
            np.testing.assert_allclose(g[key], w[key], rtol=0, atol=RTOL * change, err_msg=f"{what}: {part} {key}")
    g, w = got["critic_optimizer"], want["critic_optimizer"]
    assert g["param_groups"] == w["param_groups"] and sorted(g["state"]) == sorted(w["state"]), what
    for name in ("exp_avg", "exp_avg_sq"):
        scale = max(float(s[name].abs().max()) for s in w["state"].values())
        for index, slots in w["state"].items():
            np.testing.assert_allclose(
                g["state"][index][name].numpy(),
                slots[name].numpy(),
                rtol=0,
                atol=RTOL * scale,
                err_msg=f"{what}: critic_optimizer {index} {name}",
            )
            assert float(g["state"][index]["step"]) == float(slots["step"]), what
    assert got["per_rank_gradient_steps"] == want["per_rank_gradient_steps"], what


def test_a_swapped_run_checkpoints_in_sheeprls_layout(runs):
    half = min(runs["stock"]["checkpoints"])
    stock, swap = runs["stock"]["checkpoints"][half], runs["swap"]["checkpoints"][half]
    for part in ("critic", "target_critic"):
        assert list(swap[part]) == list(stock[part])
        assert [tuple(v.shape) for v in swap[part].values()] == [tuple(v.shape) for v in stock[part].values()]
    g, w = swap["critic_optimizer"], stock["critic_optimizer"]
    assert g["param_groups"] == w["param_groups"]
    for index, slots in w["state"].items():
        for name, value in slots.items():
            assert tuple(g["state"][index][name].shape) == tuple(value.shape), (index, name)
            # Contiguous as sheeprl's own: a state laid out otherwise is misread by sheeprl's fused Adam.
            assert g["state"][index][name].stride() == value.stride(), (index, name)
    assert swap["per_rank_gradient_steps"] == stock["per_rank_gradient_steps"] > 0


def test_uninterrupted_runs_with_and_without_the_swap_agree(runs):
    """(a): the swapped run, midway and at the end, against sheeprl's own."""
    stock, swap = runs["stock"]["checkpoints"], runs["swap"]["checkpoints"]
    assert sorted(stock) == sorted(swap) and len(stock) == 2
    first, last = sorted(stock)
    _assert_close_runs(swap[last], stock[last], stock[first], "uninterrupted")


@pytest.mark.parametrize(
    "resumed, checkpoint",
    [("swap->swap", "swap"), ("stock->swap", "stock"), ("swap->stock", "swap"), ("stock->stock", "stock")],
)
def test_a_resumed_run_starts_from_the_checkpoint_exactly(runs, resumed, checkpoint):
    """(b), (c), (d): every checkpoint loads (sheeprl's strict `load_state_dict`, with or without the swap), and
    the critic, target critic and critic optimizer the resumed run starts from are the checkpoint's, bit for
    bit."""
    record = runs[resumed]
    saved = runs[checkpoint]["checkpoints"][min(runs[checkpoint]["checkpoints"])]
    for part in ("critic", "target_critic"):
        _assert_states_equal(record["loaded"][part], saved[part], f"{resumed}: {part} after build_agent")
    _assert_states_equal(record["first_train"]["critic"], saved["critic"], f"{resumed}: critic at the first train")
    _assert_optimizer_equal(
        record["first_train"]["critic_optimizer"],
        saved["critic_optimizer"],
        f"{resumed}: critic optimizer at the first train",
    )


@pytest.mark.parametrize("resumed, reference", [("swap->swap", "swap->stock"), ("stock->swap", "stock->stock")])
def test_a_resumed_run_with_the_swap_continues_as_sheeprls_own(runs, resumed, reference):
    """(b) a swapped checkpoint resumed with the swap, (c) sheeprl's own resumed with it: the end of the run
    against the run resumed from the same checkpoint without the swap."""
    start = runs[reference.split("->")[0]]["checkpoints"]
    start = start[min(start)]
    got, want = runs[resumed]["checkpoints"], runs[reference]["checkpoints"]
    assert sorted(got) == sorted(want) == [max(runs["stock"]["checkpoints"])]
    _assert_close_runs(got[max(got)], want[max(want)], start, f"{resumed} vs {reference}")


def test_sheeprls_own_resume_is_measured(runs):
    """Not a requirement on sheeprl: if its resume ever equals the uninterrupted run, the swapped resume must
    too (to the same bound)."""
    last = max(runs["stock"]["checkpoints"])
    own, uninterrupted = runs["stock->stock"]["checkpoints"][last], runs["stock"]["checkpoints"][last]
    same = all(np.array_equal(own["critic"][k].numpy(), uninterrupted["critic"][k].numpy()) for k in own["critic"])
    if same:
        first = min(runs["swap"]["checkpoints"])
        _assert_close_runs(
            runs["swap->swap"]["checkpoints"][last],
            runs["swap"]["checkpoints"][last],
            runs["swap"]["checkpoints"][first],
            "swap->swap vs swap",
        )
