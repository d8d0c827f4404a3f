"""An independent float64 numpy implementation of the critic, its loss and its train step.

Written from the paper's and SPEC's formulas, not from the library: bucket
search by `np.searchsorted`, backprop by hand, Adam written out. Tests compare
the library on every backend against these numbers.
"""

from __future__ import annotations

import numpy as np

EPS_LN = 1e-3


def symlog(x):
    return np.sign(x) * np.log1p(np.abs(x))


def symexp(y):
    return np.sign(y) * np.expm1(np.abs(y))


def uniform_buckets(n=255, lo=-20.0, hi=20.0):
    return lo + np.arange(n, dtype=np.float64) * (hi - lo) / (n - 1)


def symexp_buckets(n=255, lo=-20.0, hi=20.0):
    return symexp(np.linspace(lo, hi, n))


def two_hot_on(values, buckets):
    """Two-hot over an increasing support by bracket search and linear interpolation."""
    values = np.clip(np.asarray(values, np.float64), buckets[0], buckets[-1])
    n = len(buckets)
    k = np.clip(np.searchsorted(buckets, values, side="right") - 1, 0, n - 2)
    frac = (values - buckets[k]) / (buckets[k + 1] - buckets[k])
    out = np.zeros(values.shape + (n,))
    np.put_along_axis(out, k[..., None], (1.0 - frac)[..., None], axis=-1)
    np.put_along_axis(out, (k + 1)[..., None], frac[..., None], axis=-1)
    return out


def two_hot(values_symlog, n=255, lo=-20.0, hi=20.0, scheme="uniform_symlog"):
    if scheme == "uniform_symlog":
        return two_hot_on(values_symlog, uniform_buckets(n, lo, hi))
    return two_hot_on(symexp(np.clip(values_symlog, lo, hi)), symexp_buckets(n, lo, hi))


def softmax(logits):
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def log_softmax(logits):
    m = logits.max(-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lambda_returns(rewards, continues, values, gamma=0.997, lam=0.95):
    rewards, continues, values = (np.asarray(a, np.float64) for a in (rewards, continues, values))
    horizon = values.shape[0] - 1
    out = np.zeros((horizon,) + values.shape[1:])
    ret = values[horizon]
    for t in range(horizon - 1, -1, -1):
        ret = rewards[t + 1] + gamma * continues[t + 1] * ((1 - lam) * values[t + 1] + lam * ret)
        out[t] = ret
    return out


def dream_loss_weights(continues, gamma=0.997):
    continues = np.asarray(continues, np.float64)
    t = np.arange(continues.shape[0]).reshape((-1,) + (1,) * (continues.ndim - 1))
    return gamma**t * np.cumprod(continues, axis=0)


def params_from(critic, ema=False):
    """The critic's weights as float64 numpy: ([(kernel, gamma, beta)...], head_kernel, head_bias)."""
    import keras

    mlp = critic.mlp_ema if ema else critic.mlp
    head = critic.return_layer_ema if ema else critic.return_layer
    layers = [
        (
            np.asarray(keras.ops.convert_to_numpy(d.kernel), np.float64),
            np.asarray(keras.ops.convert_to_numpy(n.gamma), np.float64),
            np.asarray(keras.ops.convert_to_numpy(n.beta), np.float64),
        )
        for d, n in zip(mlp.dense_layers, mlp.layer_normalizations)
    ]
    dense = head.reward_buckets_layer
    return (
        layers,
        np.asarray(keras.ops.convert_to_numpy(dense.kernel), np.float64),
        np.asarray(keras.ops.convert_to_numpy(dense.bias), np.float64),
    )


def forward(params, h, z, buckets=None, scheme="uniform_symlog", keep=False):
    layers, head_k, head_b = params
    x = np.concatenate([np.asarray(h, np.float64), np.asarray(z, np.float64).reshape(len(h), -1)], -1)
    cache = []
    for kernel, g, b in layers:
        a = x @ kernel
        mu = a.mean(-1, keepdims=True)
        var = ((a - mu) ** 2).mean(-1, keepdims=True)
        xhat = (a - mu) / np.sqrt(var + EPS_LN)
        y = g * xhat + b
        cache.append((x, xhat, var, y))
        x = y * sigmoid(y)
    logits = x @ head_k + head_b
    n = head_k.shape[1]
    if scheme == "uniform_symlog":
        value = softmax(logits) @ (uniform_buckets(n) if buckets is None else buckets)
    else:
        value = symlog(softmax(logits) @ symexp_buckets(n))
    if keep:
        return value, logits, (cache, x)
    return value, logits


def loss_and_grads(params, ema_params, h, z, targets, weights):
    """Reference loss (two-hot of EMA mean, weight 1) and its gradients by hand."""
    value, logits, (cache, x_last) = forward(params, h, z, keep=True)
    ema_value, _ = forward(ema_params, h, z)
    n_pos = len(h)
    t_val = two_hot(symlog(targets))
    t_ema = two_hot(ema_value)
    lp = log_softmax(logits)
    nll = -(lp * t_val).sum(-1)
    reg = -(lp * t_ema).sum(-1)
    total = np.mean((nll + reg) * weights)
    dlogits = (weights / n_pos)[:, None] * (2.0 * softmax(logits) - t_val - t_ema)
    layers, head_k, _ = params
    g_head_k = x_last.T @ dlogits
    g_head_b = dlogits.sum(0)
    dx = dlogits @ head_k.T
    g_layers = []
    for (kernel, g, b), (x, xhat, var, y) in reversed(list(zip(layers, cache))):
        s = sigmoid(y)
        dy = dx * s * (1.0 + y * (1.0 - s))
        dg = (dy * xhat).sum(0)
        db = dy.sum(0)
        dxhat = dy * g
        da = (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True)) / np.sqrt(
            var + EPS_LN
        )
        g_layers.append((x.T @ da, dg, db))
        dx = da @ kernel.T
    grads = (g_layers[::-1], g_head_k, g_head_b)
    parts = {"total": total, "value_nll": nll.mean(), "ema_regularizer": reg.mean()}
    return parts, grads


