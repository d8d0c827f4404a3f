"""A K-member DreamerV3 critic ensemble train step written by hand in PyTorch: the vectorised baseline.

What it is: one `nn.Module` critic (Linear without bias -> LayerNorm(eps
1e-3) -> SiLU, head Linear(255) zero-initialised), K independently
initialised copies stacked with `torch.func.stack_module_state` (every
parameter gets a leading member axis), and the forward pass
`torch.func.vmap(functional_call)` over the members with the inputs shared
(`in_dims=(0, 0, None, None)`). The EMA copy is a second stacked parameter
dict without gradients. One step: fast forward, EMA forward under
`no_grad`, the two-hot loss with EMA regulariser on the `[K, B, 255]` logits
(the mean over members and positions: the mean of the members' losses),
`loss.backward()` through the vmapped forward, global-norm clip (100) over
all members' gradients with `_foreach` ops, `torch.optim.Adam(foreach=True)`
on the stacked parameters, EMA with `torch._foreach_lerp_`.

Adam: `torch.optim.Adam` puts epsilon after the bias correction
(`m / bc1 / (sqrt(v) / sqrt(bc2) + eps)`), Keras before it (`lr * sqrt(bc2) /
bc1 * m / (sqrt(v) + eps)`). Setting the param group's `eps` to
`eps / sqrt(1 - b2^t)` before each step makes torch's update exactly
Keras's (same kernel, one Python float per step), so one step agrees with
multicritic's.

Alternatives tried (XS, K=5, batch 4096, 2 CPU cores shared with other
work, torch 2.13 CPU; whole step, medians of 3 alternating blocks in one
process): `loss.backward()` + `Adam(foreach=True)` 1752 ms, `loss.backward()`
+ `Adam(fused=True)` 1567 ms (the default), `torch.func.grad` of the
functional loss + `foreach` 1618 ms: the same within this machine's noise
(the step is matmul-bound; the optimizer touches 2M parameters).
`compile_update=True` (`torch.compile` of clip + Adam + EMA) is available but
was not timed (its ~15 s compile buys at most that same < 2%).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.func import functional_call, stack_module_state

from benchmarks.native.native_torch import DEVICE, Critic, symlog, two_hot_parts  # the single-critic baseline's pieces

NUM_BUCKETS, LOWER, UPPER = 255, -20.0, 20.0


def _critic(in_dim, units, layers):
    """The single-critic baseline's module (`native_torch.Critic`), kernels glorot-uniform as Keras's."""
    critic = Critic(in_dim, units, layers)
    for module in critic.mlp:
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
    return critic


def loss_from(logits, ema_value, targets, weights):
    """Mean over members and positions of the two-hot NLL plus the EMA regulariser; logits `[K, B, 255]`."""
    logp = logits.log_softmax(-1)
    k, kp1, w_k, w_kp1 = two_hot_parts(symlog(targets))
    ek, ekp1, ew_k, ew_kp1 = two_hot_parts(ema_value)
    members = logits.shape[0]
    idx = torch.stack([k.expand(members, -1), kp1.expand(members, -1), ek, ekp1], -1)
    w = torch.stack([w_k.expand(members, -1), w_kp1.expand(members, -1), ew_k, ew_kp1], -1)
    per = -(logp.gather(-1, idx) * w).sum(-1)
    return (per * weights).mean()


class Ensemble:
    """Holds the stacked state; `step(h, z, targets, weights)` is one update.

    `grad="autograd"` (default) or `"func"` (`torch.func.grad` of the
    functional loss); `fused`: `torch.optim.Adam(fused=True)` (default) or
    `foreach=True`; `compile_update`: `torch.compile` the clip + Adam + EMA.
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
        grad="autograd",
        fused=True,
        compile_update=False,
    ):
        torch.manual_seed(seed)
        copies = [_critic(in_dim, units, layers).to(DEVICE) for _ in range(members)]
        params, buffers = stack_module_state(copies)
        self.base = copy.deepcopy(copies[0]).to("meta")
        self.names = list(params)
        self.params = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        self.ema = {k: v.detach().clone() for k, v in params.items()}
        self.buffers = buffers
        self.lr, self.eps, self.clip, self.decay = lr, eps, clip, decay
        self.beta_2 = 0.999
        self.t = 0
        kind = {"fused": True} if fused else {"foreach": True}
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=lr, betas=(0.9, self.beta_2), eps=eps, **kind)
        self.grad_mode = grad

        def one(params, buffers, h, z):
            return functional_call(self.base, (params, buffers), (h, z))

        self.forward = torch.func.vmap(one, in_dims=(0, 0, None, None))

        def functional_loss(params, ema_value, h, z, targets, weights):
            _, logits = self.forward(params, self.buffers, h, z)
            loss = loss_from(logits, ema_value, targets, weights)
            return loss, loss

        self.grad_and_loss = torch.func.grad(functional_loss, has_aux=True)
        self.update = torch.compile(self._update) if compile_update else self._update

    def load(self, fast, ema):
        """Sets the fast and EMA parameters from dicts of stacked arrays named like `self.names`."""
        with torch.no_grad():
            for name in self.names:
                self.params[name].copy_(torch.as_tensor(fast[name], device=self.params[name].device))
                self.ema[name].copy_(torch.as_tensor(ema[name], device=self.ema[name].device))

    def _update(self, grads):
        params, ema = list(self.params.values()), list(self.ema.values())
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        factor = self.clip * torch.clamp(1.0 / norm, max=1.0 / self.clip)  # tf.clip_by_global_norm's
        torch._foreach_mul_(grads, factor)
        for p, g in zip(params, grads):
            p.grad = g
        self.optimizer.step()
        torch._foreach_lerp_(ema, params, 1.0 - self.decay)
        return norm

    def step(self, h, z, targets, weights):
        self.t += 1
        # Keras's epsilon placement through torch's kernel (see the module docstring).
        self.optimizer.param_groups[0]["eps"] = self.eps / math.sqrt(1.0 - self.beta_2**self.t)
        with torch.no_grad():
            ema_value, _ = self.forward(self.ema, self.buffers, h, z)
        if self.grad_mode == "func":
            grads, loss = self.grad_and_loss(self.params, ema_value, h, z, targets, weights)
            grads = [grads[k] for k in self.names]
        else:
            params = list(self.params.values())
            for p in params:
                p.grad = None
            _, logits = self.forward(self.params, self.buffers, h, z)
            loss = loss_from(logits, ema_value, targets, weights)
            loss.backward()
            grads = [p.grad for p in params]
        with torch.no_grad():
            norm = self.update(grads)
        return {"total": loss.detach(), "grad_norm": norm}


def make_step(members, in_dim, units, layers, **kwargs):
    return Ensemble(members, in_dim, units, layers, **kwargs).step
