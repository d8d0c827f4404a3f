"""What the first layer's overflow guards cost a PyTorch forward pass, op by op, in context.

The one-source MLP runs its first Dense on the input times 2^-32 (so that no
finite input overflows the matmul) and, before PyTorch's fused LayerNorm,
brings rows whose largest |x| is past 2^56 down to it (abs, amax, a factor,
a multiply). This times the critic's replayed ops written out by hand, with
and without each guard, in alternating blocks in one process (under
`torch.no_grad()`, XS sizes), against the same ops without guards:

    python benchmarks/ours/overflow_guard_cost.py --batch 256

The in-context cost is larger than the ops' own time: the scaled input is
written just before the matmul reads it, where the unguarded matmul reads
an input that stays in the CPU's caches.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def variants(batch, in_dim=1280, units=256, buckets=255):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    x = torch.randn(batch, in_dim)
    kernel, head = torch.randn(in_dim, units) * 0.05, torch.randn(units, buckets) * 0.05
    gamma, beta, bias, one = torch.ones(units), torch.zeros(units), torch.zeros(buckets), torch.tensor(1.0)
    scale, limit = 2.0**-32, 2.0**56

    def row_guard(y):
        peak = torch.amax(torch.abs(y), [-1], True)
        return torch.mul(y, torch.minimum(torch.mul(torch.reciprocal(peak), limit), one))

    def rest(y, epsilon=1e-3):
        return torch.add(torch.mm(F.silu(torch.native_layer_norm(y, [units], gamma, beta, epsilon)[0]), head), bias)

    scaled_epsilon = 1e-3 * scale**2  # the LayerNorm of the scaled product: the unscaled one's output
    return {
        "no guard": lambda: rest(torch.mm(x, kernel)),
        "input scale": lambda: rest(torch.mm(torch.mul(x, scale), kernel), scaled_epsilon),
        "kernel scale": lambda: rest(torch.mm(x, torch.mul(kernel, scale)), scaled_epsilon),
        "row guard": lambda: rest(row_guard(torch.mm(x, kernel))),
        "input scale + row guard": lambda: rest(row_guard(torch.mm(torch.mul(x, scale), kernel)), scaled_epsilon),
    }


def main(argv=None):
    from benchmarks.ours.forward_views import variants_main

    variants_main(__doc__, variants, "no guard", "variant", argv)


if __name__ == "__main__":
    main()
