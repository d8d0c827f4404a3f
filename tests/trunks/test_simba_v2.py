"""The SimbaV2 trunk against the authors' JAX layers and the paper's equations: forward pass, the projection
after an update, the projection in every trainer step (and not in a skipped one), its options."""

import math
import os

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer
from multicritic.trunks import TRUNKS
from tests.conftest import randomize, random_inputs, to_np
from tests.trunks import assert_refused

GOLDENS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "simba_v2_goldens.npz")
SimbaV2Trunk = TRUNKS["simba_v2"]


def l2n(x, axis=-1):
    return x / np.maximum(np.linalg.norm(x, axis=axis, keepdims=True), 1e-8)


def reference(x, weights, *, blocks, width, expansion=4, c_shift=3.0):
    """SimbaV2's encoder (paper Sec. 4, Eqs. 4-9) in float64 numpy, `weights` by the trunk's variable names:
    embedding `normalize(scaler(normalize([x, c]) W))`, then per block
    `normalize(h + alpha (normalize(relu(scaler(h W0)) W1) - h))`; a scaler is `s * init / scale`."""
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    gain = math.sqrt(2.0 / width)
    inner = gain / math.sqrt(expansion)
    x = l2n(np.concatenate([x, np.full(x.shape[:-1] + (1,), c_shift)], -1))
    h = l2n(x @ w["embedding/kernel"] * (w["embedding_scaler/scaler"] * gain / gain))
    for i in range(blocks):
        branch = (h @ w[f"block_{i}_dense_0/kernel"]) * (w[f"block_{i}_scaler/scaler"] * inner / inner)
        branch = l2n((np.maximum(branch, 0.0) + 1e-8) @ w[f"block_{i}_dense_1/kernel"])
        alpha = w[f"block_{i}_alpha/scaler"] * (1.0 / (blocks + 1)) / (1.0 / math.sqrt(width))
        h = l2n(h + alpha * (branch - h))
    return h


def trunk_weights(trunk):
    return {v.path.split("/", 1)[1]: to_np(v.value) for v in trunk.weights}


def set_weights(trunk, weights):
    for v in trunk.weights:
        v.assign(weights[v.path.split("/", 1)[1]])


