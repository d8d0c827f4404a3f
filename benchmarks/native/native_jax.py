"""The critic train step written by hand in pure JAX + optax: the baseline multicritic must match.

Parameters are a pytree of arrays, the whole step (fast and EMA forward,
loss, grad, optax clip, Adam with Keras's epsilon placement (the trainer's),
EMA) is one `jax.jit` with donated state.

Variants tried (`benchmarks/ours/baseline_variants.py`, XS, 2 vCPUs, medians of 5
alternating blocks, ms per step at batch 256 / 4096 / 15360; the file
`results_baseline_variants.json`): two-hot by gather, state donated 4.56 /
77.24 / 284.5; gather, not donated 5.05 / 74.74 / 292.7; dense two-hot
product, donated 4.58 / 77.61 / 290.7; dense, not donated 5.13 / 78.49 /
294.6. `benchmarks.options_for(native, batch)` takes the fastest at the nearest
measured batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

NUM_BUCKETS, LOWER, UPPER = 255, -20.0, 20.0
BUCKETS = np.linspace(LOWER, UPPER, NUM_BUCKETS, dtype=np.float32)


def init(rng, in_dim, units, layers):
    params = {"mlp": []}
    for i in range(layers):
        fan_in = in_dim if i == 0 else units
        limit = np.sqrt(6.0 / (fan_in + units))
        params["mlp"].append(
            {
                "kernel": jnp.asarray(rng.uniform(-limit, limit, size=(fan_in, units)), jnp.float32),
                "gamma": jnp.ones(units, jnp.float32),
                "beta": jnp.zeros(units, jnp.float32),
            }
        )
    params["head"] = {"kernel": jnp.zeros((units, NUM_BUCKETS)), "bias": jnp.zeros(NUM_BUCKETS)}
    return params


def _matmul(x, kernel, dtype):
    """`x @ kernel` computed in `dtype` (bfloat16: Keras's mixed precision, inputs and kernel cast), float32 out."""
    return (x.astype(dtype) @ kernel.astype(dtype)).astype(jnp.float32)


def forward(params, h, z, dtype=jnp.float32):
    x = jnp.concatenate([h, z.reshape(z.shape[0], -1)], -1)
    for layer in params["mlp"]:
        x = _matmul(x, layer["kernel"], dtype)
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        x = jax.nn.silu((x - mean) * jax.lax.rsqrt(var + 1e-3) * layer["gamma"] + layer["beta"])
    logits = _matmul(x, params["head"]["kernel"], dtype) + params["head"]["bias"]
    return (jax.nn.softmax(logits) * BUCKETS).sum(-1), logits


def two_hot_parts(v):
    delta = (UPPER - LOWER) / (NUM_BUCKETS - 1)
    v = jnp.clip(v, LOWER, UPPER)
    idx = (v - LOWER) / delta
    k, kp1 = jnp.floor(idx), jnp.ceil(idx)
    kp1 = jnp.where(k == kp1, kp1 + 1, kp1)
    kp1 = jnp.where(kp1 == NUM_BUCKETS, kp1 - 2, kp1)
    b_k, b_kp1 = LOWER + k * delta, LOWER + kp1 * delta
    w_k = (v - b_kp1) / (b_k - b_kp1)
    return k.astype(jnp.int32), kp1.astype(jnp.int32), w_k, 1 - w_k


def loss_from(logits, ema_value, targets, weights, two_hot="gather"):
    """The DreamerV3 critic loss (two-hot NLL + two-hot of the EMA's value), weighted mean over positions:
    `"gather"` picks the two log-probabilities of each encoding, `"dense"` builds both encodings as
    `[B, 255]` distributions (one-hot sums) and takes their product with the log-probabilities."""
    logp = jax.nn.log_softmax(logits)
    k, kp1, w_k, w_kp1 = two_hot_parts(jnp.sign(targets) * jnp.log1p(jnp.abs(targets)))
    ek, ekp1, ew_k, ew_kp1 = two_hot_parts(ema_value)
    idx = jnp.stack([k, kp1, ek, ekp1], -1)
    w = jnp.stack([w_k, w_kp1, ew_k, ew_kp1], -1)
    if two_hot == "gather":
        per = -(jnp.take_along_axis(logp, idx, -1) * w).sum(-1)
    elif two_hot == "dense":
        target = (jax.nn.one_hot(idx, NUM_BUCKETS) * w[..., None]).sum(-2)
        per = -(logp * target).sum(-1)
    else:
        raise ValueError(f"two_hot: got {two_hot!r}, expected 'gather' or 'dense'.")
    return (per * weights).mean()


# Variants of the step (`make_step` keywords), computing the same math.
VARIANTS = {"two_hot": ("gather", "dense"), "donate": (True, False)}
# The fastest measured per batch (benchmarks/ours/baseline_variants.py, XS; see the module docstring).
FASTEST = {
    256: {"two_hot": "gather", "donate": True},
    4096: {"two_hot": "gather", "donate": False},
    15360: {"two_hot": "gather", "donate": True},
}


def make_step(
    in_dim,
    units,
    layers,
    lr=3e-5,
    eps=1e-5,
    clip=100.0,
    decay=0.98,
    seed=0,
    initial=None,
    two_hot="gather",
    donate=True,
    precision="float32",
):
    """`step(h, z, targets, weights) -> metrics`; `initial`: `(params, ema)` pytrees to start from
    (`step.read("fast" | "ema")` reads them back); `two_hot`, `donate` (the state's buffers to the step): the
    variant (see `VARIANTS`); `precision="bfloat16"`: the matmuls in bfloat16 (weights kept in float32)."""
    if precision not in ("float32", "bfloat16"):
        raise ValueError(f"precision: got {precision!r}, expected 'float32' or 'bfloat16'.")
    dtype = jnp.bfloat16 if precision == "bfloat16" else jnp.float32
    params = init(np.random.default_rng(seed), in_dim, units, layers)
    if initial is not None:
        params = jax.tree_util.tree_map(jnp.asarray, initial[0])
    ema = jax.tree_util.tree_map(jnp.copy, params if initial is None else initial[1])

    def zeros():
        return jax.tree_util.tree_map(jnp.zeros_like, params)

    state = [params, ema, (zeros(), zeros(), jnp.zeros((), jnp.float32))]

    def loss_fn(params, ema, h, z, targets, weights):
        _, logits = forward(params, h, z, dtype)
        ema_value, _ = forward(ema, h, z, dtype)
        return loss_from(logits, jax.lax.stop_gradient(ema_value), targets, weights, two_hot)

    def adam(grads, opt_state, params):
        # Keras's epsilon placement (`lr_t * m / (sqrt(v) + eps)`, as CriticTrainer's); optax.adam adds
        # epsilon after the bias correction.
        m, v, count = opt_state
        count = count + 1.0
        alpha = lr * jnp.sqrt(1.0 - 0.999**count) / (1.0 - 0.9**count)
        m = jax.tree_util.tree_map(lambda m, g: m + (g - m) * 0.1, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: v + (g * g - v) * 0.001, v, grads)
        params = jax.tree_util.tree_map(lambda p, m, v: p - alpha * m / (jnp.sqrt(v) + eps), params, m, v)
        return params, (m, v, count)

    def _step(params, ema, opt_state, h, z, targets, weights):
        loss, grads = jax.value_and_grad(loss_fn)(params, ema, h, z, targets, weights)
        norm = optax.global_norm(grads)
        grads, _ = optax.clip_by_global_norm(clip).update(grads, optax.EmptyState())
        params, opt_state = adam(grads, opt_state, params)
        ema = jax.tree_util.tree_map(lambda e, p: decay * e + (1 - decay) * p, ema, params)
        return params, ema, opt_state, {"total": loss, "grad_norm": norm}

    step_jit = jax.jit(_step, donate_argnums=(0, 1, 2) if donate else ())

    def step(h, z, targets, weights):
        state[0], state[1], state[2], metrics = step_jit(state[0], state[1], state[2], h, z, targets, weights)
        return metrics

    step.read = lambda which: jax.tree_util.tree_map(np.asarray, state[0 if which == "fast" else 1])
    return step
