"""The critic train step written by hand with raw tf.Variables and tf.function: the baseline.

Same math as the reference; `tf.raw_ops`-level ops only where TF has them
(matmul, moments, softmax), Adam written out with Keras's epsilon placement,
global-norm clipping with tf.clip_by_global_norm, EMA with assign.

Variants tried (`benchmarks/ours/baseline_variants.py`, XS, 2 vCPUs, medians of 5
alternating blocks, ms per step at batch 256 / 4096 / 15360; the file
`results_baseline_variants.json`), LayerNorm grouping x two-hot loss:
written out `(x - mean) * rsqrt(var + eps) * gamma + beta` with the two-hot
by gather 6.39 / 61.38 / 240.0; `tf.nn.batch_normalization` (`rsqrt(var +
eps) * gamma` first) + gather 6.81 / 61.42 / 244.7; written + dense two-hot
product 6.63 / 62.96 / 245.4; batch_normalization + dense 6.65 / 63.72 /
253.1. `benchmarks.options_for(native, batch)` takes the fastest at the nearest
measured batch.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

NUM_BUCKETS, LOWER, UPPER = 255, -20.0, 20.0


def two_hot_parts(v):
    delta = (UPPER - LOWER) / (NUM_BUCKETS - 1)
    v = tf.clip_by_value(v, LOWER, UPPER)
    idx = (v - LOWER) / delta
    k, kp1 = tf.floor(idx), tf.math.ceil(idx)
    kp1 = tf.where(k == kp1, kp1 + 1, kp1)
    kp1 = tf.where(kp1 == NUM_BUCKETS, kp1 - 2, kp1)
    b_k, b_kp1 = LOWER + k * delta, LOWER + kp1 * delta
    w_k = (v - b_kp1) / (b_k - b_kp1)
    return tf.cast(k, tf.int32), tf.cast(kp1, tf.int32), w_k, 1 - w_k


# Variants of the step (`make_step` keywords), computing the same math.
VARIANTS = {"layer_norm": ("batch_normalization", "written"), "two_hot": ("gather", "dense")}


# The fastest measured per batch (benchmarks/ours/baseline_variants.py, XS; see the module docstring).
FASTEST = {
    256: {"layer_norm": "written", "two_hot": "gather"},
    4096: {"layer_norm": "written", "two_hot": "gather"},
    15360: {"layer_norm": "written", "two_hot": "gather"},
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
    jit_compile=False,
    initial=None,
    layer_norm="batch_normalization",
    two_hot="gather",
):
    """`step(h, z, targets, weights) -> metrics`; `initial`: `(fast, ema)` lists (per layer kernel, gamma,
    beta; then head kernel, bias) to start from (`step.read("fast" | "ema")` reads them back); `layer_norm`,
    `two_hot`: the variant (see `VARIANTS`)."""
    if layer_norm not in VARIANTS["layer_norm"] or two_hot not in VARIANTS["two_hot"]:
        raise ValueError(f"layer_norm, two_hot: got {layer_norm!r}, {two_hot!r}, expected one of each of {VARIANTS}.")
    rng = np.random.default_rng(seed)

    def variables(trainable):
        out = []
        for i in range(layers):
            fan_in = in_dim if i == 0 else units
            limit = np.sqrt(6.0 / (fan_in + units))
            out.append(tf.Variable(rng.uniform(-limit, limit, (fan_in, units)).astype(np.float32), trainable=trainable))
            out.append(tf.Variable(tf.ones(units), trainable=trainable))
            out.append(tf.Variable(tf.zeros(units), trainable=trainable))
        out.append(tf.Variable(tf.zeros((units, NUM_BUCKETS)), trainable=trainable))
        out.append(tf.Variable(tf.zeros(NUM_BUCKETS), trainable=trainable))
        return out

    fast, ema = variables(True), variables(False)
    for e, f in zip(ema, fast):
        e.assign(f)
    if initial is not None:
        for variables_, values in zip((fast, ema), initial):
            for v, value in zip(variables_, values):
                v.assign(value)
    m = [tf.Variable(tf.zeros_like(v)) for v in fast]
    s = [tf.Variable(tf.zeros_like(v)) for v in fast]
    t = tf.Variable(0.0)
    buckets = tf.linspace(LOWER, UPPER, NUM_BUCKETS)

    def forward(w, h, z):
        x = tf.concat([h, tf.reshape(z, (tf.shape(z)[0], -1))], -1)
        for i in range(layers):
            x = tf.matmul(x, w[3 * i])
            mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
            if layer_norm == "batch_normalization":
                x = tf.nn.batch_normalization(x, mean, var, w[3 * i + 2], w[3 * i + 1], 1e-3)
            else:  # "written": ((x - mean) * rsqrt(var + eps)) * gamma + beta
                x = (x - mean) * tf.math.rsqrt(var + 1e-3) * w[3 * i + 1] + w[3 * i + 2]
            x = tf.nn.silu(x)
        logits = tf.matmul(x, w[-2]) + w[-1]
        return tf.reduce_sum(tf.nn.softmax(logits) * buckets, -1), logits

    @tf.function(jit_compile=jit_compile, reduce_retracing=True)
    def step(h, z, targets, weights):
        ema_value, _ = forward(ema, h, z)
        with tf.GradientTape() as tape:
            _, logits = forward(fast, h, z)
            logp = tf.nn.log_softmax(logits)
            k, kp1, w_k, w_kp1 = two_hot_parts(tf.sign(targets) * tf.math.log1p(tf.abs(targets)))
            ek, ekp1, ew_k, ew_kp1 = two_hot_parts(ema_value)
            idx = tf.stack([k, kp1, ek, ekp1], -1)
            w = tf.stack([w_k, w_kp1, ew_k, ew_kp1], -1)
            if two_hot == "gather":
                per = -tf.reduce_sum(tf.gather(logp, idx, batch_dims=1) * w, -1)
            else:  # "dense": both encodings as [B, 255] distributions (one-hot sums)
                target = tf.reduce_sum(tf.one_hot(idx, NUM_BUCKETS) * w[..., None], -2)
                per = -tf.reduce_sum(logp * target, -1)
            loss = tf.reduce_mean(per * weights)
        grads = tape.gradient(loss, fast)
        grads, norm = tf.clip_by_global_norm(grads, clip)
        t.assign_add(1.0)
        alpha = lr * tf.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        for v, g, mv, sv, e in zip(fast, grads, m, s, ema):
            mv.assign_add((g - mv) * 0.1)
            sv.assign_add((tf.square(g) - sv) * 0.001)
            v.assign_sub(alpha * mv / (tf.sqrt(sv) + eps))
            e.assign(decay * e + (1 - decay) * v)
        return {"total": loss, "grad_norm": norm}

    step.read = lambda which: [v.numpy() for v in (fast if which == "fast" else ema)]
    return step
