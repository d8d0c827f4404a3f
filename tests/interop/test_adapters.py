"""The one-line adapters a host codebase uses: flat latents with leading dims, the input layout, EMA
conventions, the loss on a host's shapes, and (PyTorch) fast / EMA module views."""

import os

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, critic_loss, expected_value
from tests import numpy_reference
from tests.conftest import BACKEND, compiled, to_np

T, B, H, C, K = 3, 4, 24, 4, 5


def small_critic(**options):
    critic = CriticNetwork(
        model_size=None,
        num_dense_layers=2,
        dense_hidden_units=32,
        gru_units=H,
        num_z_categoricals=C,
        num_z_classes=K,
        **options,
    )
    rng = np.random.default_rng(7)
    for var in critic.weights:  # the zero head would hide mapping errors
        var.assign(var.numpy() + rng.normal(0.0, 0.1, var.shape).astype("float32"))
    return critic


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(T, B, H)).astype("float32"), rng.random((T, B, C, K)).astype("float32")


@pytest.mark.parametrize("layout", ["h_z", "z_h"])
def test_input_layout_orders_the_concatenation(layout):
    critic = small_critic(input_layout=layout)
    h, z = inputs()
    parts = [h.reshape(-1, H), z.reshape(-1, C * K)]
    x = np.concatenate(parts if layout == "h_z" else parts[::-1], -1)
    _, logits = critic(h.reshape(-1, H), z.reshape(-1, C, K))
    # The reference forward pass on the flat input (an empty z: the concatenation is the test's own).
    _, want = numpy_reference.forward(numpy_reference.params_from(critic), x, np.zeros((len(x), 0)))
    np.testing.assert_allclose(to_np(logits), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", ["h_z", "z_h"])
def test_on_latent_equals_the_call_with_any_leading_dims(layout):
    critic = small_critic(input_layout=layout)
    h, z = inputs()
    flat_z = z.reshape(T, B, C * K)
    latent = np.concatenate([h, flat_z] if layout == "h_z" else [flat_z, h], -1)
    value, logits = to_np(critic(h.reshape(-1, H), z.reshape(-1, C, K)))
    for use_ema in (False, True):
        want = to_np(critic(h.reshape(-1, H), z.reshape(-1, C, K), use_ema=use_ema))
        got = to_np(critic.on_latent(latent, use_ema=use_ema))
        np.testing.assert_array_equal(got[0], want[0].reshape(T, B))
        np.testing.assert_array_equal(got[1], want[1].reshape(T, B, -1))
    got = to_np(critic(h, z))  # leading dims on the two-argument call too
    np.testing.assert_array_equal(got[1], logits.reshape(T, B, -1))
    single = to_np(critic.on_latent(latent[1, 2]))
    np.testing.assert_allclose(single[1], logits.reshape(T, B, -1)[1, 2], rtol=1e-6, atol=1e-6)
    assert single[0].shape == ()


def test_on_latent_for_an_ensemble_keeps_the_member_axis_first():
    critic = small_critic(ensemble_size=3)
    h, z = inputs()
    values, logits = to_np(critic.on_latent(np.concatenate([h, z.reshape(T, B, -1)], -1)))
    assert values.shape == (3, T, B) and logits.shape == (3, T, B, 255)
    want = to_np(critic(h.reshape(-1, H), z.reshape(-1, C, K))[1])
    np.testing.assert_array_equal(logits, want.reshape(3, T, B, 255))


def test_on_latent_under_compilation():
    critic = small_critic(input_layout="z_h")
    h, z = inputs()
    latent = np.concatenate([z.reshape(T, B, -1), h], -1)
    fn = compiled(lambda x: critic.on_latent(x))
    np.testing.assert_allclose(
        to_np(fn(keras.ops.convert_to_tensor(latent))[1]), to_np(critic.on_latent(latent)[1]), rtol=1e-5, atol=1e-5
    )


def test_bad_latents_and_shapes_name_the_argument():
    critic = small_critic(input_layout="z_h")
    with pytest.raises(ValueError, match=r"latent: got shape \[3, 4, 43\], expected \[\.\.\., 44\] \(flatten\(z\), h"):
        critic.on_latent(np.zeros((T, B, 43), "float32"))
    with pytest.raises(ValueError, match=r"h, z: got shapes \[3, 4, 24\] and \[3, 5, 4, 5\]"):
        critic(np.zeros((T, B, H), "float32"), np.zeros((T, 5, C, K), "float32"))
    with pytest.raises(ValueError, match="input_layout: got 'zh'"):
        CriticNetwork(input_layout="zh")


def test_input_layout_round_trips_through_the_config():
    critic = small_critic(input_layout="z_h")
    again = CriticNetwork.from_config(critic.get_config())
    assert again.input_layout == "z_h"
    config = critic.get_config()
    del config["input_layout"]  # a config saved before the option existed
    assert CriticNetwork.from_config(config).input_layout == "h_z"


def test_decode_is_the_heads_expected_value():
    critic = small_critic()
    logits = np.random.default_rng(3).normal(size=(T, B, 255)).astype("float32")
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(to_np(critic.decode(logits)), to_np(expected_value(probs)), rtol=1e-6, atol=1e-6)
    buckets = np.linspace(-20.0, 20.0, 255)
    np.testing.assert_allclose(to_np(critic.decode(logits)), probs @ buckets, rtol=1e-5, atol=1e-5)


def ema_gap(critic):
    return max(float(np.abs(f.numpy() - e.numpy()).max()) for f, e in zip(critic.fast_weights, critic.ema_weights))


def test_update_ema_conventions():
    critic = small_critic()
    fast = [f.numpy() for f in critic.fast_weights]
    ema = [e.numpy() for e in critic.ema_weights]
    critic.update_ema(tau=0.25)  # tau = 1 - decay
    for f, e, var in zip(fast, ema, critic.ema_weights):
        np.testing.assert_allclose(var.numpy(), 0.75 * e + 0.25 * f, rtol=1e-6, atol=1e-7)
    ema = [e.numpy() for e in critic.ema_weights]
    critic.update_ema(tau=0.25, step=3, period=2)  # not due: unchanged
    for e, var in zip(ema, critic.ema_weights):
        np.testing.assert_array_equal(var.numpy(), e)
    critic.update_ema(step=4, period=2)  # due, with the critic's decay
    for f, e, var in zip(fast, ema, critic.ema_weights):
        np.testing.assert_allclose(var.numpy(), 0.98 * e + 0.02 * f, rtol=1e-6, atol=1e-7)
    assert ema_gap(critic) > 0
    critic.update_ema(tau=0.02, step=0)  # first use: a copy
    assert ema_gap(critic) == 0.0
    with pytest.raises(ValueError, match="tau: got 0.5 with decay=0.5"):
        critic.update_ema(0.5, tau=0.5)
    with pytest.raises(ValueError, match="step: got -1"):
        critic.update_ema(step=-1)


def test_update_ema_with_a_tensor_step_under_compilation():
    critic = small_critic()
    ema = [e.numpy() for e in critic.ema_weights]
    fast = [f.numpy() for f in critic.fast_weights]

    def update(step):
        critic.update_ema(tau=0.5, step=step, period=2)
        return step

    for step, want in ((3, ema), (2, [0.5 * e + 0.5 * f for e, f in zip(ema, fast)]), (0, fast)):
        update(keras.ops.convert_to_tensor(step, "int32"))
        for w, var in zip(want, critic.ema_weights):
            np.testing.assert_allclose(var.numpy(), w, rtol=1e-6, atol=1e-7)


def test_critic_loss_takes_trailing_ones_and_target_logits():
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(T, B, 255)).astype("float32")
    target_logits = rng.normal(size=(T, B, 255)).astype("float32")
    targets = rng.normal(0.0, 10.0, (T, B)).astype("float32")
    weights = rng.random((T, B)).astype("float32")
    ema_value = to_np(expected_value(keras.ops.softmax(target_logits)))
    want = to_np(critic_loss(logits, targets, ema_value, weights))
    got = to_np(critic_loss(logits, targets[..., None], None, weights[..., None], ema_logits=target_logits))
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-7)
    # Against numpy: two-hot of the symlog target and of the decoded slow value.
    buckets = np.linspace(-20.0, 20.0, 255)

    def two_hot(y):
        y = np.clip(y, -20.0, 20.0)
        k = np.clip(np.searchsorted(buckets, y, side="right") - 1, 0, 253)
        w = (y - buckets[k]) / (buckets[k + 1] - buckets[k])
        out = np.zeros(y.shape + (255,))
        np.put_along_axis(out, k[..., None], (1 - w)[..., None], -1)
        np.put_along_axis(out, (k + 1)[..., None], w[..., None], -1)
        return out

    logp = logits - np.log(np.exp(np.float64(logits)).sum(-1, keepdims=True))
    symlog = np.sign(targets) * np.log1p(np.abs(targets))
    per = -(two_hot(symlog) * logp).sum(-1) - (two_hot(np.float64(ema_value)) * logp).sum(-1)
    np.testing.assert_allclose(got["total"], (per * weights).mean(), rtol=1e-5)


