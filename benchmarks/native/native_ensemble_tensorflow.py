"""A K-member DreamerV3 critic ensemble train step written by hand in TensorFlow: the vectorised baseline.

What it is: raw `tf.Variable`s holding the K members stacked (kernels
`[K, in, units]`, LayerNorm `[K, units]`, head `[K, units, 255]` /
`[K, 255]`), and the EMA copy likewise. The first layer's input is shared
by the members, so by default its K kernels are viewed as one `[in,
K*units]` matrix (`first_layer="matmul"`: one GEMM, then a reshape and
transpose to `[K, B, units]`); later layers and the head are batched
matmuls `[K, B, units] x [K, units, out]`. One step under `tf.function`:
fast forward, EMA forward, two-hot loss with EMA regulariser (the mean over
members and positions: the mean of the members' losses), `GradientTape`,
`tf.clip_by_global_norm` over all members' gradients, Adam written out with
Keras's epsilon placement (`alpha = lr * sqrt(1 - b2^t) / (1 - b1^t)`,
`w -= alpha * m / (sqrt(v) + eps)`, as `keras.optimizers.Adam`, so one step
agrees with multicritic's), EMA with `assign`.

Neither the plain graph (Grappler + oneDNN) nor XLA (`jit_compile=True`) is
the faster at every size, so `benchmarks/ours/ensemble.py` times both and
compares with the faster (XS, K=5: XLA at batch 256, a tie at 4096). The
first layer as `tf.einsum("bi,kio->kbo")` was slower than the reshaped
matmul in both modes (1049 against 905 ms at batch 4096 in graph mode;
its gradient graph differs).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks.native.native_tensorflow import two_hot_parts  # the same two-hot as the single-critic baseline

NUM_BUCKETS, LOWER, UPPER = 255, -20.0, 20.0


class Ensemble:
    """Holds the stacked variables; `step(h, z, targets, weights)` is one compiled update.

    `first_layer`: `"matmul"` (default: the members' first kernels viewed as
    one `[in, K*units]` matrix, one GEMM) or `"einsum"` (`tf.einsum("bi,kio->kbo")`).
    `jit_compile`: XLA (`True`) or a plain graph (`False`, the default).
    """

    def __init__(
        self,
        members,
        in_dim,
        units,
        layers,
        lr=3e-5,
        eps=1e-5,
        clip=100.0,
        decay=0.98,
        seed=0,
        jit_compile=False,
        first_layer="matmul",
    ):
        rng = np.random.default_rng(seed)
        self.members, self.units, self.layers = members, units, layers
        values = []
        for i in range(layers):
            fan_in = in_dim if i == 0 else units
            limit = np.sqrt(6.0 / (fan_in + units))
            values.append(rng.uniform(-limit, limit, (members, fan_in, units)).astype(np.float32))
            values.append(np.ones((members, units), np.float32))
            values.append(np.zeros((members, units), np.float32))
        values.append(np.zeros((members, units, NUM_BUCKETS), np.float32))
        values.append(np.zeros((members, NUM_BUCKETS), np.float32))
        self.fast = [tf.Variable(v) for v in values]
        self.ema = [tf.Variable(v, trainable=False) for v in values]
        self.m = [tf.Variable(tf.zeros_like(v), trainable=False) for v in values]
        self.s = [tf.Variable(tf.zeros_like(v), trainable=False) for v in values]
        self.t = tf.Variable(0.0, trainable=False)
        self.buckets = tf.linspace(LOWER, UPPER, NUM_BUCKETS)
        self.first_layer = first_layer
        lr, eps, clip, decay = float(lr), float(eps), float(clip), float(decay)

        @tf.function(jit_compile=jit_compile, reduce_retracing=True)
        def step(h, z, targets, weights):
            ema_value, _ = self.forward(self.ema, h, z)
            with tf.GradientTape() as tape:
                _, logits = self.forward(self.fast, h, z)
                loss = self.loss(logits, ema_value, targets, weights)
            grads = tape.gradient(loss, self.fast)
            grads, norm = tf.clip_by_global_norm(grads, clip)
            self.t.assign_add(1.0)
            alpha = lr * tf.sqrt(1 - 0.999**self.t) / (1 - 0.9**self.t)
            for v, g, mv, sv, e in zip(self.fast, grads, self.m, self.s, self.ema):
                mv.assign_add((g - mv) * (1 - 0.9))
                sv.assign_add((tf.square(g) - sv) * (1 - 0.999))
                v.assign_sub(mv * alpha / (tf.sqrt(sv) + eps))
                e.assign(decay * e + (1 - decay) * v)
            return {"total": loss, "grad_norm": norm}

        self.step = step

    def forward(self, w, h, z):
        """`(value_symlog [K, B], logits [K, B, 255])`."""
        x = tf.concat([h, tf.reshape(z, (tf.shape(z)[0], -1))], -1)
        for i in range(self.layers):
            kernel = w[3 * i]
            if i > 0:
                x = tf.matmul(x, kernel)
            elif self.first_layer == "einsum":
                x = tf.einsum("bi,kio->kbo", x, kernel)
            else:
                wide = tf.reshape(tf.transpose(kernel, (1, 0, 2)), (kernel.shape[1], -1))
                x = tf.transpose(tf.reshape(tf.matmul(x, wide), (-1, self.members, self.units)), (1, 0, 2))
            mean = tf.reduce_mean(x, -1, keepdims=True)
            centered = x - mean
            var = tf.reduce_mean(tf.square(centered), -1, keepdims=True)
            x = tf.nn.silu(centered * tf.math.rsqrt(var + 1e-3) * w[3 * i + 1][:, None] + w[3 * i + 2][:, None])
        logits = tf.matmul(x, w[-2]) + w[-1][:, None]
        return tf.reduce_sum(tf.nn.softmax(logits) * self.buckets, -1), logits

    def loss(self, logits, ema_value, targets, weights):
        logp = tf.nn.log_softmax(logits)
        k, kp1, w_k, w_kp1 = two_hot_parts(tf.sign(targets) * tf.math.log1p(tf.abs(targets)))
        ek, ekp1, ew_k, ew_kp1 = two_hot_parts(tf.stop_gradient(ema_value))
        shape = tf.shape(ek)
        idx = tf.stack([tf.broadcast_to(k, shape), tf.broadcast_to(kp1, shape), ek, ekp1], -1)
        w = tf.stack([tf.broadcast_to(w_k, shape), tf.broadcast_to(w_kp1, shape), ew_k, ew_kp1], -1)
        per = -tf.reduce_sum(tf.gather(logp, idx, batch_dims=2) * w, -1)
        return tf.reduce_mean(per * weights)

    def load(self, fast, ema):
        """Sets the fast and EMA variables from lists of stacked arrays in `self.fast`'s order."""
        for var, value in zip(self.fast, fast):
            var.assign(value)
        for var, value in zip(self.ema, ema):
            var.assign(value)


def make_step(members, in_dim, units, layers, **kwargs):
    return Ensemble(members, in_dim, units, layers, **kwargs).step
