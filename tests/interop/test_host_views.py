"""The PyTorch hosts' module views in their own checkpoint layout (`sheeprl_modules`, `nm512_modules`,
`torchrl_modules`, `rllib_torch_module`): state dicts, loads, optimizer steps and optimizer state as the
host's own critic's. No upstream package needed; PyTorch backend only."""

import copy

import numpy as np
import pytest

from multicritic import CriticNetwork
from multicritic.interop import nm512, rllib, sheeprl, torchrl
from tests.conftest import BACKEND, to_np

pytestmark = pytest.mark.skipif(BACKEND != "torch", reason="torch.nn.Module views exist on the PyTorch backend only")

H, C, K = 24, 4, 5


def _pair_views(make):
    def views(critic):
        module = make(critic)
        state = module.state_dict()
        fast = {k: v for k, v in state.items() if "_ema." not in k}
        return module, fast

    return views


# name: (options, views(critic) -> modules, export(critic) -> state dicts in the same order)
HOSTS = {
    "sheeprl": (sheeprl.CRITIC_OPTIONS, sheeprl.sheeprl_modules, sheeprl.export_sheeprl),
    "nm512": (nm512.CRITIC_OPTIONS, nm512.nm512_modules, nm512.export_nm512),
    "torchrl": (torchrl.CRITIC_OPTIONS, torchrl.torchrl_modules, torchrl.export_torchrl),
    "rllib": (rllib.CRITIC_OPTIONS, lambda c: (rllib.rllib_torch_module(c),), lambda c: (rllib.export_rllib_torch(c),)),
}


def make_critic(options, seed=7):
    critic = CriticNetwork(
        model_size=None,
        num_dense_layers=2,
        dense_hidden_units=32,
        gru_units=H,
        num_z_categoricals=C,
        num_z_classes=K,
        **options,
    )
    critic(np.zeros((1, H), "float32"), np.zeros((1, C, K), "float32"))
    rng = np.random.default_rng(seed)
    for var in critic.weights:  # the zero head and unit norms would hide mapping errors
        var.assign(to_np(var.value) + rng.normal(0.0, 0.1, var.shape).astype("float32"))
    return critic


def _torch_state(state):
    import torch

    return {k: torch.as_tensor(np.array(v)) for k, v in state.items()}


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_state_dicts_are_the_exports(host):
    options, views, export = HOSTS[host]
    critic = make_critic(options)
    for module, want in zip(views(critic), export(critic)):
        got = module.state_dict()
        assert list(got) == list(want)
        for key, value in want.items():
            assert tuple(got[key].shape) == value.shape, key
            np.testing.assert_array_equal(to_np(got[key]), value, err_msg=key)


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_loading_an_export_makes_the_critic_the_other(host):
    options, views, export = HOSTS[host]
    critic, other = make_critic(options, seed=1), make_critic(options, seed=2)
    for module, state in zip(views(critic), export(other)):
        module.load_state_dict(_torch_state(state))  # strict
    for a, b in zip(critic.weights, other.weights):
        np.testing.assert_array_equal(to_np(a.value), to_np(b.value), err_msg=a.path)


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_an_optimizer_step_through_the_view_changes_the_critic(host):
    import torch

    options, views, _ = HOSTS[host]
    critic = make_critic(options)
    module = views(critic)[0]
    before = [np.array(to_np(v.value)) for v in critic.fast_weights]
    ema_before = [np.array(to_np(v.value)) for v in critic.ema_weights]
    params = [p for p in module.parameters() if p.requires_grad]
    assert len(params) == len(critic.fast_weights)
    optimizer = torch.optim.SGD(params, lr=0.1)
    latent = torch.randn(6, H + C * K)
    out = (
        module(latent[:, :H], latent[:, H:].reshape(6, C, K), return_logits=True)[1]
        if host == "rllib"
        else module(latent)
    )
    out.logsumexp(-1).mean().backward()
    grads = {id(p): p.grad.clone() for p in params}
    host_params = {id(p): p.detach().clone() for p in params}
    optimizer.step()
    for var, b in zip(critic.fast_weights, before):
        assert not np.array_equal(to_np(var.value), b), var.path
    for p in params:  # SGD on the host's tensors: the critic's variables moved by exactly that step
        np.testing.assert_allclose(to_np(p), to_np(host_params[id(p)] - 0.1 * grads[id(p)]), rtol=1e-6, atol=1e-7)
    for var, b in zip(critic.ema_weights, ema_before):
        np.testing.assert_array_equal(to_np(var.value), b)


