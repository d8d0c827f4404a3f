"""PyTorch forward passes replayed from traced graphs: bit-identical to the Keras call (values and gradients),
never stale (weights changed in place, quantized or LoRA layers, other shapes), and refusing what they cannot
trace."""

import re

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork
from tests.conftest import BACKEND, randomize, to_np

pytestmark = pytest.mark.skipif(BACKEND != "torch", reason="graph replays: PyTorch backend only")

if BACKEND == "torch":
    import torch

    from multicritic.backend import torch_replay


def keras_path(fn):
    """`fn()` with replays off: every op through Keras (the reference)."""
    torch_replay.ENABLED = False
    try:
        return fn()
    finally:
        torch_replay.ENABLED = True


def leaves(x):
    return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def assert_bit_identical(got, want):
    got, want = leaves(got), leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert torch.equal(g, w), (g - w).abs().max()


def critic_and_inputs(seed=0, **options):
    critic = CriticNetwork(model_size="nano", **options)
    randomize(critic, seed=seed)
    g = torch.Generator().manual_seed(seed)
    latent = torch.randn(3, 5, critic.latent_size, generator=g)
    h = torch.randn(6, critic.gru_units, generator=g)
    z = torch.softmax(torch.randn(6, critic.num_z_categoricals, critic.num_z_classes, generator=g), -1)
    device = critic.fast_weights[0].value.device  # a host's tensors are where its critic is (a GPU when there is one)
    return critic, latent.to(device), h.to(device), z.to(device)


ENTRIES = {
    "fast_module": lambda c, latent, h, z: c.fast_module()(latent),
    "ema_module": lambda c, latent, h, z: c.ema_module(outputs="both")(latent),
    "fast_module(h, z)": lambda c, latent, h, z: c.fast_module(outputs="value")(h, z),
    "torch_module": lambda c, latent, h, z: c.torch_module()(h, z, return_logits=True),
    "torch_module ema": lambda c, latent, h, z: c.torch_module()(h, z, return_logits=True, use_ema=True),
    "on_latent": lambda c, latent, h, z: c.on_latent(latent),
    "on_latent logits": lambda c, latent, h, z: c.on_latent(latent, outputs="logits"),
    "call": lambda c, latent, h, z: c(h, z),
    "call leading dims": lambda c, latent, h, z: c(h.reshape(2, 3, -1), z.reshape((2, 3) + tuple(z.shape[1:]))),
    "call ema": lambda c, latent, h, z: c(h, z, use_ema=True),
}
OPTIONS = {
    "default": {},
    "ensemble": {"ensemble_size": 3},
    "z_h hl_gauss": {"input_layout": "z_h", "head": "hl_gauss"},
    "symexp rms": {"bin_scheme": "symexp", "norm": "rms", "use_bias": True},
}


@pytest.mark.parametrize("options", OPTIONS, ids=list(OPTIONS))
@pytest.mark.parametrize("entry", ENTRIES, ids=list(ENTRIES))
def test_replays_are_bit_identical_to_the_keras_call_values_and_gradients(entry, options):
    critic, latent, h, z = critic_and_inputs(**OPTIONS[options])
    fn = ENTRIES[entry]
    want = keras_path(lambda: fn(critic, latent, h, z))
    fn(critic, latent, h, z)  # traces
    assert any(g is not None for g in torch_replay.graphs(critic).values())
    got = fn(critic, latent, h, z)  # replays
    assert_bit_identical(got, want)
    params = [v.value for v in critic.weights if v.value.requires_grad]

    def grads(run):
        loss = sum((t.float() ** 2).sum() * (i + 1) for i, t in enumerate(leaves(run())))
        if not loss.requires_grad:  # the EMA critic: nothing to differentiate
            return []
        found = torch.autograd.grad(loss, params, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for g, p in zip(found, params)]

    assert_bit_identical(
        grads(lambda: fn(critic, latent, h, z)), keras_path(lambda: grads(lambda: fn(critic, latent, h, z)))
    )
    with torch.no_grad():
        assert_bit_identical(fn(critic, latent, h, z), want)
    with torch.inference_mode():
        assert_bit_identical(fn(critic, latent, h, z), want)