def flatten(params):
    layers, k, b = params
    out = []
    for triple in layers:
        out.extend(triple)
    return out + [k, b]


def unflatten(flat, like):
    layers = [tuple(flat[3 * i : 3 * i + 3]) for i in range(len(like[0]))]
    return layers, flat[-2], flat[-1]


class Trainer:
    """Clip by global norm, Keras-style Adam, then EMA: the reference step in float64."""

    def __init__(self, params, ema_params, lr=3e-5, eps=1e-5, clip=100.0, decay=0.98, b1=0.9, b2=0.999):
        self.w = [a.copy() for a in flatten(params)]
        self.e = [a.copy() for a in flatten(ema_params)]
        self.m = [np.zeros_like(a) for a in self.w]
        self.v = [np.zeros_like(a) for a in self.w]
        self.t = 0
        self.like = params
        self.lr, self.eps, self.clip, self.decay, self.b1, self.b2 = lr, eps, clip, decay, b1, b2

    def step(self, h, z, targets, weights):
        parts, grads = loss_and_grads(
            unflatten(self.w, self.like), unflatten(self.e, self.like), h, z, targets, weights
        )
        g = flatten(grads)
        norm = np.sqrt(sum((x**2).sum() for x in g))
        g = [x * min(1.0, self.clip / norm) for x in g]
        self.t += 1
        alpha = self.lr * np.sqrt(1 - self.b2**self.t) / (1 - self.b1**self.t)
        for i, gi in enumerate(g):
            self.m[i] = self.m[i] + (gi - self.m[i]) * (1 - self.b1)
            self.v[i] = self.v[i] + (gi**2 - self.v[i]) * (1 - self.b2)
            self.w[i] = self.w[i] - alpha * self.m[i] / (np.sqrt(self.v[i]) + self.eps)
        self.e = [self.decay * e + (1 - self.decay) * w for e, w in zip(self.e, self.w)]
        parts["grad_norm"] = norm
        return parts
