"""PyTorch: gradients with autograd (`loss.backward()`); the update optionally through `torch.compile`.

Data parallelism: when `torch.distributed` is initialised with more than one
process, the fast critic's forward pass goes through
`torch.nn.parallel.DistributedDataParallel`, which averages the gradients
over the processes during `backward()` (and broadcasts rank 0's weights,
EMA copy included, when it is set up). Every process then applies the same
clipped update and EMA step, so the weights stay identical everywhere.
"""

from __future__ import annotations

import torch

from multicritic.backend import Backend


def _distributed() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class TorchBackend(Backend):
    name = "torch"

    def constant(self, values):
        # `torch.compile` cannot trace numpy: inside it, the Python floats.
        if torch.compiler.is_compiling():
            return torch.tensor(list(values), dtype=torch.float32)
        return super().constant(values)

    def update_if(self, ok, update, variables):
        """Eager PyTorch reads the flag on the host: skipping costs nothing."""
        if bool(ok):
            update()

    def all_gather(self, x):
        if not _distributed():
            return x
        parts = [torch.empty_like(x) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)

    def forward_function(self, critic):
        if not _distributed():
            return None
        ddp = torch.nn.parallel.DistributedDataParallel(critic, broadcast_buffers=False)

        def forward(h, z, use_ema=False):
            # EMA passes need no gradients, hence no DDP (its reducer expects
            # one forward pass per backward).
            return critic(h, z, use_ema=True) if use_ema else ddp(h, z)

        forward.ddp = ddp
        return forward

    def train_step(self, program, batch, apply=None, distributed=False):
        params = [v.value for v in program.trainable]
        for p in params:
            p.grad = None
        loss, metrics = program.loss(*batch)
        program.scale_loss(loss).backward()
        grads = [p.grad for p in params]
        with torch.no_grad():
            metrics = {k: v.detach() for k, v in metrics.items()}
            if distributed:
                # Every process must take the same skip-or-update decision.
                for key in program.decision_metrics:
                    torch.distributed.all_reduce(metrics[key])
            return (apply or program.apply)(grads, metrics)

    def keras_test_step(self, model, evaluate, state, batch):
        with torch.no_grad():
            return evaluate(*batch)

    def make_train_function(self, program, batch_axis):
        distributed = _distributed()
        # jit_compile: torch.compile fuses the update's parameter-sized
        # elementwise work (clip, Adam, EMA) into a few loops. The forward and
        # backward passes stay eager: compiled through Keras's layers they
        # were slower on CPU, after minutes of compilation (torch 2.13).
        apply = torch.compile(program.apply) if program.jit_compile else program.apply

        def step(*batch):
            return self.train_step(program, batch, apply, distributed)

        return step

    def make_predict_function(self, critic, use_ema):
        """Eager forward pass without autograd (nothing to trace, nothing to recompile)."""

        def run(h, z):
            with torch.no_grad():
                return critic(h, z, use_ema=use_ema)

        return run


BACKEND = TorchBackend()