def test_a_logits_view_computes_no_value():
    critic, latent, _, _ = critic_and_inputs()
    critic.fast_module()(latent)
    (graph,) = torch_replay.graphs(critic).values()
    assert "aten.mm" in graph.source and "softmax" not in graph.source
    critic.on_latent(latent)
    assert len(torch_replay.graphs(critic)) == 2


def test_a_view_replays_its_own_graph_and_no_grad_calls_skip_the_detaches():
    critic, latent, _, _ = critic_and_inputs()
    view = critic.fast_module()
    want = keras_path(lambda: view(latent))
    view(latent)
    # The view's own graph (a call does not go through the critic's), kept on the critic.
    (graph,) = [g for k, g in torch_replay.graphs(critic).items() if k[0][0][0] == "view"]
    grad_lines = [line for line in graph.source.split("def run_no_grad")[0].splitlines() if "aten.detach" in line]
    no_grad_lines = graph.source.split("def run_no_grad")[1]
    assert grad_lines and "aten.detach" not in no_grad_lines  # the row guard's stop-gradient, autograd only
    for run in ("unguarded", "run"):  # the pass without guards first (on the CPU), then the guarded one
        calls = []
        original = getattr(graph, run + "_no_grad")
        setattr(graph, run + "_no_grad", lambda *args: calls.append(1) or original(*args))
        with torch.no_grad():
            assert_bit_identical(view(latent), want)
        assert calls == [1]
        assert_bit_identical(view(latent), want)
        assert calls == [1]  # autograd on: the run with the detaches
        setattr(graph, run + "_no_grad", original)
        graph.unguarded = graph.unguarded_no_grad = None
    # Ops are called through their bindings (`torch.mm`) where one exists, else through the overload's entry.
    assert torch_replay._callable(torch.ops.aten.mm.default, False) is torch.mm
    assert torch_replay._callable(torch.ops.aten.view.default, False) == torch.ops.aten.view.default._op


def _lines_of(source):
    """`{function name: [its body's lines]}` of a graph's generated source."""
    functions, name = {}, None
    for line in source.splitlines():
        if line.startswith("def "):
            name = line[4 : line.index("(")]
            functions[name] = []
        elif line.strip():
            functions[name].append(line.strip())
    return functions


@pytest.mark.parametrize("options", ["default", "ensemble"])
def test_each_intermediate_is_dropped_after_its_last_use(options):
    # As eager code drops its temporaries: the allocator then reuses blocks still in cache.
    critic, latent, _, _ = critic_and_inputs(**OPTIONS[options])
    critic.on_latent(latent)
    (graph,) = torch_replay.graphs(critic).values()
    for source in (graph.source, graph.unguarded_source):
        for name, body in _lines_of(source).items():
            # Constants (`vN = _aN`, bucket tables) stay: the generated code holds them anyway.
            assigned = [m.group(1) for line in body for m in [re.match(r"(v\d+) = _f", line)] if m]
            returned = set(re.findall(r"v\d+", body[-1]))
            assert body[-1].startswith("return ") and assigned
            for var in assigned:
                uses = [i for i, line in enumerate(body) if re.search(rf"\b{var}\b", line)]
                if var in returned:
                    assert not any(body[i].startswith("del ") for i in uses), (name, var)
                    continue
                dels = [i for i in uses if body[i].startswith("del ")]
                assert len(dels) == 1 and dels[0] == uses[-1], (name, var, body)  # once, after every use
                assert dels[0] - 1 in uses or body[dels[0] - 1].startswith("if not "), (name, var)  # right after
    # A normalisation's row check runs as soon as its statistics exist: a failing call stops there.
    body = _lines_of(graph.unguarded_source)["run_no_grad"]
    check = next(i for i, line in enumerate(body) if line.startswith("if not "))
    assert check < next(i for i, line in enumerate(body) if "aten.silu" in line)


