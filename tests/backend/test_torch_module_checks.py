"""PyTorch's generic module checks (its `test/test_modules.py` over `common_modules.module_db`), adapted to every
module view of the critic and to the critic itself, with our own inputs: forward against the eager path, copies
(`deepcopy`, `pickle`, `torch.save`) that stay live, non-contiguous inputs, dtype conversions and device moves,
train/eval and `repr`, `state_dict` round trips (`strict`, `assign`), `functional_call`, `parametrize`,
`torch.autocast`, gradients and double backward, `torch.compile` of the view, and a wrapper holding several views.
Every check compares with the eager path (the Keras ops, replays off), bit for bit where that path is deterministic,
or with an independently built reference (a copy with the parameters loaded)."""

import copy
import io
import pickle
import re

import numpy as np
import pytest

from multicritic import CriticNetwork
from tests.conftest import BACKEND

pytestmark = pytest.mark.skipif(BACKEND != "torch", reason="torch.nn.Module views: PyTorch backend only")

if BACKEND == "torch":
    import torch
    from torch.func import functional_call
    from torch.nn.utils import parametrize

    from multicritic.backend import torch_replay
    from multicritic.interop import nm512, rllib, sheeprl, torchrl
    from tests.backend.test_torch_replay import keras_path as eager  # the eager path: replays off

H, C, K, N = 24, 4, 5, 6


def critic_of(seed=0, **options):
    # A features critic (`input_size`) takes the latent's width as its one input's.
    sizes = {} if "input_size" in options else dict(gru_units=H, num_z_categoricals=C, num_z_classes=K)
    critic = CriticNetwork(model_size=None, num_dense_layers=2, dense_hidden_units=32, **sizes, **options)
    rng = np.random.default_rng(seed)
    for var in critic.weights:  # fast and EMA apart, the zero head random: a mix-up shows
        value = rng.normal(0.0, 0.3, var.shape).astype("float32")
        # A batch norm's variance (XQC's trunk) positive, as a variance is: near 0 it amplifies each rounding.
        var.assign(np.abs(value) + 1.0 if var.path.endswith("/moving_variance") else value)
    return critic


# name: (critic options, module of the critic, its call's (args, kwargs) from (latent, h, z))
VIEWS = {
    "fast_module": ({}, lambda c: c.fast_module(outputs="both"), lambda lat, h, z: ((lat,), {})),
    "ema_module": ({}, lambda c: c.ema_module(outputs="both"), lambda lat, h, z: ((lat,), {})),
    "fast_module(h, z)": ({}, lambda c: c.fast_module(outputs="value"), lambda lat, h, z: ((h, z), {})),
    "torch_module": ({}, lambda c: c.torch_module(), lambda lat, h, z: ((h, z), {"return_logits": True})),
    "sheeprl": ("sheeprl", lambda c: sheeprl.sheeprl_modules(c)[0], lambda lat, h, z: ((lat,), {})),
    "nm512 slow": ("nm512", lambda c: nm512.nm512_modules(c)[1], lambda lat, h, z: ((lat,), {})),
    "torchrl": ("torchrl", lambda c: torchrl.torchrl_modules(c)[0], lambda lat, h, z: ((lat,), {})),
    "rllib": ("rllib", lambda c: rllib.rllib_torch_module(c), lambda lat, h, z: ((h, z), {"return_logits": True})),
    "critic": ({}, lambda c: c, lambda lat, h, z: ((h, z), {})),
    # A features critic, called as a module with its one input `x` (the latent's width).
    "critic(features)": ({"input_size": H + C * K}, lambda c: c, lambda lat, h, z: ((lat,), {})),
    # The registered parts other than the reference's: a head without buckets on residual blocks, and HL-Gauss.
    "fast_module(quantile, residual)": (
        {"head": "quantile", "trunk": "residual"},
        lambda c: c.fast_module(outputs="both"),
        lambda lat, h, z: ((lat,), {}),
    ),
    "torch_module(hl_gauss)": (
        {"head": "hl_gauss"},
        lambda c: c.torch_module(),
        lambda lat, h, z: ((h, z), {"return_logits": True}),
    ),
}


