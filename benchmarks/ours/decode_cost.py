"""What the symmetric value decode costs a PyTorch forward pass, in context, against the plain decode.

`multicritic.bins.expected_value` decodes over the bucket pairs around the
centre (`diff = p_hi - flip(p_lo)`, weighted by the upper bucket where
`diff > 0` and by the lower one elsewhere), so that a symmetric distribution
decodes to exactly 0 in any summation order and a two-hot target keeps
RLlib's round-trip accuracy. This times the XS forward pass (the replayed
ops written out by hand, no guards, under `torch.no_grad()`) ending in each
decode, in alternating blocks in one process, against the same pass ending in
the plain `(softmax(logits) * buckets).sum(-1)`:

    python benchmarks/ours/decode_cost.py --batch 256

"pairs, one weight" is the pair decode with the same weight on both sides,
which the default float32 support (not exactly antisymmetric) does not allow
without losing the two-hot round trip's accuracy on one side; it is timed to
size that trade.
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

    def pairs(p):
        return torch.sub(p[:, buckets - m:], torch.flip(p[:, :m], [-1]))

    def two_weights(p):
        diff = pairs(p)
        above = torch.relu(diff)
        return torch.sum(torch.add(torch.mul(above, upper), torch.mul(torch.sub(diff, above), lower)), [-1])

    return {
        "plain": lambda p: torch.sum(torch.mul(p, plain_table), [-1]),
        "pairs, two weights (ours)": two_weights,
        "pairs, one weight": lambda p: torch.sum(torch.mul(pairs(p), upper), [-1]),
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