@pytest.mark.skipif(BACKEND != "torch", reason="torch.nn.Module views exist on the PyTorch backend only")
class TestTorchViews:
    def test_views_hold_one_half_each_in_the_same_order(self):
        critic = small_critic(input_layout="z_h")
        fast, ema = critic.fast_module(), critic.ema_module()
        names = critic.view_names()
        assert list(fast.state_dict()) == names == list(ema.state_dict())
        assert len(names) == len(critic.fast_weights) == 8
        assert all(p.requires_grad for p in fast.parameters())
        assert not any(p.requires_grad for p in ema.parameters())
        for p, var in zip(fast.parameters(), critic.fast_weights):
            assert p is var.value  # the critic's own tensors, not copies
        for p, var in zip(ema.parameters(), critic.ema_weights):
            assert p is var.value

    def test_host_optimizer_and_soft_update_change_the_critic(self):
        import torch

        critic = small_critic(input_layout="z_h")
        fast, ema = critic.fast_module(), critic.ema_module()
        h, z = inputs()
        latent = torch.tensor(np.concatenate([z.reshape(T, B, -1), h], -1))
        np.testing.assert_array_equal(to_np(fast(latent)), to_np(critic.on_latent(latent)[1]))
        np.testing.assert_array_equal(to_np(ema(latent)), to_np(critic.on_latent(latent, use_ema=True)[1]))
        before = [p.detach().clone() for p in fast.parameters()]
        optimizer = torch.optim.SGD(fast.parameters(), lr=0.1)
        fast(latent).logsumexp(-1).mean().backward()
        grads = [p.grad.clone() for p in fast.parameters()]
        optimizer.step()
        for var, b, g in zip(critic.fast_weights, before, grads):
            np.testing.assert_allclose(to_np(var.value), to_np(b - 0.1 * g), rtol=1e-6, atol=1e-7)
        ema_before = [p.detach().clone() for p in ema.parameters()]
        with torch.no_grad():  # sheeprl's / NM512's soft update, zipped by parameter order
            for f, e in zip(fast.parameters(), ema.parameters()):
                e.data.copy_(0.02 * f.data + 0.98 * e.data)
        for var, f, e in zip(critic.ema_weights, fast.parameters(), ema_before):
            np.testing.assert_allclose(to_np(var.value), to_np(0.02 * f + 0.98 * e), rtol=1e-6, atol=1e-7)
        ema.load_state_dict(fast.state_dict())  # a hard copy by name
        assert ema_gap(critic) == 0.0

    def test_view_outputs_and_two_argument_forward(self):
        import torch

        critic = small_critic()
        h, z = inputs()
        value, logits = critic.fast_module(outputs="both")(torch.tensor(h), torch.tensor(z))
        want = to_np(critic(h, z))
        np.testing.assert_array_equal(to_np(value), want[0])
        np.testing.assert_array_equal(to_np(logits), want[1])
        with pytest.raises(ValueError, match="outputs: got 'probs'"):
            critic.fast_module(outputs="probs")

    def test_compiled_view_does_not_recompile(self):
        import torch

        critic = small_critic(input_layout="z_h")
        fast = critic.fast_module()
        h, z = inputs()
        latent = torch.tensor(np.concatenate([z.reshape(T, B, -1), h], -1))
        torch._dynamo.reset()
        counters = torch._dynamo.utils.counters
        counters.clear()
        forward = torch.compile(fast, backend="aot_eager")
        for _ in range(3):
            out = forward(latent)
        assert counters["stats"]["unique_graphs"] == 1
        assert not counters["recompiles"] and not counters["graph_break"]
        np.testing.assert_allclose(to_np(out), to_np(fast(latent)), rtol=1e-5, atol=1e-5)

    def test_torch_module_has_rllibs_interface(self):
        import torch

        critic = small_critic()
        module = critic.torch_module()
        params = list(module.parameters())
        assert params == [v.value for v in critic.fast_weights + critic.ema_weights]
        h, z = inputs()
        h, z = torch.tensor(h.reshape(-1, H)), torch.tensor(z.reshape(-1, C, K))
        want = to_np(critic(h, z, use_ema=True))
        np.testing.assert_array_equal(to_np(module(h=h, z=z, use_ema=True)), want[0])
        value, logits = module(h=h, z=z, return_logits=True, use_ema=True)
        np.testing.assert_array_equal(to_np(logits), want[1])
        fast_head, ema_head = params[len(params) // 2 - 1], params[-1]
        before = to_np(ema_head).copy()
        module.update_ema()  # RLlib's: decay 0.98
        np.testing.assert_allclose(to_np(ema_head), 0.98 * before + 0.02 * to_np(fast_head), rtol=1e-6, atol=1e-7)
        module.init_ema()
        assert ema_gap(critic) == 0.0

    def test_torch_state_dicts_load_into_a_critic_of_another_name(self):
        critic = small_critic(input_layout="z_h")
        state = critic.torch_module().state_dict()
        assert len(state) == 2 * len(critic.fast_weights) and not any("critic" in k or "/" in k for k in state)
        other = CriticNetwork.from_config({**critic.get_config(), "name": "value_head"})
        other.torch_module().load_state_dict(state)
        for a, b in zip(critic.weights, other.weights):
            np.testing.assert_array_equal(to_np(a.value), to_np(b.value))
        fresh = CriticNetwork.from_config({**critic.get_config(), "name": "another"})
        fresh.ema_module().load_state_dict(critic.fast_module().state_dict())  # a host's hard copy by name
        for a, b in zip(critic.fast_weights, fresh.ema_weights):
            np.testing.assert_array_equal(to_np(a.value), to_np(b.value))

    def test_a_view_loads_a_state_dict_whole_or_not_at_all(self):
        """Finding 4: one tensor of a wrong shape made `load_state_dict` copy the others first (a half load)."""
        import torch

        critic = small_critic(input_layout="z_h")
        fast = critic.fast_module()
        good = {k: v.detach().clone() + 1.0 for k, v in fast.state_dict().items()}
        last = list(good)[-1]
        before = [np.array(to_np(v.value)) for v in critic.weights]
        for bad, message in (
            ({**good, last: torch.zeros(3)}, rf"state_dict\['{last}'\]: got shape \[3\], expected \[255\]"),
            ({**good, last: good[last].clone().fill_(float("nan"))}, "non-finite"),
            ({**good, last: good[last].long()}, "got dtype torch.int64"),
            ({**good, last: good[last].numpy()}, "got a ndarray, expected a torch.Tensor"),
            ({k: v for k, v in good.items() if k != last}, rf"missing \['{last}'\]"),
            ({**good, "extra": good[last]}, r"unexpected \['extra'\]"),
            ([1, 2], "state_dict: got a list"),
        ):
            with pytest.raises(ValueError, match=message):
                fast.load_state_dict(bad)
            for var, b in zip(critic.weights, before):
                np.testing.assert_array_equal(to_np(var.value), b, err_msg=var.path)
        with pytest.raises(ValueError, match="assign: got True"):
            fast.load_state_dict(good, assign=True)
        fast.load_state_dict(good)
        for var, b in zip(critic.fast_weights, before):
            np.testing.assert_array_equal(to_np(var.value), b + 1.0)
        assert all(p is var.value for p, var in zip(fast.parameters(), critic.fast_weights))

    def test_first_compiled_call_in_a_process_does_not_recompile(self):
        # A fresh process: Keras's call bookkeeping guarded the first call of a process on state the call itself
        # creates.
        import subprocess
        import sys

        code = (
            "import torch\n"
            "from multicritic import CriticNetwork\n"
            "c = CriticNetwork(model_size=None, num_dense_layers=2, dense_hidden_units=32, gru_units=24,"
            " num_z_categoricals=4, num_z_classes=5)\n"
            "h, z = torch.randn(3, 4, 24), torch.rand(3, 4, 4, 5)\n"
            "counters = torch._dynamo.utils.counters\n"
            "for fn in (lambda h, z: c(h, z)[1], c.fast_module()):\n"
            "    torch._dynamo.reset(); counters.clear()\n"
            "    f = torch.compile(fn, backend='aot_eager')\n"
            "    for _ in range(3): f(h, z)\n"
            "    print(counters['stats']['unique_graphs'], len(counters['graph_break']))\n"
        )
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, KERAS_BACKEND="torch", PYTHONPATH=root)
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split() == ["1", "0", "1", "0"]

    def test_the_critic_follows_the_device_of_the_hosts_tensors(self):
        import torch
        from keras.src.backend.torch import core

        from multicritic.backend.contract import current

        here = core.get_device()
        with current().device_scope(torch.empty(1, device="meta")):
            assert core.get_device() == "meta"
        assert core.get_device() == here
        with current().device_scope(torch.empty(1, device=here)):
            assert core.get_device() == here


def test_views_are_refused_off_pytorch():
    if BACKEND == "torch":
        pytest.skip("the views exist on PyTorch")
    with pytest.raises(ValueError, match="torch.nn.Module views need KERAS_BACKEND=torch"):
        small_critic().fast_module()