def test_replays_follow_weight_changes_made_in_place():
    critic, latent, h, z = critic_and_inputs()
    view, ema = critic.fast_module(), critic.ema_module()
    view(latent), ema(latent), critic(h, z)  # traced
    optimizer = torch.optim.SGD(view.parameters(), lr=0.5)
    view(latent).square().sum().backward()
    optimizer.step()  # the host's optimizer, in place
    critic.update_ema(0.5)
    for fn in (lambda: view(latent), lambda: ema(latent), lambda: critic(h, z)):
        assert_bit_identical(fn(), keras_path(fn))
    state = {k: v * 0.5 for k, v in view.state_dict().items()}
    view.load_state_dict(state)
    critic.mlp.dense_layers[0].kernel.assign(np.full(tuple(critic.mlp.dense_layers[0].kernel.shape), 0.1, "float32"))
    for fn in (lambda: view(latent), lambda: critic(h, z)):
        assert_bit_identical(fn(), keras_path(fn))


@pytest.mark.parametrize("change", ["quantize", "lora", "layer_policy"])
def test_a_changed_layer_structure_is_traced_anew(change):
    critic, latent, h, z = critic_and_inputs()
    critic(h, z)
    before = dict(torch_replay.graphs(critic))
    if change == "quantize":
        critic.quantize("int8")
    elif change == "layer_policy":
        critic.mlp.dense_layers[0].dtype_policy = "bfloat16"
    else:
        critic.mlp.dense_layers[0].enable_lora(2)
        critic.mlp.dense_layers[0].lora_kernel_b.assign(
            np.ones(tuple(critic.mlp.dense_layers[0].lora_kernel_b.shape), "float32")
        )
    want = keras_path(lambda: critic(h, z))
    assert_bit_identical(critic(h, z), want)
    assert_bit_identical(critic(h, z), want)
    # The signature's graph read the layers as they were: traced again, in its place.
    after = torch_replay.graphs(critic)
    assert after.keys() == before.keys()
    assert all(after[k] is not None and after[k] is not before[k] for k in before)


def test_each_input_signature_has_its_own_graph_up_to_a_limit(monkeypatch):
    critic, _, _, _ = critic_and_inputs()
    monkeypatch.setattr(torch_replay, "MAX_SIGNATURES", 3)
    device = critic.fast_weights[0].value.device
    for rows in range(1, 7):
        latent = torch.randn(rows, critic.latent_size, device=device)
        for _ in range(2):
            assert_bit_identical(critic.on_latent(latent), keras_path(lambda: critic.on_latent(latent)))
    assert len(torch_replay.graphs(critic)) == 3
    half = torch.randn(4, critic.latent_size, dtype=torch.float16, device=device)
    assert_bit_identical(critic.on_latent(half), keras_path(lambda: critic.on_latent(half)))


def test_what_cannot_be_traced_runs_through_keras(monkeypatch):
    critic, latent, h, z = critic_and_inputs()

    def refuse(*args, **kwargs):
        raise RuntimeError("data-dependent")

    monkeypatch.setattr(torch_replay, "make_fx", refuse)
    want = keras_path(lambda: critic(h, z))
    for _ in range(2):
        assert_bit_identical(critic(h, z), want)
    assert list(torch_replay.graphs(critic).values()) == [None]


def test_inputs_are_still_checked_and_non_tensors_take_the_keras_path():
    critic, latent, h, z = critic_and_inputs()
    critic.on_latent(latent)
    with pytest.raises(ValueError, match=r"latent: got shape \[3, 5, 31\], expected \[\.\.\., 32\]"):
        critic.on_latent(latent[..., :-1])
    with pytest.raises(ValueError, match="outputs: got 'probs'"):
        critic.on_latent(latent, outputs="probs")
    numpy_out = critic(to_np(h), to_np(z))
    assert_bit_identical(numpy_out, critic(h, z))
    with keras.StatelessScope():  # the Keras path (a stateless call reads mapped values)
        assert_bit_identical(critic(h, z), keras_path(lambda: critic(h, z)))


