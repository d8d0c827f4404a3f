"""The native single-critic baselines (`benchmarks/native/native_*.py`) compute `CriticTrainer`'s step.

From the same weights (fast and EMA), three steps of the current backend's
native step, in each of its variants (two-hot by gather or dense product,
LayerNorm grouping, fused optimizer, donation), give the same losses as `CriticTrainer` and the same fast and EMA
weights (Adam's updates themselves compared, so another epsilon placement or
clipping would show): a ratio measured against them compares the same math.
"""

import importlib
import os
import sys

import keras
import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer
from tests.conftest import BACKEND, randomize, to_np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

BATCH, LR, STEPS = 64, 3e-5, 3


def _module():
    """This backend's native module (each CI session has only its own framework)."""
    return importlib.import_module(f"benchmarks.native.native_{BACKEND}")


def _variants():
    """Every variant of this backend's baseline, as `make_step` keywords (PyTorch: and its compiled step)."""
    from benchmarks import variants

    compiled = [{"jit_compile": True, "two_hot": "gather", "optimizer": "foreach"}] if BACKEND == "torch" else []
    if BACKEND == "torch" and _module().DEVICE == "cuda":
        # The whole step captured by hand as one CUDA graph (a GPU only: `benchmarks/gpu/run.sh` runs this file).
        compiled.append({"jit_compile": "cuda_graph", "two_hot": "gather", "optimizer": "foreach"})
    return variants(_module()) + compiled


def _layers(critic, ema):
    """`[(kernel [in, u], gamma, beta), ...], (head kernel [u, 255], bias)` in Keras's layout."""
    mlp, head = (critic.mlp_ema, critic.return_layer_ema) if ema else (critic.mlp, critic.return_layer)
    layers = [
        tuple(to_np(v.value) for v in (d.kernel, n.gamma, n.beta))
        for d, n in zip(mlp.dense_layers, mlp.layer_normalizations)
    ]
    dense = head.reward_buckets_layer
    return layers, (to_np(dense.kernel.value), to_np(dense.bias.value))


def _flat(structured):
    layers, head = structured
    return [a for layer in layers for a in layer] + list(head)


def _native(critic, in_dim, variant):
    """This backend's native step (`variant`: its `make_step` keywords) started from `critic`'s weights;
    returns `(step, read(which) -> flat list)`."""
    units, layers = critic.dense_hidden_units, critic.num_dense_layers
    fast, ema = _layers(critic, False), _layers(critic, True)
    if BACKEND == "jax":
        from benchmarks.native import native_jax as native

        def tree(structured):
            mlp, (kernel, bias) = structured
            return {
                "mlp": [{"kernel": k, "gamma": g, "beta": b} for k, g, b in mlp],
                "head": {"kernel": kernel, "bias": bias},
            }

        step = native.make_step(in_dim, units, layers, lr=LR, initial=(tree(fast), tree(ema)), **variant)

        def read(which):
            t = step.read(which)
            return [a for layer in t["mlp"] for a in (layer["kernel"], layer["gamma"], layer["beta"])] + [
                t["head"]["kernel"],
                t["head"]["bias"],
            ]

        return step, read
    if BACKEND == "torch":
        from benchmarks.native import native_torch as native

        def named(structured):
            mlp, (kernel, bias) = structured
            out = {}
            for i, (k, g, b) in enumerate(mlp):
                out[f"mlp.{3 * i}.weight"] = np.ascontiguousarray(k.T)  # torch: [out, in]
                out[f"mlp.{3 * i + 1}.weight"], out[f"mlp.{3 * i + 1}.bias"] = g, b
            out["head.weight"], out["head.bias"] = np.ascontiguousarray(kernel.T), bias
            return out

        step = native.make_step(in_dim, units, layers, lr=LR, initial=(named(fast), named(ema)), **variant)

        def read(which):
            d = step.read(which)
            return [
                a
                for i in range(layers)
                for a in (d[f"mlp.{3 * i}.weight"].T, d[f"mlp.{3 * i + 1}.weight"], d[f"mlp.{3 * i + 1}.bias"])
            ] + [d["head.weight"].T, d["head.bias"]]

        return step, read
    from benchmarks.native import native_tensorflow as native

    step = native.make_step(in_dim, units, layers, lr=LR, initial=(_flat(fast), _flat(ema)), **variant)
    return step, step.read


@pytest.mark.parametrize("variant", _variants(), ids=lambda v: "-".join(map(str, v.values())))
def test_native_step_matches_critic_trainer(variant):
    critic = CriticNetwork(
        model_size=None, num_dense_layers=2, dense_hidden_units=32, gru_units=16, num_z_categoricals=4, num_z_classes=4
    )
    randomize(critic, seed=3, scale=0.3)
    rng = np.random.default_rng(7)
    for v in critic.ema_weights:  # an EMA copy that differs from the fast weights
        v.assign(to_np(v.value) + rng.normal(scale=0.05, size=tuple(v.shape)).astype("float32"))
    in_dim = critic.latent_size
    step, read = _native(critic, in_dim, variant)
    trainer = CriticTrainer(critic, learning_rate=LR)
    for i in range(STEPS):
        h = np.tanh(rng.normal(size=(BATCH, critic.gru_units))).astype("float32")
        z = np.eye(critic.num_z_classes, dtype="float32")[
            rng.integers(0, critic.num_z_classes, size=(BATCH, critic.num_z_categoricals))
        ]
        targets = (rng.normal(size=BATCH) * 30).astype("float32")
        weights = rng.uniform(0.5, 1.0, size=BATCH).astype("float32")
        before = _flat(_layers(critic, False))
        theirs = step(*(keras.ops.convert_to_tensor(x) for x in (h, z, targets, weights)))
        ours = trainer.train_step(h, z, targets, weights)
        np.testing.assert_allclose(
            float(to_np(theirs["total"])), float(to_np(ours["total"])), rtol=1e-5, err_msg=f"step {i}"
        )
        np.testing.assert_allclose(float(to_np(theirs["grad_norm"])), float(to_np(ours["grad_norm"])), rtol=1e-4)
        for g, w, b in zip(read("fast"), _flat(_layers(critic, False)), before):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
            # Adam's update itself (~lr per weight): to 1e-3, plus two ulps of the weight.
            slack = 1e-3 * np.abs(w - b) + 1e-3 * LR + 2 * np.spacing(np.abs(b).astype("float32"))
            assert np.all(np.abs((g - b) - (w - b)) <= slack), (i, np.max(np.abs((g - b) - (w - b)) - slack))
        for g, w in zip(read("ema"), _flat(_layers(critic, True))):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's hand-captured step")
def test_the_hand_captured_step_needs_a_cuda_device():
    if _module().DEVICE == "cuda":
        pytest.skip("a CUDA device: the step is compared with CriticTrainer's above")
    with pytest.raises(ValueError, match="jit_compile: got 'cuda_graph' without a CUDA device"):
        _module().make_step(8, 4, 1, jit_compile="cuda_graph")