# The checks whose outcome does not depend on what the critic takes (its module methods, copies, state dicts)
# run on the (h, z) critic's views only.
INPUT_BLIND = [name for name in VIEWS if name != "critic(features)"]


def make(name, seed=0):
    options, build, arguments = VIEWS[name]
    if isinstance(options, str):
        options = {"sheeprl": sheeprl, "nm512": nm512, "torchrl": torchrl, "rllib": rllib}[options].CRITIC_OPTIONS
    critic = critic_of(seed, **options)

    def call(module, lat, h, z):
        args, kwargs = arguments(lat, h, z)
        return module(*args, **kwargs)

    call.arguments = arguments
    return critic, build(critic), call


def inputs(seed=0, lead=(N,)):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*lead, H, generator=g)
    z = torch.softmax(torch.randn(*lead, C, K, generator=g), -1)
    latent = torch.randn(*lead, H + C * K, generator=g)
    return latent, h, z


def leaves(x):
    return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def assert_equal(got, want, exact=True):
    got, want = leaves(got), leaves(want)
    assert len(got) == len(want) and got
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        if exact:
            assert torch.equal(g, w), (g - w).abs().max()
        else:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def run(call, module, x, times=3):
    """The module's output on its `times`-th call (the first traces, later ones replay)."""
    for _ in range(times - 1):
        call(module, *x)
    return call(module, *x)


def differs(a, b):
    return any(not torch.equal(g, w) for g, w in zip(leaves(a), leaves(b)))


@pytest.mark.parametrize("name", VIEWS)
def test_forward_equals_the_eager_path_with_and_without_grad(name):
    _, module, call = make(name)
    x = inputs()
    want = eager(lambda: call(module, *x))
    assert_equal(run(call, module, x), want)
    with torch.no_grad():
        assert_equal(run(call, module, x), want)
    with torch.inference_mode():
        assert_equal(run(call, module, x), want)


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
@pytest.mark.parametrize("name", INPUT_BLIND)
def test_a_copy_is_live_and_apart_from_the_original(name, how):
    _, module, call = make(name)
    x = inputs()
    before = run(call, module, x)
    if how == "deepcopy":
        twin = copy.deepcopy(module)
    elif how == "pickle":
        twin = pickle.loads(pickle.dumps(module))
    else:
        buffer = io.BytesIO()
        torch.save(module, buffer)
        buffer.seek(0)
        twin = torch.load(buffer, weights_only=False)
    assert type(twin) is type(module)
    assert_equal(run(call, twin, x), before)
    trainable = [p for p in twin.parameters() if p.requires_grad] or list(twin.parameters())
    with torch.no_grad():  # a host's soft update or optimizer step on the copy
        for p in trainable:
            p.mul_(0.5).add_(0.01)
    after = run(call, twin, x)
    assert differs(after, before)  # the copy's outputs follow its parameters
    assert_equal(after, eager(lambda: call(twin, *x)))
    assert_equal(run(call, module, x), before)  # the original is untouched


@pytest.mark.parametrize("name", VIEWS)
def test_non_contiguous_and_transposed_inputs_equal_the_eager_path(name):
    _, module, call = make(name)
    lat, h, z = inputs(lead=(5, 3))
    for x in (
        (lat.transpose(0, 1), h.transpose(0, 1), z.transpose(0, 1)),  # time-major from batch-major
        (lat[:, ::2], h[:, ::2], z[:, ::2]),
    ):
        assert not x[0].is_contiguous()
        want = eager(lambda: call(module, *x))
        # The same shapes traced contiguous first: a graph of views must not take the strided inputs.
        assert_equal(run(call, module, [t.contiguous() for t in x]), want)
        assert_equal(run(call, module, x), want)


