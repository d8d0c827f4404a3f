"""PyTorch: gradients with `torch.autograd`; the forward pass and loss optionally through `torch.compile`."""

from __future__ import annotations

import torch


def apply_gradients(optimizer, grads, variables):
    optimizer.apply(grads, variables)


def make_train_function(trainer, loss_fn, batch_axis):
    trainable = trainer.critic.trainable_variables
    if trainer.jit_compile:
        # Dynamic shapes: a new batch size does not recompile.
        loss_fn = torch.compile(loss_fn, dynamic=True)

    def run(*batch):
        params = [v.value for v in trainable]
        loss, losses = loss_fn(*batch)
        grads = torch.autograd.grad(trainer._scaled_loss(loss), params)
        with torch.no_grad():
            losses = {k: v.detach() for k, v in losses.items()}
            return trainer._apply(list(grads), losses)

    return run


def make_predict_function(critic, use_ema):
    """Eager forward pass without autograd (nothing to trace, nothing to recompile)."""

    def run(h, z):
        with torch.no_grad():
            return critic(h, z, use_ema=use_ema)

    return run