@pytest.mark.parametrize("host", sorted(HOSTS))
@pytest.mark.parametrize("fused", [False, True])
def test_optimizer_state_is_the_hosts(host, fused):
    """torch.optim state over the view: the host's shapes and layout, in the host's parameter order; a host's
    own (contiguous) state loads and steps as the host's would, also through a fused Adam (sheeprl's)."""
    import torch

    options, views, export = HOSTS[host]
    critic = make_critic(options)
    module = views(critic)[0]
    fast_state = {k: v for k, v in export(critic)[0].items() if "_ema." not in k and k != torchrl.BINS_KEY}
    # The host's own module: plain contiguous parameters of the exported values, in the exported order.
    host = [torch.nn.Parameter(torch.as_tensor(v.copy())) for v in fast_state.values()]
    ours = [p for p in module.parameters() if p.requires_grad]
    assert [tuple(p.shape) for p in ours] == [tuple(p.shape) for p in host]
    opt_ours, opt_host = (torch.optim.Adam(ps, lr=1e-2, fused=fused) for ps in (ours, host))
    rng = np.random.default_rng(3)
    for step in range(2):
        grads = [torch.as_tensor(rng.normal(size=p.shape).astype("float32")) for p in host]
        for ps, opt in ((ours, opt_ours), (host, opt_host)):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            opt.step()
        if step == 0:  # resume both from the host's state, as a host checkpoint does
            saved = copy.deepcopy(opt_host.state_dict())  # as read from a checkpoint: tensors of its own
            opt_ours = torch.optim.Adam(ours, lr=1e-2, fused=fused)
            opt_ours.load_state_dict(saved)
    ours_state, host_state = opt_ours.state_dict(), opt_host.state_dict()
    assert ours_state["param_groups"] == host_state["param_groups"]
    for index, slots in host_state["state"].items():
        for name, value in slots.items():
            got = ours_state["state"][index][name]
            assert tuple(got.shape) == tuple(value.shape) and got.stride() == value.stride(), (index, name)
            np.testing.assert_allclose(to_np(got), to_np(value), rtol=1e-6, atol=1e-8, err_msg=f"{index} {name}")
    for p, q in zip(ours, host):
        np.testing.assert_allclose(to_np(p), to_np(q), rtol=1e-6, atol=1e-7)


def test_torchrl_bins_are_a_buffer_the_critic_fixes():

    critic = make_critic(torchrl.CRITIC_OPTIONS)
    value_model, target_model = torchrl.torchrl_modules(critic)
    assert torchrl.BINS_KEY in dict(value_model.named_buffers())
    assert torchrl.BINS_KEY not in dict(value_model.named_parameters())
    state = _torch_state(torchrl.export_torchrl(critic)[0])
    before = [np.array(to_np(v.value)) for v in critic.weights]
    bad = {
        **{k: v + 1.0 for k, v in state.items() if k != torchrl.BINS_KEY},
        torchrl.BINS_KEY: state[torchrl.BINS_KEY] * 1.01,
    }
    with pytest.raises(ValueError, match="module.2.module.bins.*differ from this critic's"):
        value_model.load_state_dict(bad)
    for var, b in zip(critic.weights, before):  # all or nothing
        np.testing.assert_array_equal(to_np(var.value), b)
    without_bins = {k: v for k, v in state.items() if k != torchrl.BINS_KEY}
    with pytest.raises(ValueError, match="missing"):
        value_model.load_state_dict(without_bins)
    value_model.load_state_dict(without_bins, strict=False)


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_views_refuse_an_ensemble_and_another_architecture(host):
    options, views, _ = HOSTS[host]
    ensemble = CriticNetwork(model_size="nano", ensemble_size=2, **options)
    ensemble(
        np.zeros((1, ensemble.gru_units), "float32"),
        np.zeros((1, ensemble.num_z_categoricals, ensemble.num_z_classes), "float32"),
    )
    with pytest.raises(ValueError, match="critic: got an ensemble of 2"):
        views(ensemble)
    other = {**options, "norm_epsilon": 0.5}
    critic = CriticNetwork(model_size="nano", **other)
    critic(
        np.zeros((1, critic.gru_units), "float32"),
        np.zeros((1, critic.num_z_categoricals, critic.num_z_classes), "float32"),
    )
    with pytest.raises(ValueError, match="critic: got norm_epsilon=0.5"):
        views(critic)


RECIPE_2024 = dict(input_layout="z_h", bin_scheme="symexp", norm="rms", norm_epsilon=1e-4, use_bias=True)


def test_sheeprl_views_in_the_critics_own_layout_hold_any_options():
    import torch

    critic, other = make_critic(RECIPE_2024, seed=1), make_critic(RECIPE_2024, seed=2)
    fast, ema = sheeprl.sheeprl_modules(critic, layout="multicritic")
    assert [n for n, _ in fast.named_parameters()] == [n for n, _ in ema.named_parameters()] == critic.view_names()
    assert all(p.requires_grad for p in fast.parameters()) and not any(p.requires_grad for p in ema.parameters())
    for mine, theirs in zip((fast, ema), sheeprl.sheeprl_modules(other, layout="multicritic")):
        mine.load_state_dict(theirs.state_dict())  # a resumed sheeprl checkpoint holds these keys
    for a, b in zip(critic.weights, other.weights):
        np.testing.assert_array_equal(to_np(a.value), to_np(b.value), err_msg=a.path)
    before = [to_np(w.value).copy() for w in critic.ema_weights]
    with torch.no_grad():  # sheeprl's target update, over the zipped parameters
        for cp, tcp in zip(fast.parameters(), ema.parameters()):
            tcp.data.copy_(0.02 * cp.data + 0.98 * tcp.data)
    for old, fast_w, ema_w in zip(before, critic.fast_weights, critic.ema_weights):
        np.testing.assert_allclose(to_np(ema_w.value), 0.02 * to_np(fast_w.value) + 0.98 * old, rtol=1e-6, atol=1e-7)


def test_sheeprl_views_refuse_other_layouts_and_name_the_way_out():
    critic = make_critic(RECIPE_2024)
    with pytest.raises(ValueError, match=r"norm='rms'.*layout='multicritic'"):
        sheeprl.sheeprl_modules(critic)
    with pytest.raises(ValueError, match=r"layout: got 'own', expected one of \['sheeprl', 'multicritic'\]"):
        sheeprl.sheeprl_modules(critic, layout="own")