@pytest.mark.parametrize("convert", ["double", "half", "bfloat16", "to(float64)", "type(float64)"])
@pytest.mark.parametrize("name", INPUT_BLIND)
def test_dtype_conversions_are_refused_before_anything_changes(name, convert):
    critic, module, call = make(name)
    x = inputs()
    want = run(call, module, x)
    fn = {
        "double": lambda m: m.double(),
        "half": lambda m: m.half(),
        "bfloat16": lambda m: m.bfloat16(),
        "to(float64)": lambda m: m.to(torch.float64),
        "type(float64)": lambda m: m.type(torch.float64),
    }[convert]
    with pytest.raises(ValueError, match="dtype: got a conversion"):
        fn(module)
    assert all(v.value.dtype == torch.float32 for v in critic.weights)
    assert_equal(run(call, module, x), want)
    for same in (lambda m: m.float(), lambda m: m.to(torch.float32), lambda m: m.to("cpu"), lambda m: m.cpu()):
        assert same(module) is module
        assert_equal(run(call, module, x), want)


@pytest.mark.skipif(BACKEND != "torch" or not torch.cuda.is_available(), reason="a device move needs a GPU")
@pytest.mark.parametrize("name", INPUT_BLIND)
def test_device_moves_move_the_critic_and_the_replay_follows(name):
    critic, module, call = make(name)
    x = inputs()
    run(call, module, x)
    module.to("cuda")
    assert all(
        v.value.device.type == "cuda" for v in (critic.fast_weights if "ema" not in name else critic.ema_weights)
    )
    xc = [t.cuda() for t in x]
    assert_equal(run(call, module, xc), eager(lambda: call(module, *xc)))


@pytest.mark.parametrize("name", INPUT_BLIND)
def test_train_eval_and_repr(name):
    _, module, call = make(name)
    x = inputs()
    want = run(call, module, x)
    assert module.eval() is module and not module.training and not any(m.training for m in module.modules())
    assert_equal(run(call, module, x), want)  # no dropout, no batch statistics: the modes compute alike
    assert module.train() is module and module.training
    text = repr(module)
    assert type(module).__name__ in text


@pytest.mark.parametrize("name", INPUT_BLIND)
def test_state_dict_round_trips_strict_or_not_and_refuses_assign(name):
    _, module, call = make(name)
    x = inputs()
    original = {k: v.detach().clone() for k, v in module.state_dict().items()}
    _, donor, _ = make(name, seed=1)
    new = {k: v.detach().clone() for k, v in donor.state_dict().items()}
    assert module.load_state_dict(new) is not None
    assert_equal(run(call, module, x), eager(lambda: call(donor, *x)))
    partial = {k: v for k, v in original.items()}
    dropped = next(k for k in partial if "bins" not in k)
    listed = module.state_dict(keep_vars=True)
    for key in [k for k in partial if listed[k] is listed[dropped]]:  # the critic lists a variable twice
        del partial[key]
    with pytest.raises(ValueError, match="missing"):
        module.load_state_dict(partial)  # strict: refused, nothing changed
    assert torch.equal(module.state_dict()[dropped], new[dropped])
    result = module.load_state_dict(partial, strict=False)
    assert dropped in result.missing_keys
    assert torch.equal(module.state_dict()[dropped], new[dropped])
    with pytest.raises(ValueError, match="assign"):
        module.load_state_dict(original, assign=True)


def test_the_critic_refuses_a_state_dict_whose_keys_of_one_parameter_differ():
    """The critic lists each variable twice (Keras's parameter dicts: under its layer and under the model); torch
    copies both keys into the one tensor, so a value edited under one key alone would be silently overwritten:
    refused, nothing changed."""
    critic, _, call = make("critic")
    x = inputs()
    want = run(call, critic, x)
    listed = critic.state_dict(keep_vars=True)
    state = {k: v.detach().clone() for k, v in listed.items()}
    first = next(iter(state))
    twin = next(k for k in state if k != first and listed[k] is listed[first])
    state[first] += 1.0
    with pytest.raises(ValueError, match=re.escape(f"state_dict[{twin!r}]: got values that differ from state_dict")):
        critic.load_state_dict(state)
    assert_equal(run(call, critic, x), want)
    state[twin] = state[first].clone()
    critic.load_state_dict(state)
    assert torch.equal(listed[first], state[first])
    assert differs(run(call, critic, x), want)


