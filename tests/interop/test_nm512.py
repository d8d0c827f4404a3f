"""NM512/dreamerv3-torch's critic, from numbers its code wrote (`tests/data/interop/nm512/`)."""

import numpy as np
import pytest

from multicritic import CriticNetwork, critic_loss
from multicritic.interop import nm512
from tests.conftest import to_np
from tests.interop.cases import check_all_or_nothing, check_forward, check_loss, check_round_trip, load_npz, prefixed


@pytest.fixture(scope="module")
def golden():
    return load_npz("nm512", "nm512_goldens.npz")


def make(golden, slow="slow_value/"):
    return nm512.nm512_critic(
        prefixed(golden, "value/"), prefixed(golden, slow), gru_units=24, num_z_categoricals=4, num_z_classes=5
    )


def test_forward_is_nm512s(golden):
    critic = make(golden)
    assert critic.input_layout == "z_h"
    check_forward(
        critic, golden["feat"], golden["logits"], golden["slow_logits"], golden["value"], golden["slow_value"]
    )
    _, logits = to_np(critic(golden["deter"], golden["stoch"]))
    np.testing.assert_allclose(logits, golden["logits"], rtol=1e-5, atol=1e-5)


def test_loss_and_gradient_are_nm512s(golden):
    critic = make(golden)
    check_loss(
        critic,
        golden["logits"],
        golden["slow_logits"],
        golden["target"][..., None],
        golden["weights"][..., None],
        golden["loss"],
        golden["grad_logits"],
    )


def test_slow_update_then_loss_is_nm512s_train_step(golden):
    critic = make(golden)
    critic.update_ema(tau=0.02)  # NM512 mixes before each update's loss, from the first one on
    _, slow = nm512.export_nm512(critic)
    for key, want in prefixed(golden, "slow_after/").items():
        np.testing.assert_allclose(slow[key], want, rtol=1e-6, atol=1e-7, err_msg=key)
    _, slow_logits = critic.on_latent(golden["feat"], use_ema=True)
    total = critic_loss(golden["logits"], golden["target"], None, golden["weights"], ema_logits=slow_logits)["total"]
    np.testing.assert_allclose(to_np(total), golden["train_call_loss"], rtol=1e-5)


def test_round_trip_is_bit_identical(golden):
    critic = make(golden)
    fast, slow = nm512.export_nm512(critic)
    check_round_trip(fast, prefixed(golden, "value/"))
    check_round_trip(slow, prefixed(golden, "slow_value/"))
    again = CriticNetwork.from_config(critic.get_config())
    nm512.load_nm512(again, fast, slow)
    for a, b in zip(nm512.export_nm512(again), (fast, slow)):
        check_round_trip(a, b)


def test_bad_states_change_nothing(golden):
    critic = make(golden)
    state = prefixed(golden, "value/")
    check_all_or_nothing(critic, lambda s: nm512.load_nm512(critic, s), state, "layers.Value_norm1.bias")
    check_all_or_nothing(
        critic, lambda s: nm512.load_nm512(critic, state, s), prefixed(golden, "slow_value/"), "mean_layer.weight"
    )
    rllib_like = CriticNetwork(
        model_size=None, num_dense_layers=2, dense_hidden_units=32, gru_units=24, num_z_categoricals=4, num_z_classes=5
    )
    with pytest.raises(ValueError, match="input_layout='h_z'; NM512's critic has input_layout='z_h'"):
        nm512.load_nm512(rllib_like, state)
