"""What the symmetric value decode costs a PyTorch forward pass, in context, against the plain decode.

`multicritic.bins.expected_value` pairs each bucket with its mirror around
the centre and counts only the part of the larger probability above the
smaller, at its own bucket (`sum(relu(p - flip(p)) * buckets)`, the relu
written `(d + d sign(d)) / 2`), so that a symmetric distribution decodes to exactly
0 in any summation order and a two-hot target keeps RLlib's round-trip
accuracy. This times the XS forward pass (the replayed ops written out by
hand, no guards, under `torch.no_grad()`) ending in each decode, in
alternating blocks in one process, against the same pass ending in the plain
`(softmax(logits) * buckets).sum(-1)`:

    python benchmarks/ours/decode_cost.py --batch 256

"half rows" is the same decode over the upper half's pairs (`p_hi -
flip(p_lo)`, one weight per side), the library's form until it was replaced:
the same terms, four more ops.
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

    from multicritic.bins import bucket_values

    support = bucket_values(buckets)
    m = buckets // 2
    lower = torch.tensor(-np.ascontiguousarray(support[:m][::-1]))
    upper = torch.tensor(support[buckets - m:])
    plain_table = torch.tensor(support)
    half = plain_table / 2
    half[m] = 0.0

    def whole_rows(p):
        diff = torch.sub(p, torch.flip(p, [-1]))
        return torch.sum(torch.mul(torch.add(diff, torch.mul(diff, torch.sign(diff))), half), [-1])

    def half_rows(p):
        diff = torch.sub(p[:, buckets - m:], torch.flip(p[:, :m], [-1]))
        above = torch.relu(diff)
        return torch.sum(torch.add(torch.mul(above, upper), torch.mul(torch.sub(diff, above), lower)), [-1])

    return {
        "plain": lambda p: torch.sum(torch.mul(p, plain_table), [-1]),
        "pairs, whole rows (ours)": whole_rows,
        "pairs, half rows": half_rows,
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

    variants_main(__doc__, variants, 'plain', 'decode', argv)


if __name__ == "__main__":
    main()