@pytest.mark.parametrize("name", VIEWS)
def test_functional_call_reads_the_swapped_parameters(name):
    _, module, call = make(name)
    x = inputs()
    before = run(call, module, x)
    _, donor, _ = make(name, seed=2)
    swapped = dict(donor.named_parameters())
    args, kwargs = call.arguments(*x)
    for _ in range(3):  # traced, then replayed
        got = functional_call(module, swapped, args, kwargs)
    assert_equal(got, eager(lambda: call(donor, *x)))
    assert differs(got, before)
    assert_equal(run(call, module, x), before)  # the module's own parameters again after the call


@pytest.mark.parametrize("name", VIEWS)
def test_functional_call_as_the_first_call_reads_the_swapped_parameters(name):
    """Where the parameters are first listed under a swap (the module's first call), the swap is read, and the
    module's own parameters after it."""
    _, module, call = make(name)
    _, twin, _ = make(name)  # the module's weights, never called under a swap
    _, donor, _ = make(name, seed=2)
    x = inputs()
    args, kwargs = call.arguments(*x)
    for _ in range(3):
        got = functional_call(module, dict(donor.named_parameters()), args, kwargs)
        assert_equal(got, eager(lambda: call(donor, *x)))
    assert_equal(run(call, module, x), eager(lambda: call(twin, *x)))


def _doubled(module, name):
    """`module` with `name`'s stored value doubled in place (the critic: its variable)."""
    with torch.no_grad():
        module.get_parameter(name).mul_(2.0)
    return module


@pytest.mark.parametrize("name", VIEWS)
def test_a_parametrization_is_what_the_forward_pass_reads(name):
    _, module, call = make(name)
    x = inputs()
    before = run(call, module, x)
    target = next(n for n, p in module.named_parameters() if p.dim() == 2)
    holder_name, _, leaf = target.rpartition(".")
    holder = module.get_submodule(holder_name) if holder_name else module

    class Doubled(torch.nn.Module):
        def forward(self, w):
            return 2.0 * w

    parametrize.register_parametrization(holder, leaf, Doubled())
    got = run(call, module, x)
    _, reference, _ = make(name)  # the same weights, that one stored doubled
    assert_equal(got, eager(lambda: call(_doubled(reference, target), *x)))
    assert differs(got, before)
    parametrize.remove_parametrizations(holder, leaf, leave_parametrized=False)
    assert_equal(run(call, module, x), before)


@pytest.mark.parametrize("first", ["autocast", "plain"])
@pytest.mark.parametrize("name", VIEWS)
def test_autocast_is_part_of_what_a_replay_is_traced_for(name, first):
    _, module, call = make(name)
    x = inputs()

    def under(autocast, fn):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return fn()

    order = [True, False] if first == "autocast" else [False, True]
    for autocast in order + order:
        want = eager(lambda: under(autocast, lambda: call(module, *x)))
        assert_equal(under(autocast, lambda: run(call, module, x)), want)


@pytest.mark.parametrize("name", [n for n in VIEWS if n not in ("ema_module", "nm512 slow")])
def test_gradients_and_double_backward_equal_the_eager_path(name):
    _, module, call = make(name)
    x = inputs()
    params = [p for p in module.parameters() if p.requires_grad]

    def grads():
        out = leaves(call(module, *x))
        loss = sum(((t.float() * (i + 1)) ** 2).sum() for i, t in enumerate(out))
        first = torch.autograd.grad(loss, params, create_graph=True)
        second = torch.autograd.grad(sum((g**2).sum() for g in first), params)
        return [g.detach() for g in first] + list(second)

    run(call, module, x)
    assert_equal(grads(), eager(grads))


@pytest.mark.parametrize("name", ["fast_module", "sheeprl", "rllib", "critic"])
def test_torch_compile_of_the_view_equals_the_eager_path(name):
    _, module, call = make(name)
    x = inputs()
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="aot_eager")
    assert_equal(run(call, compiled, x, times=2), eager(lambda: call(module, *x)), exact=False)


