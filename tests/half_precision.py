"""Half-precision checks whose tolerances come from the formats' precision, never from one machine's results.

A half-precision forward pass may round differently on another CPU (native float16 arithmetic rounds after
every operation; other CPUs keep float32 intermediates; a matmul may accumulate in either). The checks here
make the part that could differ exact, and bound the rest by the format's unit roundoff `u`:

- `exact_dense_case`: a one-hidden-layer critic whose first Dense kernel holds multiples of 1/8 in
  [-1/4, 1/4], and inputs in {-1, 0, 1} (`h`, a few per row) and one-hot `z`. Every product and every partial
  sum of its dot products is then a multiple of 1/8 of magnitude at most 64 * 1/4 = 16: 128 steps of 1/8,
  exact in bfloat16 (8 significant bits: 256 steps) and float16 (11 bits), in any summation order and
  accumulator width. The pre-activations are exact in every format.
- `bounds`: what rounds after it. The normalisation runs in float32 (a few float32 roundings, 16 * 2^-24 of
  its terms) and its half output rounds once (u |y|); SiLU in half precision moves by at most
  1.1 |dy| (|silu'| <= 1.1) plus 5 roundings of its result (the sigmoid's exp, sum and quotient, the
  product, one spare); the float32 head maps that through |V| (plus its own float32 sum of `units + 1`
  terms). A factor 2 covers the second-order terms (relative size |dlogit|, below 2 %).
- `decode_bound`: the value is the float32 head's decode of the logits the pass returned: compared with the
  float64 decode of those same logits, to float32's precision (a float32 path, compared as such).
"""

from __future__ import annotations

import numpy as np

from tests import numpy_reference as ref

# Unit roundoff: each rounding to the format is the exact value times (1 + d), |d| <= u.
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}
# Inputs per row: nonzero entries of h (z is one-hot: one per categorical).
H_NONZERO = 32


def half_dtype(policy: str) -> str:
    return {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}[policy]


def exact_dense_case(critic, batch: int, seed: int = 0):
    """Sets `critic`'s first Dense kernels (fast and EMA, every member, different draws) to multiples of 1/8
    in [-1/4, 1/4], its norms' scale to 1 + N(0, 0.1), offset and head to N(0, 0.05); returns `(h, z)` on
    which its pre-activations are exact in any format (module docstring)."""
    assert critic.num_dense_layers == 1
    assert H_NONZERO + critic.num_z_categoricals <= 128  # partial sums within 16 (the docstring's bound)
    rng = np.random.default_rng(seed)
    for mlp, head in ((critic.mlp, critic.return_layer), (critic.mlp_ema, critic.return_layer_ema)):
        dense, norm = mlp.dense_layers[0], mlp.layer_normalizations[0]
        dense.kernel.assign(rng.integers(-2, 3, size=tuple(dense.kernel.shape)).astype("float32") / 8.0)
        norm.gamma.assign((1.0 + rng.normal(0.0, 0.1, size=tuple(norm.gamma.shape))).astype("float32"))
        if norm.beta is not None:
            norm.beta.assign(rng.normal(0.0, 0.05, size=tuple(norm.beta.shape)).astype("float32"))
        for var in head.weights:
            var.assign(rng.normal(0.0, 0.05, size=tuple(var.shape)).astype("float32"))
    h = np.zeros((batch, critic.gru_units), "float32")
    for row in h:
        columns = rng.choice(critic.gru_units, size=min(H_NONZERO, critic.gru_units), replace=False)
        row[columns] = rng.choice([-1.0, 1.0], size=len(columns))
    z = np.zeros((batch, critic.num_z_categoricals, critic.num_z_classes), "float32")
    picks = rng.integers(0, critic.num_z_classes, size=(batch, critic.num_z_categoricals))
    np.put_along_axis(z, picks[..., None], 1.0, axis=-1)
    return h, z


def _members(critic):
    """float64 reference parameters per member (one for a single critic), fast and EMA."""
    from multicritic import CriticNetwork

    if critic.ensemble_size == 1:
        return [(ref.params_from(critic), ref.params_from(critic, ema=True))]
    config = dict(critic.get_config(), ensemble_size=1, aggregation="mean", dtype="float32")
    out = []
    for k in range(critic.ensemble_size):
        single = CriticNetwork.from_config(config)
        single.set_weights(critic.get_member_weights(k))
        out.append((ref.params_from(single), ref.params_from(single, ema=True)))
    return out


def logits_bound(critic, h, z, dtype: str, use_ema: bool = False):
    """`(logits, bound)`: the float64 reference logits (`[B, units]`, an ensemble's `[K, B, units]`) and the
    bound on how far a forward pass computing the MLP in `dtype` (the head in float32) can be from them, on
    an `exact_dense_case` (module docstring)."""
    u, f32 = UNIT_ROUNDOFF[dtype], UNIT_ROUNDOFF["float32"]
    logits_all, bounds_all = [], []
    for fast, ema in _members(critic):
        params = ema if use_ema else fast
        ((kernel, g, b),) = params[0]
        _, logits, (cache, features) = ref.forward(params, h, z, keep=True)
        x, xhat, _, y = cache[0]
        assert np.array_equal(x @ kernel, (x @ kernel * 8).round() / 8), "pre-activations off the 1/8 grid"
        assert np.abs(y).max() < 10.0  # no sigmoid underflow in half precision
        dy = u * np.abs(y) + 16 * f32 * (np.abs(g * xhat) + np.abs(b))
        ds = 1.1 * dy + 5 * u * np.abs(features)
        head_kernel, head_bias = params[1], params[2]
        head_terms = np.abs(features) @ np.abs(head_kernel) + np.abs(head_bias)
        logits_all.append(logits)
        bounds_all.append(2 * (ds @ np.abs(head_kernel) + (head_kernel.shape[0] + 1) * f32 * head_terms) + 1e-7)
    if critic.ensemble_size == 1:
        return logits_all[0], bounds_all[0]
    return np.stack(logits_all), np.stack(bounds_all)


def decode_bound(critic, logits):
    """`(value, bound)`: the float64 decode of float32 `logits` by `critic`'s head, and the bound on its float32
    computation (a sum of `num_buckets` terms: that many float32 roundings of sum p |b|; MSE: exact)."""
    logits = np.asarray(logits, np.float64)
    if critic.head == "mse":
        return logits[..., 0], np.full(logits.shape[:-1], 1e-30)
    probs = ref.softmax(logits)
    buckets = ref.uniform_buckets(logits.shape[-1])
    value = probs @ buckets
    f32 = UNIT_ROUNDOFF["float32"]
    return value, 2 * (logits.shape[-1] + 4) * f32 * (probs @ np.abs(buckets)) + 1e-7


def assert_within(got, want, bound, what=""):
    """Every element of `got` within `bound` of `want`."""
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    excess = np.abs(got - want) / bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess.max() <= 1.0, (
        f"{what}: {excess.max():.3g} of the bound at {worst}: got {got[worst]!r}, "
        f"want {want[worst]!r} +- {bound[worst]!r}"
    )
