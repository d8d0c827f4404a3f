"""A K-member DreamerV3 critic ensemble train step written by hand in pure JAX: the vectorised baseline.

What it is: the parameters are a pytree whose every leaf has a leading
member axis `K` (kernels `[K, in, units]`, LayerNorm `[K, units]`, head
`[K, units, 255]` / `[K, 255]`). One member's forward pass is written for
unstacked parameters and mapped over the members with `jax.vmap(forward,
in_axes=(0, None, None))` (the inputs are shared, so XLA folds the members of
the first layer into one `[B, in] x [in, K*units]` GEMM and the head becomes a
batched matmul). The whole step (fast and EMA forward, two-hot loss with EMA
regulariser, grad, global-norm clip over all members' gradients, Adam, EMA)
is one `jax.jit` with the state donated. The loss is the mean of the
members' losses (the targets and weights are shared), as multicritic's.

Adam: written out with Keras's epsilon placement (`alpha = lr * sqrt(1 -
b2^t) / (1 - b1^t)`, `w -= alpha * m / (sqrt(v) + eps)`) so that one step
agrees with multicritic's Keras Adam; optax's `adam` puts epsilon after the
bias correction (`m_hat / (sqrt(v_hat) + eps)`), a different update for
gradients near epsilon. Both cost the same.

Alternatives tried (XS, K=5, batch 4096, 2 CPU cores shared with other
work, jax 0.10; loss + gradient of fast and EMA forward only, medians of 5
alternating runs): this vmap formulation, whose activations are member-major
`[K, B, units]`, 1350 ms; the same math written with `jnp.einsum` on
stacked weights in multicritic's layout (activations `[B, K, units]`,
`"bi,kio->bko"`, `"bki,kio->bko"`, logits transposed to `[K, B, 255]` at
the end), 1503 ms (+11%; in multicritic's compiled forward pass, which has
that layout, XLA:CPU lowers the head to a plain `dot` between transposes
where the vmap form gets a fused YNNPACK batched matmul). optax's
`clip_by_global_norm + adam` is not used only because of the epsilon
placement above; the update is elementwise over 2M parameters, well under 1%
of the step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.native.native_jax import forward, loss_from  # one member: the single-critic baseline's

NUM_BUCKETS, LOWER, UPPER = 255, -20.0, 20.0


def init(rng, members, in_dim, units, layers):
    """Stacked parameters: glorot-uniform kernels per member, LayerNorm ones/zeros, zero head."""
    params = {"mlp": []}
    for i in range(layers):
        fan_in = in_dim if i == 0 else units
        limit = np.sqrt(6.0 / (fan_in + units))
        params["mlp"].append(
            {
                "kernel": jnp.asarray(rng.uniform(-limit, limit, size=(members, fan_in, units)), jnp.float32),
                "gamma": jnp.ones((members, units), jnp.float32),
                "beta": jnp.zeros((members, units), jnp.float32),
            }
        )
    params["head"] = {
        "kernel": jnp.zeros((members, units, NUM_BUCKETS), jnp.float32),
        "bias": jnp.zeros((members, NUM_BUCKETS), jnp.float32),
    }
    return params


ensemble_forward = jax.vmap(forward, in_axes=(0, None, None))


def loss_fn(params, ema, h, z, targets, weights):
    _, logits = ensemble_forward(params, h, z)
    ema_value, _ = ensemble_forward(ema, h, z)
    ema_value = jax.lax.stop_gradient(ema_value)
    losses = jax.vmap(loss_from, in_axes=(0, 0, None, None))(logits, ema_value, targets, weights)
    return losses.mean()


def global_norm(tree):
    return jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree_util.tree_leaves(tree)))


def make_update(lr=3e-5, eps=1e-5, clip=100.0, decay=0.98, beta_1=0.9, beta_2=0.999):
    """The pure step `(params, ema, (m, v, t), h, z, targets, weights) -> (params, ema, opt, metrics)`."""

    def update(params, ema, opt, h, z, targets, weights):
        loss, grads = jax.value_and_grad(loss_fn)(params, ema, h, z, targets, weights)
        norm = global_norm(grads)
        factor = clip * jnp.minimum(1.0 / norm, 1.0 / clip)  # tf.clip_by_global_norm's factor
        grads = jax.tree_util.tree_map(lambda g: g * factor, grads)
        m, v, t = opt
        t = t + 1.0
        alpha = lr * jnp.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        m = jax.tree_util.tree_map(lambda m, g: m + (g - m) * (1 - beta_1), m, grads)
        v = jax.tree_util.tree_map(lambda v, g: v + (jnp.square(g) - v) * (1 - beta_2), v, grads)
        params = jax.tree_util.tree_map(lambda p, m, v: p - m * alpha / (jnp.sqrt(v) + eps), params, m, v)
        ema = jax.tree_util.tree_map(lambda e, p: decay * e + (1 - decay) * p, ema, params)
        return params, ema, (m, v, t), {"total": loss, "grad_norm": norm}

    return update


class Ensemble:
    """Holds the state; `step(h, z, targets, weights)` runs one jitted, donated update."""

    def __init__(
        self, members, in_dim, units, layers, lr=3e-5, eps=1e-5, clip=100.0, decay=0.98, seed=0, params=None, ema=None
    ):
        params = init(np.random.default_rng(seed), members, in_dim, units, layers) if params is None else params
        ema = jax.tree_util.tree_map(jnp.copy, params) if ema is None else ema
        zeros = lambda: jax.tree_util.tree_map(jnp.zeros_like, params)  # noqa: E731
        self.state = [params, ema, (zeros(), zeros(), jnp.zeros((), jnp.float32))]
        self._update = jax.jit(make_update(lr, eps, clip, decay), donate_argnums=(0, 1, 2))

    def step(self, h, z, targets, weights):
        *self.state, metrics = self._update(*self.state, h, z, targets, weights)
        return metrics


def make_step(members, in_dim, units, layers, **kwargs):
    return Ensemble(members, in_dim, units, layers, **kwargs).step