def unguarded_result(graph, critic, inputs):
    """What the traced pass without guards returns for `inputs` under no_grad (None: its row check failed)."""
    with torch.no_grad():
        return graph.unguarded_no_grad(*graph.tensors, *inputs)


SCALES = (1e17, 1e20, 1e30, 1e37)  # rows whose first layer reaches past the check's bound (2^55)


@pytest.mark.parametrize("options", ["default", "ensemble"])
def test_rows_past_the_guards_range_run_the_guarded_pass(options):
    critic, latent, _, _ = critic_and_inputs(**OPTIONS[options])
    latent = latent.reshape(-1, critic.latent_size)
    critic.on_latent(latent)  # traced
    (graph,) = torch_replay.graphs(critic).values()
    assert graph.unguarded is not None and unguarded_result(graph, critic, [latent]) is not None
    for scale in SCALES:
        big = latent.clone()
        big[1] *= scale  # one row far out; the others as before
        want = keras_path(lambda: critic.on_latent(big))
        assert all(torch.isfinite(t).all() for t in leaves(want))  # the guards' promise
        assert unguarded_result(graph, critic, [big]) is None, scale  # the check sends it to the guarded pass
        assert_bit_identical(critic.on_latent(big), want)
        with torch.no_grad():
            assert_bit_identical(critic.on_latent(big), want)
    # Large rows within the check's bound: the unguarded pass's own outputs, to the bit.
    for scale in (1e6, 1e10):
        moderate = latent * scale
        assert unguarded_result(graph, critic, [moderate]) is not None
        assert_bit_identical(critic.on_latent(moderate), keras_path(lambda: critic.on_latent(moderate)))


def test_a_non_finite_input_gives_what_the_keras_call_gives():
    critic, latent, _, _ = critic_and_inputs()
    latent = latent.reshape(-1, critic.latent_size)
    critic.on_latent(latent)
    (graph,) = torch_replay.graphs(critic).values()
    for bad in (float("nan"), float("inf")):
        x = latent.clone()
        x[2, 3] = bad
        assert unguarded_result(graph, critic, [x]) is None
        for got, want in zip(leaves(critic.on_latent(x)), leaves(keras_path(lambda: critic.on_latent(x)))):
            assert torch.equal(torch.isnan(got), torch.isnan(want))
            assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))


def test_gradients_of_rows_past_the_range_are_the_keras_calls():
    critic, latent, _, _ = critic_and_inputs(seed=3)
    latent = latent.reshape(-1, critic.latent_size)
    critic.on_latent(latent)
    params = [v.value for v in critic.weights if v.value.requires_grad]
    big = latent.clone()
    big[0] *= 1e25

    def grads():
        value, logits = critic.on_latent(big)
        return torch.autograd.grad(value.sum() + logits.square().sum(), params, allow_unused=True)

    got, want = grads(), keras_path(grads)
    assert_bit_identical([g for g in got if g is not None], [w for w in want if w is not None])


def test_a_first_call_past_the_range_keeps_the_guarded_pass_only():
    critic, latent, _, _ = critic_and_inputs()
    latent = latent.reshape(-1, critic.latent_size)
    big = latent * 1e30
    critic.on_latent(big)  # traced on rows the unguarded pass cannot take: it cannot be checked against them
    (graph,) = torch_replay.graphs(critic).values()
    assert graph.unguarded is None
    assert_bit_identical(critic.on_latent(latent), keras_path(lambda: critic.on_latent(latent)))


def test_normalisations_without_row_statistics_keep_their_guards():
    # RMS normalisation decomposes into plain ops when traced: no row statistics to check.
    critic, latent, _, _ = critic_and_inputs(norm="rms")
    critic.on_latent(latent)
    (graph,) = torch_replay.graphs(critic).values()
    assert graph.unguarded is None
    big = latent * 1e30
    assert_bit_identical(critic.on_latent(big), keras_path(lambda: critic.on_latent(big)))
