"""PyTorch: gradients with autograd (`loss.backward()`); the update optionally through `torch.compile`.

Data parallelism: when `torch.distributed` is initialised with more than one
process, the fast critic's forward pass goes through
`torch.nn.parallel.DistributedDataParallel`, which averages the gradients
over the processes during `backward()` (and broadcasts rank 0's weights,
EMA copy included, when it was set up). Every process then applies the same
clipped update and EMA step, so the weights stay identical everywhere.
"""

from __future__ import annotations

import torch


def _data_parallel(trainer):
    """Routes the fast forward pass through DDP when a process group is running."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return
    critic = trainer.critic
    ddp = torch.nn.parallel.DistributedDataParallel(critic, broadcast_buffers=False)

    def forward(h, z, use_ema=False):
        # EMA passes need no gradients, hence no DDP (its reducer expects one
        # forward pass per backward).
        return critic.apply_network(h, z, use_ema=True) if use_ema else ddp(h, z)

    trainer._forward = forward
    trainer.ddp = ddp


def apply_gradients(optimizer, grads, variables):
    optimizer.apply(grads, variables)


def update_if(ok, update, variables):
    """Runs `update` (which assigns `variables`) only when the boolean tensor `ok` is true.

    Eager PyTorch reads the flag on the host: skipping costs nothing.
    """
    if bool(ok):
        update()


def make_train_function(trainer, loss_fn, batch_axis):
    trainable = trainer.critic.trainable_variables
    if trainer._forward == trainer.critic.apply_network:
        _data_parallel(trainer)

    # jit_compile: torch.compile fuses the update's parameter-sized
    # elementwise work (clip, Adam, EMA: ~35 passes over the weights when
    # eager) into a few loops. The forward and backward passes stay eager:
    # compiled through Keras's layers they were slower on CPU, after minutes
    # of compilation (measured with torch 2.13).
    apply = torch.compile(trainer._apply) if trainer.jit_compile else trainer._apply

    def step(*batch):
        params = [v.value for v in trainable]
        for p in params:
            p.grad = None
        loss, losses = loss_fn(*batch)
        trainer._scaled_loss(loss).backward()
        grads = [p.grad for p in params]
        with torch.no_grad():
            losses = {k: v.detach() for k, v in losses.items()}
            if getattr(trainer, "ddp", None) is not None:
                # Every process must take the same skip-or-update decision.
                torch.distributed.all_reduce(losses["invalid_inputs"])
            return apply(grads, losses)

    return step


def make_predict_function(critic, use_ema):
    """Eager forward pass without autograd (nothing to trace, nothing to recompile)."""

    def run(h, z):
        with torch.no_grad():
            return critic(h, z, use_ema=use_ema)

    return run