def test_forward_and_projection_are_the_authors_code():
    """tests/data/simba_v2_goldens.npz: outputs of SimbaV2's Flax layers (`HyperEmbedder`, two
    `HyperLERPBlock`s) and of its `l2normalize_network` on given parameters (see its generator)."""
    golden = np.load(GOLDENS)
    trunk = SimbaV2Trunk(model_size=None, num_dense_layers=2, dense_hidden_units=8)
    trunk.build((None, golden["x"].shape[-1]))
    set_weights(trunk, {k[len("params/") :]: golden[k] for k in golden.files if k.startswith("params/")})
    np.testing.assert_allclose(to_np(trunk(golden["x"])), golden["output"], rtol=2e-6, atol=2e-6)
    trunk.after_update()
    for name, value in trunk_weights(trunk).items():
        np.testing.assert_allclose(value, golden[f"projected/{name}"], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("members", [None, 2])
def test_forward_is_the_papers_equations(members):
    """Other options (expansion, c_shift, members, leading dims) against the numpy reference."""
    blocks, width, d = 2, 6, 5
    trunk = SimbaV2Trunk(
        model_size=None, num_dense_layers=blocks, dense_hidden_units=width, expansion=2, c_shift=1.5, members=members
    )
    trunk.build((None, d))
    rng = np.random.default_rng(3)
    for v in trunk.weights:
        v.assign(rng.normal(scale=0.7, size=tuple(v.shape)).astype("float32"))
    x = rng.normal(size=(2, 3, d)).astype("float32")
    got = to_np(trunk([x[..., :2], x[..., 2:]]))  # the input in parts, with leading dims
    weights = trunk_weights(trunk)
    for m in [None] if members is None else range(members):
        one = weights if m is None else {k: v[m] for k, v in weights.items()}
        want = reference(x, one, blocks=blocks, width=width, expansion=2, c_shift=1.5)
        np.testing.assert_allclose(got if m is None else got[m], want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, rtol=1e-5)


def test_kernels_start_on_the_sphere_and_after_update_projects_only_them():
    trunk = SimbaV2Trunk(model_size=None, num_dense_layers=1, dense_hidden_units=4, members=3)
    trunk.build((None, 7))
    kernels = [layer.kernel for layer in trunk.dense_layers]
    for k in kernels:  # each member's output units: unit columns from the start
        np.testing.assert_allclose(np.linalg.norm(to_np(k), axis=-2), 1.0, rtol=1e-6)
    rng = np.random.default_rng(4)
    for v in trunk.weights:
        v.assign(rng.normal(size=tuple(v.shape)).astype("float32"))
    before = trunk_weights(trunk)
    trunk.after_update()
    for name, value in trunk_weights(trunk).items():
        want = before[name] / np.linalg.norm(before[name], axis=-2, keepdims=True) if "kernel" in name else before[name]
        np.testing.assert_allclose(value, want, rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_every_trainer_step_projects_the_fast_kernels_before_the_ema_update(jit_compile):
    """The hook runs inside the backend's step (eager and compiled): after a step every fast kernel has unit
    columns, and the slow copy is the EMA of the projected weights, not projected itself (the authors' code)."""
    critic = CriticNetwork(model_size="nano", trunk="simba_v2", ema_decay=0.5)
    randomize(critic, seed=5)  # every weight off the sphere, the slow copy a copy of the fast one
    trainer = CriticTrainer(critic, learning_rate=1e-2, jit_compile=jit_compile)
    h, z = random_inputs(critic, 6)
    targets = np.random.default_rng(6).normal(scale=20.0, size=6).astype("float32")
    ema_before = [to_np(v.value) for v in critic.ema_weights]
    metrics = trainer.train_step(h, z, targets, np.ones(6, "float32"))
    assert float(to_np(metrics["step_skipped"])) == 0.0
    fast = {v.path: to_np(v.value) for v in critic.fast_weights}
    for layer in critic.mlp.dense_layers:
        np.testing.assert_allclose(np.linalg.norm(fast[layer.kernel.path], axis=-2), 1.0, rtol=1e-5)
    for f, e, old in zip(critic.fast_weights, critic.ema_weights, ema_before):
        np.testing.assert_allclose(to_np(e.value), 0.5 * old + 0.5 * to_np(f.value), rtol=1e-5, atol=1e-6)
    ema_kernel = to_np(critic.mlp_ema.embedding.kernel.value)
    assert not np.allclose(np.linalg.norm(ema_kernel, axis=-2), 1.0, rtol=1e-3)


def test_a_skipped_step_does_not_project():
    critic = CriticNetwork(model_size="nano", trunk="simba_v2")
    randomize(critic, seed=7)
    trainer = CriticTrainer(critic, learning_rate=1e-2)
    before = [to_np(v.value) for v in critic.weights]
    h, z = random_inputs(critic, 4)
    # Negative loss weights (a backend tensor: no host check refuses them first) skip the step inside it.
    weights = keras.ops.convert_to_tensor(np.full(4, -1.0, "float32"))
    metrics = trainer.train_step(h, z, np.ones(4, "float32"), weights)
    assert float(to_np(metrics["step_skipped"])) == 1.0
    for got, want in zip(critic.weights, before):
        np.testing.assert_array_equal(to_np(got.value), want)


def test_a_host_loop_projects_with_after_update():
    """`critic.after_update()`: what a host training with its own optimizer calls after each update."""
    critic = CriticNetwork(model_size="nano", trunk="simba_v2")
    randomize(critic, seed=8)
    ema = [to_np(v.value) for v in critic.ema_weights]
    critic.after_update()
    for layer in critic.mlp.dense_layers:
        np.testing.assert_allclose(np.linalg.norm(to_np(layer.kernel), axis=-2), 1.0, rtol=1e-5)
    for got, want in zip(critic.ema_weights, ema):
        np.testing.assert_array_equal(to_np(got.value), want)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"norm": "rms"}, r"^norm: got 'rms' with trunk='simba_v2', expected 'layer'"),
        ({"use_bias": True}, r"^use_bias: got True with trunk='simba_v2', expected False"),
        ({"expansion": 0}, r"^expansion: got 0, expected an integer >= 1"),
        ({"c_shift": float("nan")}, r"^c_shift: got nan, expected a finite number"),
        ({"norm_epsilon": 0.0}, r"^norm_epsilon: got 0\.0, expected a finite number > 0"),
    ],
)
def test_bad_options_are_refused_naming_them(options, message):
    assert_refused("simba_v2", options, message)
