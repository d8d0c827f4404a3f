"""The body of tests/interop/test_flax_nnx.py, in a process of its own: Keras's NNX mode is chosen when Keras is
imported (`KERAS_NNX_ENABLED`), and the suite's process imported it without.

`python -m tests.interop.flax_nnx_case OUT.json` trains a tiny critic with `nnx.Optimizer` and `nnx.jit`,
compares one step's gradient with multicritic's own (`stateless_call` under `jax.grad`), runs the JAX page's
Flax NNX examples, and writes what it measured to OUT.json; the test asserts on it.
"""

import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ["KERAS_NNX_ENABLED"] = "true"

import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from multicritic import CriticNetwork, CriticTrainer, critic_loss  # noqa: E402
from tests.docs import blocks  # noqa: E402

SIZES = dict(model_size=None, num_dense_layers=1, dense_hidden_units=16, gru_units=8, num_z_categoricals=2)
FAST = nnx.All(keras.Variable, lambda path, v: v.trainable)


def values(variables):
    return [np.array(v.value) for v in variables]


def tiny_critic(h, z, seed=0, trunk="mlp"):
    """Called once eagerly (the critic's compiled eager pass is made then: a transform's copy of the critic
    must not reuse it), fast and EMA weights drawn apart, no zero head (the trunk gets a gradient)."""
    critic = CriticNetwork(**SIZES, num_z_classes=3, trunk=trunk)
    critic(h, z)
    rng = np.random.default_rng(seed)
    for v in critic.weights:
        value = rng.normal(0.0, 0.3, tuple(v.shape)).astype("float32")
        if v.path.endswith("/moving_variance"):  # a batch norm's (XQC's trunk): positive, as a variance is
            value = np.abs(value) + 1.0
        v.assign(value)
    critic(h, z)
    return critic


def nnx_gradient(loss, model, *args):
    """`nnx.grad` of `loss(model, *args)` over the trainable weights, in `model.trainable_variables`' order (an
    NNX state's leaves come in the order of their paths)."""
    grads = nnx.grad(loss, argnums=nnx.DiffState(0, FAST))(model, *args)
    found = jax.tree.leaves(nnx.state(model, FAST), is_leaf=lambda x: isinstance(x, nnx.Variable))
    by_path = {v.path: g for v, g in zip(found, jax.tree.leaves(grads))}
    return [by_path[v.path] for v in model.trainable_variables]


def loss_fn(critic, h, z, targets, weights):
    _, logits = critic(h, z)
    ema_value, _ = critic(h, z, use_ema=True)
    return critic_loss(logits, targets, ema_value, weights, **critic.loss_options())["total"]


def own_gradient(critic, h, z, targets, weights):
    """multicritic's gradient: the critic's pure function of its weights under `jax.grad`."""
    ema = [v.value for v in critic.non_trainable_variables]

    def loss(fast):
        (_, logits), _ = critic.stateless_call(fast, ema, h, z)
        (ema_value, _), _ = critic.stateless_call(fast, ema, h, z, use_ema=True)
        return critic_loss(logits, targets, ema_value, weights, **critic.loss_options())["total"]

    return jax.grad(loss)([v.value for v in critic.trainable_variables])


