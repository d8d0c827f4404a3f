"""The critic train step written by hand in plain PyTorch: the baseline multicritic must match.

nn.Linear / nn.LayerNorm / SiLU modules, an EMA copy with requires_grad off,
the two-hot cross-entropy by gathering two buckets, torch.optim.Adam
(foreach), clip_grad_norm_ (foreach), EMA with _foreach ops; with
`jit_compile`, the update goes through torch.compile (PyTorch's "compiled
optimizer" recipe). Same math as the reference critic step.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

NUM_BUCKETS, LOWER, UPPER = 255, -20.0, 20.0


class Critic(nn.Module):
    def __init__(self, in_dim, units, layers):
        super().__init__()
        blocks = []
        for i in range(layers):
            blocks += [nn.Linear(in_dim if i == 0 else units, units, bias=False), nn.LayerNorm(units, eps=1e-3), nn.SiLU()]
        self.mlp = nn.Sequential(*blocks)
        self.head = nn.Linear(units, NUM_BUCKETS)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.register_buffer("buckets", torch.linspace(LOWER, UPPER, NUM_BUCKETS))

    def forward(self, h, z):
        logits = self.head(self.mlp(torch.cat([h, z.flatten(1)], -1))).float()
        return (logits.softmax(-1) * self.buckets).sum(-1), logits


def two_hot_parts(v):
    delta = (UPPER - LOWER) / (NUM_BUCKETS - 1)
    v = v.clamp(LOWER, UPPER)
    idx = (v - LOWER) / delta
    k, kp1 = idx.floor(), idx.ceil()
    kp1 = torch.where(k == kp1, kp1 + 1, kp1)
    kp1 = torch.where(kp1 == NUM_BUCKETS, kp1 - 2, kp1)
    b_k, b_kp1 = LOWER + k * delta, LOWER + kp1 * delta
    w_k = (v - b_kp1) / (b_k - b_kp1)
    return k.long(), kp1.long(), w_k, 1 - w_k


def symlog(x):
    return torch.sign(x) * torch.log1p(x.abs())


def make_step(in_dim, units, layers, lr=3e-5, eps=1e-5, clip=100.0, decay=0.98, jit_compile=False):
    critic = Critic(in_dim, units, layers)
    ema = copy.deepcopy(critic).requires_grad_(False)
    params = list(critic.parameters())
    ema_params = list(ema.parameters())
    optimizer = torch.optim.Adam(params, lr=lr, eps=eps, foreach=True)

    def step(h, z, targets, weights):
        _, logits = critic(h, z)
        with torch.no_grad():
            ema_value, _ = ema(h, z)
        logp = logits.log_softmax(-1)
        k, kp1, w_k, w_kp1 = two_hot_parts(symlog(targets))
        ek, ekp1, ew_k, ew_kp1 = two_hot_parts(ema_value)
        idx = torch.stack([k, kp1, ek, ekp1], -1)
        w = torch.stack([w_k, w_kp1, ew_k, ew_kp1], -1)
        per = -(logp.gather(-1, idx) * w).sum(-1)
        loss = (per * weights).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return {"total": loss.detach(), "grad_norm": update()}

    def update():
        norm = nn.utils.clip_grad_norm_(params, clip, foreach=True)
        optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, params, 1.0 - decay)
        return norm

    if jit_compile:  # PyTorch's "compiled optimizer" recipe
        update = torch.compile(update)
    return step
