"""The native vectorised ensemble baselines (`benchmarks/native/native_ensemble_*.py`) compute multicritic's step.

From the same weights (fast and EMA), one step of the current backend's
native ensemble gives the same loss as a K=3 `CriticNetwork` trained by
`CriticTrainer`, and the same updated fast and EMA weights (Adam's update
itself compared, so a different epsilon placement would show).
"""

import os
import sys

import numpy as np
import pytest

from multicritic import CriticNetwork, CriticTrainer
from tests.conftest import BACKEND, randomize, to_np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

MEMBERS, BATCH, LR = 3, 64, 3e-5


def _stacked(critic, ema):
    """`[(kernel [K, in, u], gamma [K, u], beta [K, u]), ...], (head kernel [K, u, 255], bias [K, 255])`."""
    mlp, head = (critic.mlp_ema, critic.return_layer_ema) if ema else (critic.mlp, critic.return_layer)
    layers = [
        tuple(to_np(v.value) for v in (dense.kernel, norm.gamma, norm.beta))
        for dense, norm in zip(mlp.dense_layers, mlp.layer_normalizations)
    ]
    bias = to_np(head.reward_buckets_layer.bias.value)
    return layers, (to_np(head.reward_buckets_layer.kernel.value), bias.reshape(bias.shape[0], -1))  # [K, 1, 255]


def _native(critic, in_dim):
    """The native ensemble of this backend, loaded with `critic`'s weights; returns (step, read-back)."""
    units, layers = critic.dense_hidden_units, critic.num_dense_layers
    fast, ema = _stacked(critic, False), _stacked(critic, True)
    if BACKEND == "jax":
        import jax.numpy as jnp

        from benchmarks.native import native_ensemble_jax as native

        def tree(stacked):
            mlp, (kernel, bias) = stacked
            return {
                "mlp": [{"kernel": jnp.asarray(k), "gamma": jnp.asarray(g), "beta": jnp.asarray(b)} for k, g, b in mlp],
                "head": {"kernel": jnp.asarray(kernel), "bias": jnp.asarray(bias)},
            }

        model = native.Ensemble(MEMBERS, in_dim, units, layers, params=tree(fast), ema=tree(ema))

        def read(which):
            t = model.state[0 if which == "fast" else 1]
            mlp = [tuple(np.asarray(layer[k]) for k in ("kernel", "gamma", "beta")) for layer in t["mlp"]]
            return mlp, (np.asarray(t["head"]["kernel"]), np.asarray(t["head"]["bias"]))

        return model.step, read
    if BACKEND == "torch":
        pytest.importorskip("torch.func")
        from benchmarks.native import native_ensemble_torch as native

        model = native.Ensemble(MEMBERS, in_dim, units, layers)

        def named(stacked):
            mlp, (kernel, bias) = stacked
            out = {}
            for i, (k, g, b) in enumerate(mlp):
                out[f"mlp.{3 * i}.weight"] = np.ascontiguousarray(np.swapaxes(k, 1, 2))  # torch: [out, in]
                out[f"mlp.{3 * i + 1}.weight"], out[f"mlp.{3 * i + 1}.bias"] = g, b
            out["head.weight"], out["head.bias"] = np.ascontiguousarray(np.swapaxes(kernel, 1, 2)), bias
            return out

        model.load(named(fast), named(ema))

        def read(which):
            d = {k: v.detach().numpy() for k, v in (model.params if which == "fast" else model.ema).items()}
            mlp = [
                (np.swapaxes(d[f"mlp.{3 * i}.weight"], 1, 2), d[f"mlp.{3 * i + 1}.weight"], d[f"mlp.{3 * i + 1}.bias"])
                for i in range(layers)
            ]
            return mlp, (np.swapaxes(d["head.weight"], 1, 2), d["head.bias"])

        return model.step, read
    from benchmarks.native import native_ensemble_tensorflow as native

    model = native.Ensemble(MEMBERS, in_dim, units, layers, jit_compile=False)

    def flat(stacked):
        mlp, head = stacked
        return [a for layer in mlp for a in layer] + list(head)

    model.load(flat(fast), flat(ema))

    def read(which):
        values = [v.numpy() for v in (model.fast if which == "fast" else model.ema)]
        return [tuple(values[3 * i : 3 * i + 3]) for i in range(layers)], (values[-2], values[-1])

    return model.step, read


def _flat(stacked):
    mlp, head = stacked
    return [a for layer in mlp for a in layer] + list(head)


@pytest.mark.parametrize("size", ["nano"])
def test_native_ensemble_step_matches_multicritic(size):
    import keras

    critic = CriticNetwork(model_size=size, ensemble_size=MEMBERS)
    randomize(critic, seed=3, scale=0.3)
    rng = np.random.default_rng(7)
    for v in critic.ema_weights:  # an EMA copy that differs from the fast weights
        v.assign(to_np(v.value) + rng.normal(scale=0.05, size=tuple(v.shape)).astype("float32"))
    in_dim = critic.gru_units + critic.num_z_categoricals * critic.num_z_classes
    h = np.tanh(rng.normal(size=(BATCH, critic.gru_units))).astype("float32")
    z = np.eye(critic.num_z_classes, dtype="float32")[
        rng.integers(0, critic.num_z_classes, size=(BATCH, critic.num_z_categoricals))
    ]
    targets = (rng.normal(size=BATCH) * 30).astype("float32")
    weights = rng.uniform(0.5, 1.0, size=BATCH).astype("float32")

    fast_before, ema_before = _flat(_stacked(critic, False)), _flat(_stacked(critic, True))
    step, read = _native(critic, in_dim)
    theirs = step(*(keras.ops.convert_to_tensor(x) for x in (h, z, targets, weights)))
    ours = CriticTrainer(critic, learning_rate=LR).train_step(h, z, targets, weights)

    np.testing.assert_allclose(float(to_np(theirs["total"])), float(to_np(ours["total"])), rtol=1e-5)
    np.testing.assert_allclose(float(to_np(theirs["grad_norm"])), float(to_np(ours["grad_norm"])), rtol=1e-4)
    for which, before in (("fast", fast_before), ("ema", ema_before)):
        got, want = _flat(read(which)), _flat(_stacked(critic, which == "ema"))
        for g, w, b in zip(got, want, before):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
            # The step itself (Adam's update is ~lr per weight): to 1e-3, plus the float32 rounding of the
            # updated weights (two ulps of the weight).
            slack = 1e-3 * np.abs(w - b) + 1e-3 * LR + 2 * np.spacing(np.abs(b).astype("float32"))
            assert np.all(np.abs((g - b) - (w - b)) <= slack), np.max(np.abs((g - b) - (w - b)) - slack)
