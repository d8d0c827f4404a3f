"""NM512/r2dreamer's critic, from numbers its code wrote (`tests/data/interop/r2dreamer/`)."""

import json
import os

import numpy as np
import pytest

from multicritic.interop import nm512, r2dreamer
from multicritic.math.returns import replay_lambda_returns
from tests.conftest import to_np
from tests.interop.cases import DATA, check_round_trip, prefixed
from tests.interop.nm512_cases import SIZES, GoldenChecks


@pytest.fixture(scope="module")
def manifest():
    with open(os.path.join(DATA, "r2dreamer", "r2dreamer_goldens_manifest.json")) as f:
        return json.load(f)


def agent_state(golden, manifest):
    """The agent's `state_dict()` as r2dreamer names it (the keys its `Dreamer` wrote): the critic and its slow
    copy with their frozen twins, and the rest of the agent (here zeros: not the critic's)."""
    sources = {
        "value.": "value/",
        "_frozen_value.": "value/",
        "_slow_value.": "slow_value/",
        "_frozen_slow_value.": "slow_value/",
    }
    state = {}
    for key in manifest["agent_state_dict_keys"]:
        prefix = next((p for p in sources if key.startswith(p)), None)
        state[key] = golden[sources[prefix] + key[len(prefix) :]] if prefix else np.zeros(1, "float32")
    return state


class TestR2dreamer(GoldenChecks):
    module = r2dreamer
    loss_after_update = "loss_after_slow_update"  # `Dreamer.update` mixes the slow critic, then the loss
    refusal = nm512.CRITIC_OPTIONS, "critic: got norm='layer'; r2dreamer's critic has norm='rms'"  # dreamerv3-torch

    def test_the_goldens_are_r2dreamers_defaults(self, golden, manifest):
        """What `CRITIC_OPTIONS` and the docs assume, as r2dreamer's own config and init gave it."""
        used = manifest["config_used"]
        assert used["critic"]["layers"] == 3 and used["critic"]["dist"] == {"name": "symexp_twohot", "bin_num": 255}
        assert used["critic"]["outscale"] == 0.0 and used["critic"]["act"] == "SiLU"
        schedule = (used["slow_target_update"], used["slow_target_fraction"], used["loss_scales"]["repval"])
        assert schedule == (1, 0.02, 0.3)
        assert manifest["init"] == {
            "head_all_zero": True,
            "biases_all_zero": True,
            "norm_scales_all_one": True,
            "slow_requires_grad": False,
        }
        assert manifest["feat_concat_order_stoch_then_deter"]
        critic = self.make(golden)
        assert critic.num_dense_layers == 3 and critic.use_bias

    def test_replay_returns_are_r2dreamers(self, golden):
        """`repval`'s targets: r2dreamer's batch-major `_lambda_return`, ours time-major."""
        args = [golden[f"replay_{k}"].T for k in ("rewards", "is_last", "is_terminal", "boot")]
        got = to_np(replay_lambda_returns(*args, discount=1 - 1 / 333, lambda_=0.95))
        np.testing.assert_allclose(got.T, golden["replay_returns"], rtol=1e-5, atol=1e-5)

    def test_reads_the_agents_state_dict(self, golden, manifest):
        """The whole `Dreamer.state_dict()` (frozen copies and the rest of the agent beside the critic's)."""
        from_agent = r2dreamer.r2dreamer_critic(agent_state(golden, manifest), **SIZES)
        for got, prefix in zip(r2dreamer.export_r2dreamer(from_agent), ("value/", "slow_value/")):
            check_round_trip(got, prefixed(golden, prefix))
