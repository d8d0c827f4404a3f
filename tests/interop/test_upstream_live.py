"""RLlib's PyTorch critic, sheeprl's and TorchRL's, run live (the `interop` nox session installs them, pinned).

Each upstream critic is rebuilt with its own code (`tests/interop/upstream.py`): the committed goldens must
still be what it computes, our critic must reproduce it from its weights, our exports must load into the real
module (strict `load_state_dict`) and run there as here; and sheeprl's own DreamerV3 training runs with
multicritic as critic and target critic (`examples/sheeprl_critic.py`). Without the packages these tests skip,
except in the `interop` session (`MULTICRITIC_REQUIRE_UPSTREAM=1`), where a missing package is a failure.
"""

import importlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import BACKEND, to_np
from tests.interop import test_upstream_goldens as goldens
from tests.interop.cases import load_npz

pytestmark = pytest.mark.interop
PACKAGES = {"rllib_torch": "ray.rllib.algorithms.dreamerv3.torch", "sheeprl": "sheeprl", "torchrl": "torchrl"}


def _require(name):
    if BACKEND != "torch":
        pytest.skip("the upstream critics are PyTorch modules")
    try:
        importlib.import_module(PACKAGES[name])
    except ImportError as err:
        if os.environ.get("MULTICRITIC_REQUIRE_UPSTREAM") == "1":
            raise
        pytest.skip(f"{PACKAGES[name]} not installed ({err})")


@pytest.fixture(scope="module", params=sorted(PACKAGES))
def live(request):
    name = request.param
    _require(name)
    from tests.interop import upstream

    modules = {}
    case = getattr(upstream, f"make_{name}_case")(modules)
    return goldens.CODEBASES[name], case, modules, name


def test_goldens_are_what_upstream_computes(live):
    _, case, _, name = live
    committed = load_npz(f"{name}_goldens.npz")
    assert sorted(k for k in case) == sorted(k for k in committed if k != "versions")
    for key, value in case.items():
        if key != "meta":
            # Float32 sums of the upstream code on another CPU type (another SIMD width, another order):
            # measured up to 1.4e-6 of an array's largest entry between two machines; a change of the math
            # moves them by far more.
            scale = float(np.abs(committed[key]).max())
            np.testing.assert_allclose(value, committed[key], rtol=1e-5, atol=1e-5 * scale, err_msg=key)


def test_live_forward_loss_slow_update_and_round_trip(live):
    codebase, case, _, _ = live
    for check in (
        goldens.test_forward_is_upstreams,
        goldens.test_loss_and_gradient_are_upstreams,
        goldens.test_slow_update_is_upstreams,
        goldens.test_round_trip_is_bit_identical,
    ):
        check((codebase, case))


def test_exports_run_in_the_upstream_module(live):
    codebase, case, modules, _ = live
    critic = codebase.build(*codebase.states(case), **goldens.SIZES)
    rng = np.random.default_rng(11)
    for var in critic.weights:  # weights the upstream module has never seen
        var.assign(to_np(var.value) + rng.normal(0.0, 0.05, var.shape).astype("float32"))
    exported = codebase.export(critic)
    fast, slow = (
        exported
        if isinstance(exported, tuple)
        else (
            {k: v for k, v in exported.items() if "_ema." not in k},
            {k: v for k, v in exported.items() if "_ema." in k},
        )
    )
    modules["load"](fast, slow)
    for use_ema in (False, True):
        _, ours = to_np(critic.on_latent(case["latent"], use_ema=use_ema))
        np.testing.assert_allclose(modules["logits"](use_ema), ours, rtol=1e-5, atol=1e-5)


def test_sheeprl_distribution_is_sheeprls_for_the_2023_critic():
    _require("sheeprl")
    import torch
    from sheeprl.utils.distribution import TwoHotEncodingDistribution

    from multicritic.interop import sheeprl
    from tests.interop.test_sheeprl_distribution import critic_with

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 5, 255, generator=generator) * 3
    x = torch.randn(4, 5, 1, generator=generator) * torch.tensor([1.0, 1e2, 1e4, 1e6])[:, None, None]
    theirs = TwoHotEncodingDistribution(logits, dims=1)
    ours = sheeprl.sheeprl_distribution(critic_with("uniform_symlog"))(logits, dims=1)
    np.testing.assert_allclose(to_np(ours.mean), to_np(theirs.mean), rtol=1e-5)
    np.testing.assert_allclose(to_np(ours.log_prob(x)), to_np(theirs.log_prob(x)), rtol=1e-5, atol=1e-4)


def test_sheeprl_trains_with_multicritic_as_critic_and_target():
    # A process of its own: TorchRL registers Hydra configs (logger/tensorboard) that break sheeprl's.
    _require("sheeprl")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, KERAS_BACKEND="torch", PYTHONPATH=root)
    run = subprocess.run(
        [sys.executable, os.path.join(root, "examples", "sheeprl_critic.py")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [line.split() for line in run.stdout.splitlines() if re.match(r"^\s*\d+\s+-?\d", line)]
    theirs, ours = np.array([float(r[1]) for r in rows]), np.array([float(r[2]) for r in rows])
    assert len(rows) >= 8
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    drift = float(re.search(r"weight changes to (\S+)", run.stdout).group(1))
    assert drift <= 1e-4


def test_rllib_learner_updates_with_multicritic_as_critic():
    _require("rllib_torch")
    from tests.interop import upstream

    theirs, their_state = upstream.rllib_learner_updates(False)
    ours, our_state = upstream.rllib_learner_updates(True)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert sorted(our_state) == sorted(their_state)
    for key, value in their_state.items():
        np.testing.assert_allclose(our_state[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