@pytest.mark.parametrize("host", ["views", "sheeprl", "nm512", "torchrl"])
def test_a_wrapper_holding_both_halves_loads_all_or_nothing(host):
    if host == "views":
        critic = critic_of()
        fast, slow = critic.fast_module(), critic.ema_module()
    else:
        module = {"sheeprl": sheeprl, "nm512": nm512, "torchrl": torchrl}[host]
        critic = critic_of(**module.CRITIC_OPTIONS)
        fast, slow = getattr(module, f"{host}_modules")(critic)
    wrapper = torch.nn.ModuleDict({"critic": fast, "target": slow})
    before = [v.numpy().copy() for v in critic.weights]
    state = {
        k: v.detach().clone() + 0.5 if "bins" not in k else v.detach().clone() for k, v in wrapper.state_dict().items()
    }
    bad = dict(state)
    last = [k for k in bad if k.startswith("target.") and "bins" not in k][-1]
    bad[last] = bad[last].clone()
    bad[last].view(-1)[0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        wrapper.load_state_dict(bad)
    for var, old in zip(critic.weights, before):
        np.testing.assert_array_equal(var.numpy(), old)  # neither half written
    wrapper.load_state_dict(state)
    assert all(not np.array_equal(var.numpy(), old) for var, old in zip(critic.weights, before))


def test_copies_of_both_views_share_one_copied_critic():
    critic = critic_of()
    fast, slow = sheeprl.sheeprl_modules(critic_of(**sheeprl.CRITIC_OPTIONS))
    pair = copy.deepcopy(torch.nn.ModuleDict({"critic": fast, "target": slow}))
    assert pair["critic"].critic is pair["target"].critic is not fast.critic
    pair["critic"].critic.update_ema(decay=0.0)  # the copied critic's EMA copy becomes its fast weights
    lat = inputs()[0]
    assert_equal(pair["target"](lat), pair["critic"](lat))
    assert critic.built


def test_the_one_debug_switch_turns_replays_and_compiled_steps_off(monkeypatch):
    from multicritic import CriticTrainer
    from multicritic.backend import contract as backend

    monkeypatch.setattr(backend, "EAGER", True)
    critic, module, call = make("fast_module")
    x = inputs()
    assert_equal(run(call, module, x), eager(lambda: call(module, *x)))
    assert not torch_replay.graphs(critic)  # nothing traced
    trainer = CriticTrainer(critic, jit_compile=True)
    rng = np.random.default_rng(0)
    trainer.train_on_dream(
        rng.normal(size=(3, 2, H)).astype("float32"),
        rng.random((3, 2, C, K)).astype("float32"),
        np.ones((3, 2), "float32"),
        np.ones((3, 2), "float32"),
    )
    (step,) = trainer._compiled.values()
    assert step.compiled is None and step.eager_steps == 1


# torch.func over the views (issue 62 finding 3): `grad`, `vmap` and `stack_module_state` ensembles, on every view
# kind with every registered head and trunk, and on every host's modules. Under a transform a replay's checks
# (`torch.equal`, `.item()`) cannot run, so a view takes the eager path; each check below compares with the same
# transform over the eager path (replays off: bit for bit) and with torch's autograd or a loop of eager calls.
E = 3  # ensemble members, samples of a per-sample gradient

# name: (module of the critic, its call's (args, kwargs) from (latent, h, z))
FUNC_VIEWS = {
    "fast_module": (lambda c: c.fast_module(outputs="both"), lambda lat, h, z: ((lat,), {})),
    "fast_module(logits)": (lambda c: c.fast_module(), lambda lat, h, z: ((lat,), {})),
    "fast_module(h, z)": (lambda c: c.fast_module(outputs="value"), lambda lat, h, z: ((h, z), {})),
    "ema_module": (lambda c: c.ema_module(outputs="both"), lambda lat, h, z: ((lat,), {})),
    "torch_module": (lambda c: c.torch_module(), lambda lat, h, z: ((h, z), {"return_logits": True})),
    "torch_module(use_ema)": (
        lambda c: c.torch_module(),
        lambda lat, h, z: ((h, z), {"return_logits": True, "use_ema": True}),
    ),
    "critic": (lambda c: c, lambda lat, h, z: ((h, z), {})),
}


def _func_cases():
    from multicritic.heads import HEADS
    from multicritic.interop import HOSTS
    from multicritic.trunks import TRUNKS

    # Each head with the reference trunk, each trunk with the reference head: a view's forward pass is the trunk's
    # then the head's, so the parts do not interact here, and the cases grow with the parts, not their product.
    parts = [(head, "mlp") for head in HEADS] + [("two_hot", trunk) for trunk in TRUNKS if trunk != "mlp"]
    cases = [(view, head, trunk) for view in FUNC_VIEWS for head, trunk in parts]
    hosts = [(host, i) for host in HOSTS if HOSTS[host].modules is not None for i in range(2)]
    # a host's modules: its fast one, then its slow one (or its pair's `use_ema=True`); a features critic's
    # `x` (the latent) through the critic and its pair module.
    return cases + hosts + [("features", "critic"), ("features", "torch_module(use_ema)")]


FUNC_CASES = _func_cases()


def make_func_case(case, seed=0):
    """`(module, args, kwargs)` of a case, on `inputs()`."""
    lat, h, z = inputs()
    if len(case) == 3:
        view, head, trunk = case
        build, arguments = FUNC_VIEWS[view]
        module = build(critic_of(seed, head=head, trunk=trunk))
        args, kwargs = arguments(lat, h, z)
        return module, args, kwargs
    if case[0] == "features":
        build, arguments = FUNC_VIEWS[case[1]]
        return build(critic_of(seed, input_size=H + C * K)), (lat,), arguments(lat, h, z)[1]
    from multicritic.interop import HOSTS

    host, i = case
    made = HOSTS[host].modules(critic_of(seed, **HOSTS[host].options))
    if isinstance(made, tuple):
        return made[i], (lat,), {}
    return made, (h, z), {"return_logits": True, "use_ema": bool(i)}


def func_id(case):
    return "-".join(map(str, case))


def loss_of(out):
    return sum(((t.float() * (i + 1)) ** 2).sum() for i, t in enumerate(leaves(out)))


def assert_close(got, want):
    """Values from torch.func's batching rules or its `grad` against torch's eager calls or autograd: torch takes
    other kernels for some ops (a batched matmul for a loop of matmuls; `grad` differs from `torch.autograd.grad`
    in the last bits for a plain `torch.nn` Linear-LayerNorm stack too, measured on torch 2.13), so these agree
    to float32 rounding, not bit for bit: to 1e-5 of each tensor's largest entry (an entry that sums terms of
    both signs to near zero carries the rounding of its terms, not its own)."""
    got, want = leaves(got), leaves(want)
    assert len(got) == len(want) and got
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * max(float(w.abs().max()), 1.0))


