"""RLlib's PyTorch critic, sheeprl's and TorchRL's, from numbers their own code wrote (every backend).

`tests/data/interop/{rllib_torch,sheeprl,torchrl}_goldens.npz` were written by
`tests/data/interop/generate_torch_goldens.py` with the pinned packages
(`tests/interop/upstream.py` builds each upstream critic); the `interop` nox
session also rebuilds them live (`test_upstream_live.py`).
"""

import random

import numpy as np
import pytest

from multicritic import CriticNetwork
from multicritic.interop import rllib, sheeprl, torchrl
from tests.conftest import to_np
from tests.interop.cases import check_all_or_nothing, check_forward, check_loss, check_round_trip, load_npz, prefixed

SIZES = dict(gru_units=24, num_z_categoricals=4, num_z_classes=5)


class Codebase:
    """How one codebase's states enter and leave multicritic, and its slow-critic step."""

    def __init__(self, name, load, export, build, real_values, slow_step, combined=False):
        self.name, self.load, self.export, self.build = name, load, export, build
        self.real_values, self.slow_step, self.combined = real_values, slow_step, combined

    def states(self, golden, slow="slow/"):
        fast, slow = prefixed(golden, "fast/"), prefixed(golden, slow)
        return ({**fast, **slow},) if self.combined else (fast, slow)

    def exported(self, critic, **kwargs):
        out = self.export(critic, **kwargs)
        if self.name == "torchrl":
            out = tuple({k: v for k, v in s.items() if k != torchrl.BINS_KEY} for s in out)
        return out if isinstance(out, tuple) else (out,)


CODEBASES = {
    "rllib_torch": Codebase(
        "rllib_torch",
        rllib.load_rllib_torch,
        rllib.export_rllib_torch,
        rllib.rllib_torch_critic,
        False,
        lambda c: c.update_ema(),
        combined=True,
    ),
    "sheeprl": Codebase(
        "sheeprl",
        sheeprl.load_sheeprl,
        sheeprl.export_sheeprl,
        sheeprl.sheeprl_critic,
        True,
        lambda c: c.update_ema(tau=0.02, step=1),
    ),
    "torchrl": Codebase(
        "torchrl",
        torchrl.load_torchrl,
        torchrl.export_torchrl,
        torchrl.torchrl_critic,
        True,
        lambda c: c.update_ema(tau=0.02),
    ),
}


@pytest.fixture(scope="module", params=sorted(CODEBASES))
def case(request):
    return CODEBASES[request.param], load_npz(f"{request.param}_goldens.npz")


def test_forward_is_upstreams(case):
    codebase, golden = case
    critic = codebase.build(*codebase.states(golden), **SIZES)
    check_forward(
        critic,
        golden["latent"],
        golden["logits"],
        golden["slow_logits"],
        golden["value"],
        golden["slow_value"],
        real=codebase.real_values,
        value_rtol=1e-5,
    )
    _, logits = to_np(critic(golden["h"], golden["z"]))
    np.testing.assert_allclose(logits, golden["logits"], rtol=1e-5, atol=1e-5)


def test_loss_and_gradient_are_upstreams(case):
    codebase, golden = case
    critic = codebase.build(*codebase.states(golden), **SIZES)
    check_loss(
        critic,
        golden["logits"],
        golden["slow_logits"],
        golden["target"],
        golden["weights"],
        golden["loss"],
        golden["grad_logits"],
    )


def test_slow_update_is_upstreams(case):
    codebase, golden = case
    critic = codebase.build(*codebase.states(golden), **SIZES)
    codebase.slow_step(critic)
    want = codebase.states(golden, "slow_after/")
    got = codebase.exported(critic)
    keys = set(prefixed(golden, "slow_after/"))
    for g, w in zip(got, want):
        for key in keys & set(g) & set(w):
            np.testing.assert_allclose(g[key], w[key], rtol=1e-6, atol=1e-7, err_msg=key)


def test_round_trip_is_bit_identical(case):
    codebase, golden = case
    states = codebase.states(golden)
    critic = codebase.build(*states, **SIZES)
    for got, want in zip(codebase.exported(critic), states):
        check_round_trip(got, want)
    again = CriticNetwork.from_config(critic.get_config())
    codebase.load(again, *codebase.exported(critic))
    for got, want in zip(codebase.exported(again), states):
        check_round_trip(got, want)


def test_bad_states_change_nothing(case):
    codebase, golden = case
    states = codebase.states(golden)
    critic = codebase.build(*states, **SIZES)
    first = states[0]
    key = sorted(first)[-1]
    check_all_or_nothing(critic, lambda s: codebase.load(critic, s, *states[1:]), first, key)
    other = "z_h" if critic.input_layout == "h_z" else "h_z"
    wrong = CriticNetwork.from_config({**critic.get_config(), "input_layout": other})
    with pytest.raises(ValueError, match=f"input_layout='{other}'"):
        codebase.load(wrong, *states)


def test_wrapped_and_loss_module_keys_load(case):
    codebase, golden = case
    states = codebase.states(golden)
    critic = codebase.build(*states, **SIZES)
    wrapped = tuple({"_orig_mod." + k: v for k, v in s.items()} for s in states)  # torch.compile's wrapper
    again = CriticNetwork.from_config(critic.get_config())
    codebase.load(again, *wrapped)
    for got, want in zip(codebase.exported(again), states):
        check_round_trip(got, want)
    if codebase.name == "torchrl":  # DreamerV3ValueLoss.state_dict(): both halves under prefixes
        loss_state = {
            **{"value_model_params." + k: v for k, v in states[0].items()},
            **{"target_value_model_params." + k: v for k, v in states[1].items()},
        }
        third = CriticNetwork.from_config(critic.get_config())
        torchrl.load_torchrl(third, loss_state)
        for got, want in zip(codebase.exported(third), states):
            check_round_trip(got, want)


def test_builders_leave_the_hosts_python_random_stream_alone(case):
    # Keras seeds unseeded initializers from Python's `random`: a builder must not shift a host's stream.
    codebase, golden = case
    random.seed(5)
    state = random.getstate()
    codebase.build(*codebase.states(golden), **SIZES)
    assert random.getstate() == state


def test_torchrl_bins_are_checked():
    golden = load_npz("torchrl_goldens.npz")
    fast, slow = CODEBASES["torchrl"].states(golden)
    critic = torchrl.torchrl_critic({**fast, torchrl.BINS_KEY: golden["bins"]}, slow, **SIZES)
    with pytest.raises(
        ValueError,
        match=r"module.2.module.bins: got \d+ bin\(s\) that differ from this critic.s "
        r"255 symexp bins",
    ):
        torchrl.load_torchrl(critic, {**fast, torchrl.BINS_KEY: np.linspace(-20, 20, 255)}, slow)
