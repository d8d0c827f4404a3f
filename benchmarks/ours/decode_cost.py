"""What the symmetric value decode costs a PyTorch forward pass, in context, against the plain decode.

`multicritic.math.bins.expected_value` sums mirrored pairs of buckets over whole
rows, `sum((p - flip(p)) * a_lower)` with `a` the support made exactly
antisymmetric (zero past the middle), so that a symmetric distribution decodes to exactly 0 in any
summation order. This times the XS forward pass (the replayed ops
written out by hand, no guards, under `torch.no_grad()`) ending in each
decode, in alternating blocks in one process, against the same pass ending
in the plain `(softmax(logits) * buckets).sum(-1)`:

    python benchmarks/ours/decode_cost.py --batch 256

"linear, half rows" is the same sum over the lower half's pairs (`(p_lo -
flip(p_hi)) * a`: two strided slices). "relu, whole rows" is the library's
form before: `sum(relu(p - flip(p)) * buckets)`, the relu written `(d + d
sign(d)) / 2`, each pair counted at its larger side's own bucket (seven
ops).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def decoders(buckets=255):
    """`{name: decode(probs [B, buckets]) -> [B]}`, each decode's ops as the replay runs them."""
    import numpy as np
    import torch

    from multicritic.math.bins import bucket_values

    support = bucket_values(buckets)
    m = buckets // 2
    plain_table = torch.tensor(support)
    antisymmetric = torch.tensor(((support.astype(np.float64) - support[::-1]) / 2)[:m].astype(np.float32))
    half = plain_table / 2
    half[m] = 0.0

    def linear_half_rows(p):
        return torch.sum(torch.mul(torch.sub(p[:, :m], torch.flip(p[:, buckets - m :], [-1])), antisymmetric), [-1])

    lower = torch.cat([antisymmetric, torch.zeros(buckets - m)])

    def linear_whole_rows(p):
        return torch.sum(torch.mul(torch.sub(p, torch.flip(p, [-1])), lower), [-1])

    def relu_whole_rows(p):
        diff = torch.sub(p, torch.flip(p, [-1]))
        return torch.sum(torch.mul(torch.add(diff, torch.mul(diff, torch.sign(diff))), half), [-1])

    return {
        "plain": lambda p: torch.sum(torch.mul(p, plain_table), [-1]),
        "linear, whole rows (ours)": linear_whole_rows,
        "linear, half rows": linear_half_rows,
        "relu, whole rows": relu_whole_rows,
    }


def variants(batch, in_dim=1280, units=256, buckets=255):
    """`{name: forward pass ending in that decode}` at XS sizes."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    x = torch.randn(batch, in_dim)
    kernel, head = torch.randn(in_dim, units) * 0.05, torch.randn(units, buckets) * 0.05
    gamma, beta, bias = torch.ones(units), torch.zeros(units), torch.zeros(buckets)

    def probs():
        y = torch.native_layer_norm(torch.mm(x, kernel), [units], gamma, beta, 1e-3)[0]
        return torch._softmax(torch.add(torch.mm(F.silu(y), head), bias), -1, False)

    return {name: (lambda decode=decode: decode(probs())) for name, decode in decoders(buckets).items()}


def main(argv=None):
    from benchmarks.ours.forward_views import variants_main

    variants_main(__doc__, variants, "plain", "decode", argv)


if __name__ == "__main__":
    main()