@pytest.mark.parametrize("case", FUNC_CASES, ids=func_id)
def test_torch_func_grad_of_functional_call_equals_eager_autograd(case):
    """Issue 62 finding 3: `torch.func.grad` over `functional_call` of a view (which crashed in the replay's
    trace) gives eager autograd's gradients."""
    module, args, kwargs = make_func_case(case)
    run(lambda m: m(*args, **kwargs), module, ())  # traced and replayed outside the transform first
    params = {k: v.detach() for k, v in module.named_parameters()}

    def loss(p):
        return loss_of(functional_call(module, p, args, kwargs))

    transformed = torch.func.grad_and_value(loss)
    for _ in range(3):
        grads, value = transformed(params)
    assert_equal([value, *grads.values()], eager(lambda: transformed(params)[::-1]))
    assert_equal(value, eager(lambda: loss(params)))

    def autograd():
        own = {k: v.clone().requires_grad_() for k, v in params.items()}
        found = torch.autograd.grad(loss(own), list(own.values()), allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for g, p in zip(found, own.values())]

    want = eager(autograd)
    assert_close(list(grads.values()), want)
    assert any(bool(g.abs().sum() > 0) for g in want)


@pytest.mark.parametrize("case", FUNC_CASES, ids=func_id)
def test_torch_func_vmap_and_per_sample_grads_equal_a_loop_of_eager_calls(case):
    """Issue 62 finding 3: `torch.func.vmap` over a view's call (which hit the replay's `.item()` under vmap)
    and per-sample gradients (`vmap(grad(functional_call))`) give what a loop of eager calls gives."""
    module, args, kwargs = make_func_case(case)
    g = torch.Generator().manual_seed(1)
    batched = [a + 0.25 * torch.randn(E, *a.shape, generator=g) for a in args]
    sample = [a[0] for a in batched]
    run(lambda m: m(*sample, **kwargs), module, ())  # a sample's signature traced: vmap must not replay it
    forward = torch.func.vmap(lambda *a: module(*a, **kwargs))
    for _ in range(3):
        got = forward(*batched)
    assert_equal(got, eager(lambda: forward(*batched)))
    loop = [eager(lambda: module(*[a[i] for a in batched], **kwargs)) for i in range(E)]
    assert_close(got, [torch.stack(parts) for parts in zip(*map(leaves, loop))])

    params = {k: v.detach() for k, v in module.named_parameters()}

    def loss(p, *a):
        return loss_of(functional_call(module, p, tuple(x[None] for x in a), kwargs))

    rows = [a[:, 0] for a in batched]  # E samples of one row each
    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, *[0] * len(rows)))
    for _ in range(2):
        got = per_sample(params, *rows)
    assert_equal(list(got.values()), eager(lambda: list(per_sample(params, *rows).values())))

    def autograd(i):
        own = {k: v.clone().requires_grad_() for k, v in params.items()}
        found = torch.autograd.grad(loss(own, *[r[i] for r in rows]), list(own.values()), allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for g, p in zip(found, own.values())]

    want = [eager(lambda: autograd(i)) for i in range(E)]
    assert_close(list(got.values()), [torch.stack(parts) for parts in zip(*want)])
    assert any(bool(g.abs().sum() > 0) for g in got.values())