def main(out_path):
    rng = np.random.default_rng(1)
    h = rng.normal(size=(32, 8)).astype("float32")
    z = rng.random((32, 2, 3)).astype("float32")
    targets, weights = (5 * rng.normal(size=32)).astype("float32"), rng.uniform(0.5, 1.0, 32).astype("float32")
    out = {"nnx_enabled": keras.config.is_nnx_enabled()}

    critic = tiny_critic(h, z)
    out["is_nnx_module"] = isinstance(critic, nnx.Module)
    trainable = critic.trainable_variables
    out["trainable_shapes"] = [list(v.shape) for v in trainable]
    out["trainable_paths"] = [v.path for v in trainable]

    # The optimizers' state: over the trainable weights, and over `nnx.Param` (Flax's examples' `wrt`), which
    # Keras's variables are not.
    def state_shapes(optimizer):
        return sorted(list(x.shape) for x in jax.tree.leaves(nnx.state(optimizer, nnx.OptState)) if x.ndim)

    out["param_optimizer_state_shapes"] = state_shapes(nnx.Optimizer(critic, optax.adam(1e-2), wrt=nnx.Param))
    optimizer = nnx.Optimizer(critic, optax.adam(1e-2), wrt=FAST)
    out["optimizer_state_shapes"] = state_shapes(optimizer)

    # One step's gradient, eagerly (`nnx.grad` merges a copy of the critic holding its tracers), against ours.
    want = own_gradient(critic, h, z, targets, weights)
    got = nnx_gradient(loss_fn, critic, h, z, targets, weights)
    out["gradient"] = [[np.asarray(g).tolist(), np.asarray(w).tolist()] for g, w in zip(got, want)]
    # Every other trunk's, by weight path: each holds its layers where NNX's graph sees them.
    out["trunk_gradients"] = {}
    for trunk in ("residual", "simba_v2", "xqc"):
        other = tiny_critic(h, z, trunk=trunk)
        want = own_gradient(other, h, z, targets, weights)
        got = nnx_gradient(loss_fn, other, h, z, targets, weights)
        out["trunk_gradients"][trunk] = {
            v.path: [np.asarray(g).tolist(), np.asarray(w).tolist()]
            for v, g, w in zip(other.trainable_variables, got, want)
        }

    @nnx.jit
    def train_step(critic, optimizer, h, z, targets, weights):
        loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, FAST))(critic, h, z, targets, weights)
        optimizer.update(critic, grads)
        return loss

    fast_before, ema_before = values(trainable), values(critic.non_trainable_variables)
    out["losses"] = [float(train_step(critic, optimizer, h, z, targets, weights)) for _ in range(5)]
    out["fast_moved"] = [bool(np.any(a != b)) for a, b in zip(fast_before, values(trainable))]
    out["ema_unchanged"] = all(np.array_equal(a, b) for a, b in zip(ema_before, values(critic.non_trainable_variables)))
    # The Keras variables hold what NNX trained: the critic's own eager call reads them.
    got_loss = float(loss_fn(critic, h, z, targets, weights))
    out["eager_loss_after"] = got_loss

    # Keras itself: a model holding layers in a list attribute (Keras's TrackedList; multicritic's parts hold theirs
    # in tuples), its gradient under nnx.grad against its own pure function's.
    class Blocks(keras.Model):
        def __init__(self):
            super().__init__()
            self.blocks = [keras.layers.Dense(4), keras.layers.Dense(1)]

        def call(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    model = Blocks()
    model(h)
    model_loss = lambda m: jnp.sum(m(h) ** 2)  # noqa: E731
    got = nnx_gradient(model_loss, model)
    want = jax.grad(lambda fast: jnp.sum(model.stateless_call(fast, [], h)[0] ** 2))(
        [v.value for v in model.trainable_variables]
    )
    out["keras_list_gradient"] = [[np.asarray(g).tolist(), np.asarray(w).tolist()] for g, w in zip(got, want)]

    # multicritic's own trainer and files in this mode.
    trainer = CriticTrainer(critic)
    metrics = trainer.train_step(h, z, targets, weights)
    out["trainer_loss_finite"] = bool(np.isfinite(float(metrics["total"] if "total" in metrics else metrics["loss"])))
    path = os.path.join(os.path.dirname(out_path), "critic.keras")
    critic.save(path)
    again = keras.models.load_model(path)
    out["keras_file_same_logits"] = bool(np.array_equal(np.asarray(again(h, z)[1]), np.asarray(critic(h, z)[1])))

    # The JAX page's examples, as a reader runs them (in this process: Keras is in NNX mode here).
    os.chdir(os.path.dirname(out_path))
    for name in ("flax-nnx", "flax-nnx-linen"):
        block = blocks.named(name)
        blocks.run(block.code, block.id)
        out[f"ran {name}"] = True
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
