"""The hosts' one interface, over `multicritic.interop.HOSTS`: every registered host's adapter round trips a
critic with distinct fast and EMA weights (`load(export)`), builds one of the state's size, names each
variable in its layout, refuses a critic of another architecture before anything changes, and (PyTorch)
gives modules whose state dict is the export. A new host is tested by registering it."""

import numpy as np
import pytest

from multicritic import CriticNetwork
from multicritic.interop import HOSTS
from multicritic.interop.adapter import HostAdapter
from tests.conftest import BACKEND, random_inputs, to_np

SIZES = dict(gru_units=8, num_z_categoricals=3, num_z_classes=4)


def host_critic(adapter, seed=0):
    critic = CriticNetwork(model_size=None, num_dense_layers=2, dense_hidden_units=16, **SIZES, **adapter.options)
    rng = np.random.default_rng(seed)
    for var in critic.weights:  # distinct fast and EMA weights, no zero head
        var.assign(rng.normal(0.0, 0.2, tuple(var.shape)).astype("float32"))
    return critic


def assert_same_weights(a, b):
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_array_equal(to_np(x), to_np(y))


@pytest.mark.parametrize("name", HOSTS)
def test_host_adapter_round_trips_and_builds(name):
    adapter = HOSTS[name]
    assert isinstance(adapter, HostAdapter) and adapter.name == name
    critic = host_critic(adapter)
    state = adapter.export(critic)
    fresh = host_critic(adapter, seed=1)
    adapter.load(fresh, state)
    assert_same_weights(fresh, critic)
    h, z = random_inputs(critic, 5)
    for use_ema in (False, True):
        for got, want in zip(fresh(h, z, use_ema=use_ema), critic(h, z, use_ema=use_ema)):
            np.testing.assert_array_equal(to_np(got), to_np(want))
    if adapter.build is not None:
        assert_same_weights(adapter.build(state, **SIZES), critic)


@pytest.mark.parametrize("name", HOSTS)
def test_host_layout_names_every_variable(name):
    adapter = HOSTS[name]
    if adapter.key is None:
        pytest.skip(f"{name}: a list of arrays, no names")
    critic = host_critic(adapter)
    flat = adapter.export(critic)
    keys = set()
    for part in flat if isinstance(flat, tuple) else (flat,):
        keys |= set(part)
    for kind in ("kernel", "scale"):
        for layer in range(critic.num_dense_layers):
            assert any(k.endswith(adapter.key(kind, layer)) for k in keys), (kind, layer)
    assert any(k.endswith(adapter.key("head_kernel", critic.num_dense_layers)) for k in keys)


@pytest.mark.parametrize("name", HOSTS)
def test_host_refuses_another_architecture_before_anything_changes(name):
    adapter = HOSTS[name]
    other = {"norm": "rms" if adapter.options["norm"] == "layer" else "layer"}
    critic = CriticNetwork(
        model_size=None, num_dense_layers=2, dense_hidden_units=16, **SIZES, **{**adapter.options, **other}
    )
    before = [to_np(v) for v in critic.weights]
    with pytest.raises(ValueError, match="critic: got norm="):
        adapter.load(critic, adapter.export(host_critic(adapter)))
    for b, v in zip(before, critic.weights):
        np.testing.assert_array_equal(b, to_np(v))


@pytest.mark.parametrize("name", HOSTS)
def test_host_modules_hold_the_export(name):
    adapter = HOSTS[name]
    if adapter.modules is None or BACKEND != "torch":
        pytest.skip("PyTorch module views")
    critic = host_critic(adapter)
    modules = adapter.modules(critic)
    modules = modules if isinstance(modules, tuple) else (modules,)
    state = adapter.export(critic)
    state = state if isinstance(state, tuple) else (state,)
    for module, want in zip(modules, state):
        got = {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}
        assert set(got) == set(want)
        for k in want:
            np.testing.assert_array_equal(got[k], np.asarray(want[k]))