@pytest.mark.parametrize("case", FUNC_CASES, ids=func_id)
def test_torch_func_ensemble_of_stacked_copies_equals_each_copys_eager_call(case):
    """Issue 62 finding 3: an ensemble of a view's copies through `stack_module_state` + `vmap` over
    `functional_call` gives each copy's eager output."""
    members = [make_func_case(case, seed=seed) for seed in range(E)]
    base, args, kwargs = members[0]
    copies = [module for module, _, _ in members]
    run(lambda m: m(*args, **kwargs), base, ())
    params, buffers = torch.func.stack_module_state(copies)

    def member(p, b):
        return functional_call(base, (p, b), args, kwargs)

    ensemble = torch.func.vmap(member)
    for _ in range(3):
        got = ensemble(params, buffers)
    assert_equal(got, eager(lambda: ensemble(params, buffers)))
    each = [eager(lambda: module(*args, **kwargs)) for module in copies]
    assert differs(each[0], each[1])  # the members differ: a member's parameters mixed up shows
    assert_close(got, [torch.stack(parts) for parts in zip(*map(leaves, each))])


# Issue 71: the critic as a PyTorch module in a new user's own actor-critic loop.
CONVERSIONS = {
    "double": lambda m: m.double(),
    "half": lambda m: m.half(),
    "bfloat16": lambda m: m.bfloat16(),
    "to(float64)": lambda m: m.to(torch.float64),
    "to(cpu, float16)": lambda m: m.to("cpu", torch.float16),
}


@pytest.mark.parametrize("convert", CONVERSIONS)
def test_issue_71_finding_11_the_critic_refuses_dtype_conversions_as_its_views_do(convert):
    """`critic.half()` converted the critic's parameters (logits moved, Keras still said float32) where its views
    refuse: the critic refuses with the views' error, before anything changes, and keeps computing as before."""
    critic, _, call = make("critic")
    x = inputs()
    before = [v.value.detach().clone() for v in critic.weights]
    want = run(call, critic, x)
    with pytest.raises(ValueError) as refused:
        CONVERSIONS[convert](critic)
    message = str(refused.value)
    assert message.startswith("dtype: got a conversion of the critic's torch.float32 parameters to torch.")
    assert "expected their own dtype (torch.float32" in message and "torch.autocast" in message
    assert [v.dtype for v in critic.weights] == ["float32"] * len(before)
    for var, old in zip(critic.weights, before):
        assert var.value.dtype == torch.float32 and torch.equal(var.value, old)
    assert_equal(run(call, critic, x), want)
    assert_equal(want, eager(lambda: call(critic, *x)))


def _slow_storage(critic):
    """The storage of the slow critic's variables: a view's parameter is one of them or a transposed view."""
    return {v.value.untyped_storage().data_ptr() for v in critic.ema_weights}


@pytest.mark.parametrize("name", VIEWS)
def test_issue_71_finding_12_no_module_method_makes_the_slow_critic_require_grad(name):
    """`critic.requires_grad_(False)` then `(True)` (the critic frozen for an actor's update) made the slow critic's
    parameters trainable; no module method applied to the critic or a view of it does."""
    critic, module, _ = make(name)
    slow = _slow_storage(critic)

    def is_slow(param):
        return param.untyped_storage().data_ptr() in slow

    steps = [
        lambda m: m.requires_grad_(False),
        lambda m: m.requires_grad_(True),
        lambda m: m.train(),
        lambda m: m.eval(),
        lambda m: m.to("cpu"),
        lambda m: m.float(),
        lambda m: m.train(False),
        lambda m: m.requires_grad_(),
    ]
    for step in steps:
        assert step(module) is module
        assert not any(v.value.requires_grad for v in critic.ema_weights)
        assert not any(p.requires_grad for p in module.parameters() if is_slow(p))
    fast = [p for p in module.parameters() if not is_slow(p)]
    assert all(p.requires_grad for p in fast)  # the fast critic's parameters as torch leaves them
    module.requires_grad_(False)
    assert not any(p.requires_grad for p in module.parameters())


def test_issue_71_finding_12_the_optimizer_idiom_after_a_freeze_trains_the_fast_critic_only():
    """The PyTorch page's idiom (an optimizer over the parameters that require grad), after the critic was frozen
    for an actor's update and unfrozen: one step moves every fast weight and no EMA weight."""
    critic, _, _ = make("critic")
    _, h, z = inputs()
    critic.requires_grad_(False)
    actions = h.clone().requires_grad_()  # an actor's output, through the frozen critic
    critic(actions, z)[0].sum().backward()
    assert actions.grad is not None and all(v.value.grad is None for v in critic.weights)
    critic.requires_grad_(True)
    params = [p for p in critic.parameters() if p.requires_grad]
    assert sorted(map(id, params)) == sorted(id(v.value) for v in critic.fast_weights)
    ema_before = [v.value.detach().clone() for v in critic.ema_weights]
    fast_before = [v.value.detach().clone() for v in critic.fast_weights]
    slow_outputs = critic(h, z, use_ema=True)
    optimizer = torch.optim.Adam(params, lr=1e-2)
    value, logits = critic(h, z)
    (logits.logsumexp(-1).sum() + value.square().sum()).backward()
    optimizer.step()
    for var, old in zip(critic.ema_weights, ema_before):
        assert torch.equal(var.value, old)
    assert all(not torch.equal(var.value, old) for var, old in zip(critic.fast_weights, fast_before))
    assert_equal(critic(h, z, use_ema=True), slow_outputs)


@pytest.mark.parametrize("name", ["critic", "fast_module", "fast_module(h, z)", "torch_module", "sheeprl"])
def test_issue_71_finding_13_torch_compile_warns_of_no_lru_cache(name):
    """`torch.compile(critic)` printed Dynamo's warnings about the `functools.lru_cache` wrappers it traced
    (`validation.py`, `torch_views.py`), read as correctness warnings: none now, and the same outputs."""
    import warnings

    _, module, call = make(name)
    x = inputs()
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="aot_eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = run(call, compiled, x, times=2)
    cache_warnings = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "lru_cache" in str(w.message)]
    assert not cache_warnings, cache_warnings
    assert_equal(got, eager(lambda: call(module, *x)), exact=False)
